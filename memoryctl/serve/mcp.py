"""MCP (the Model Context Protocol, the official ``mcp`` SDK): the operations declared ``mcp=True``
(``memoryctl.declaration.table``: add, query, get, forget, stats, health) as tools, for agent
frameworks.

Each tool is generated from its declaration: its name, its description (the summary and the exit
codes), its ``inputSchema`` (the parameters' JSON Schema, ranges and choices included). A call is
validated and run by ``memoryctl.operations.run`` -- the code every other surface runs -- and
answers with the command's ``--json`` document as ``structuredContent`` (and as text): memory ids,
scores and, for a query, the ``degraded`` list, so an agent can tell a partial answer from a whole
one. A partial answer (a store down) is a result; bad input, a refused agent, a missing memory are
tool errors (``isError``) whose text is the same ``error:``/``hint:`` the command line prints.

Two transports:
- **streamable HTTP** at ``/mcp`` of ``memoryctl serve`` (stateless, JSON replies), behind the same
  bearer token as the rest of the API: the operator's, or an agent token whose calls are bound to
  its agent (``memoryctl.operations.access``; a tool call without ``agent`` is for the caller's).
- **stdio**, ``memoryctl mcp [--agent A]``, for a local agent: it calls the running service, or
  runs the operations in its own process when none runs. With ``--agent`` it is bound to that agent
  as an agent token would be.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.lowlevel import Server

from memoryctl._version import __version__
from memoryctl.declaration.declare import Operation
from memoryctl.declaration.table import OPERATIONS
from memoryctl.errors import MemoryctlError
from memoryctl.operations.access import OPERATOR, Caller, bind
from memoryctl.operations.reply import Reply
from memoryctl.serve.mcp_auth import current_caller
from memoryctl.serve.openapi import reply_schema
from memoryctl.serve.wire import json_default

if TYPE_CHECKING:
    from memoryctl.serve.app import Service

log = logging.getLogger("memoryctl.mcp")

TOOLS: dict[str, Operation] = {op.tool: op for op in OPERATIONS.values() if op.mcp}
INSTRUCTIONS = (
    "Long-term memory over a vector store, a graph and PostgreSQL. `add` stores a memory (text, "
    "optional TYPE:NAME entities); `query` recalls the most relevant ones (text, entity, time, "
    "filters); `get`/`forget` take memory ids from those answers. Every call works within one "
    "agent: the one your token is bound to, or the one you name."
)

#: Runs an operation for a caller: (operation, its arguments, the caller) -> the reply.
Execute = Callable[[Operation, dict[str, Any], Caller], Awaitable[Reply]]


#: What every tool result adds to the command's ``--json`` document.
RESULT_FIELDS = {
    "exit_code": {"type": "integer", "description": "what the command line exits with for this reply"},
    "warnings": {"type": "array", "items": {"type": "string"}, "description": "the lines it prints on stderr"},
}


def output_schema(op: Operation) -> dict[str, Any]:
    """The tool's ``outputSchema``: the declared reply (under ``result`` when it is not an
    object, as ``result()`` wraps it), with the exit code and the warnings."""
    reply = reply_schema(op)
    variants = reply.get("anyOf", [reply])
    if all(v.get("type") == "object" for v in variants):
        merged = [
            {**v, "properties": {**v["properties"], **RESULT_FIELDS}, "required": [*v["required"], *RESULT_FIELDS]}
            for v in variants
        ]
        return merged[0] if len(merged) == 1 else {"type": "object", "anyOf": merged}
    return {
        "type": "object",
        "properties": {"result": reply, **RESULT_FIELDS},
        "required": ["result", *RESULT_FIELDS],
    }


def tool(op: Operation) -> types.Tool:
    """The MCP tool of an operation, from its declaration."""
    shown = [p for p in op.params if not p.fill or p.cli]
    schema = {
        "type": "object",
        "properties": {p.name: p.schema() for p in shown},
        "required": [p.name for p in shown if p.required],
        "additionalProperties": False,
    }
    exits = "; ".join(f"{code}: {what}" for code, what in op.exits)
    return types.Tool(
        name=op.tool,
        description=f"{op.summary} (The command line's exit code is in the result: {exits}.)",
        input_schema=schema,
        output_schema=output_schema(op),
        annotations=types.ToolAnnotations(read_only_hint=not op.writes, destructive_hint=op.destructive),
    )


def result(reply: Reply) -> types.CallToolResult:
    """A reply as a tool result: the ``--json`` document, structured and as text, with the exit
    code and the warnings (what is pending, what is degraded)."""
    data = reply.data if isinstance(reply.data, dict) else {"result": reply.data}
    structured = {**data, "exit_code": reply.exit_code, "warnings": reply.warnings}
    text = json.dumps(structured, default=json_default, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=json.loads(text),
        is_error=False,
    )


def failure(exc: MemoryctlError) -> types.CallToolResult:
    text = f"error: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else "")
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def server(execute: Execute, caller_of: Callable[[], Caller]) -> Server[Any]:
    """The MCP server: the tools, and each call run by ``execute`` for ``caller_of()``."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool(op) for op in TOOLS.values()])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        op = TOOLS.get(params.name)
        if op is None:
            return failure(MemoryctlError(f"no tool {params.name!r}", hint=f"tools: {', '.join(TOOLS)}"))
        arguments = dict(params.arguments or {})
        try:
            reply = await execute(op, arguments, caller_of())
        except MemoryctlError as exc:
            return failure(exc)
        return result(reply)

    return Server(
        "memoryctl",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


# ---- streamable HTTP, in the service ---------------------------------------------------------------
class HttpTools:
    """MCP over streamable HTTP for ``memoryctl serve`` (mounted at ``/mcp``)."""

    def __init__(self, service: Service) -> None:
        from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
        from mcp.server.transport_security import TransportSecuritySettings

        async def execute(op: Operation, arguments: dict[str, Any], caller: Caller) -> Reply:
            params = bind(op, arguments, caller)
            return await service.run_in_worker(False, lambda: service.execute(op, params, None, caller))

        self.manager = StreamableHTTPSessionManager(
            app=server(execute, current_caller),
            stateless=True,
            json_response=True,
            max_request_body_size=service.max_body,
            # Every request carries the bearer token, which a page of another origin cannot send:
            # the Host check against DNS rebinding adds nothing, and would refuse the mesh address.
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self.asgi = AuthContextMiddleware(StreamableHTTPASGIApp(self.manager))
        self._running: anyio.Event | None = None

    async def started(self) -> None:
        """The session manager runs (its task group) for as long as the service's event loop."""
        if self._running is None:
            self._running = anyio.Event()
            running = self._running

            async def hold() -> None:
                async with self.manager.run():
                    running.set()
                    await anyio.sleep_forever()

            import asyncio

            self._task = asyncio.get_running_loop().create_task(hold())
        await self._running.wait()


# ---- stdio, `memoryctl mcp` ------------------------------------------------------------------------
def serve_stdio(call: Callable[[Operation, dict[str, Any]], Reply], *, agent: str | None) -> None:
    """Answer MCP on stdin/stdout until the client closes it; ``call`` runs an operation (through
    the running service, or in this process)."""
    from mcp.server.stdio import stdio_server

    from memoryctl.model import validate_agent_id

    caller = Caller(validate_agent_id(agent)) if agent else OPERATOR

    async def execute(op: Operation, arguments: dict[str, Any], who: Caller) -> Reply:
        params = bind(op, arguments, who)
        return await anyio.to_thread.run_sync(lambda: call(op, params))

    mcp_server = server(execute, lambda: caller)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await mcp_server.run(read, write, mcp_server.create_initialization_options())

    anyio.run(main)
