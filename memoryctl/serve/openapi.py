"""The OpenAPI 3.1 description of the service, generated from the operations' declarations
(``memoryctl.declaration.table``), never by hand."""

from __future__ import annotations

import types
import typing
from typing import Any, Union

from memoryctl._version import __version__
from memoryctl.declaration.declare import Operation
from memoryctl.declaration.shape import Shape, schema
from memoryctl.declaration.table import OPERATIONS
from memoryctl.serve.wire import API

ERROR = {
    "type": "object",
    "required": ["error", "exit_code"],
    "properties": {
        "error": {"type": "string"},
        "hint": {"type": ["string", "null"]},
        "exit_code": {"type": "integer", "description": "what the CLI exits with for this error"},
    },
}
REPLY_HEADERS = {
    "Memoryctl-Exit-Code": {
        "description": "the CLI's exit code for this reply (see x-exit-codes): 0 ok, 3 partial",
        "schema": {"type": "integer"},
    },
    "Memoryctl-Warnings": {
        "description": "JSON list of the lines the CLI prints on stderr (e.g. what is pending)",
        "schema": {"type": "string"},
    },
}
ERRORS = {
    "400": "bad parameters or body (the parameter is named)",
    "401": "missing or wrong bearer token (HTTP only)",
    "403": "an agent token outside its agent, or an operation for the operator only",
    "404": "unknown operation or memory",
    "409": "an `id` that names a memory of another agent (`add`)",
    "408": "the body did not arrive in time (serve.io_timeout_s)",
    "411": "no Content-Length (a chunked body is not read)",
    "412": "Memoryctl-Config-Digest differs from the service's configuration (nothing was run)",
    "413": "body larger than serve.max_body_mb",
    "503": "a store is down, or the service is busy (Retry-After)",
    "500": "internal error (details in the service's log)",
}
ACCESS = {
    "agent": "the operator's token, or an agent token (bound to its agent: `agent` defaults to it, another is 403)",
    "any": "any valid token",
    "operator": "the operator's token only",
}


def reply_schema(op: Operation) -> dict[str, Any]:
    """The JSON Schema of what ``memoryctl OP --json`` prints, from the declared reply type."""
    found = schema(op.reply)
    return found if "description" in found else {**found, "description": op.summary}


def _named(tp: Any, schemas: dict[str, Any]) -> dict[str, Any]:
    """A reply type as a reference to ``components/schemas/<its class name>`` (put there, and so
    are the reply types its fields use: ``QueryReply``, ``Hit``, ``Entity``), so that generated
    clients name them; lists, maps and unions by their members; anything else inline. Resolved,
    it is exactly ``schema(tp)`` (tests/unit/test_surfaces.py)."""
    if isinstance(tp, type) and issubclass(tp, Shape):
        if tp.__name__ not in schemas:
            schemas[tp.__name__] = whole = dict(schema(tp))
            hints = typing.get_type_hints(tp)
            whole["properties"] = {
                name: {**_named(hints[name], schemas), "description": f.help} for name, f in tp.__fields__
            }
        return {"$ref": f"#/components/schemas/{tp.__name__}"}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return {"anyOf": [_named(a, schemas) for a in args]}
    if origin is list:
        return {"type": "array", "items": _named(args[0], schemas)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _named(args[1], schemas)}
    return schema(tp)


def _camel(op: Operation) -> str:
    return "".join(word.capitalize() for word in op.name.split())


def _operation(op: Operation, schemas: dict[str, Any]) -> dict[str, Any]:
    """One operation; its reply and request body types named in ``schemas`` (the clients' type names)."""
    params = [p for p in op.params if not p.fill or p.cli]
    reply = _named(op.reply, schemas)
    spec: dict[str, Any] = {
        "operationId": op.tool,
        "summary": op.summary,
        "description": f"Who may call it: {ACCESS[op.access]}. Profiles: {', '.join(op.profiles)}.",
        "x-exit-codes": {str(code): what for code, what in op.exits},
        "x-writes": op.writes,
        "responses": {
            "200": {
                "description": f"exactly what `memoryctl {op.name} --json` prints",
                "headers": REPLY_HEADERS,
                "content": {"application/json": {"schema": {**reply, "description": reply_schema(op)["description"]}}},
            },
            **{
                code: {
                    "description": text,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                }
                for code, text in ERRORS.items()
            },
        },
    }
    if op.upload:
        spec["parameters"] = [{"name": p.name, "in": "query", "required": False, "schema": p.schema()} for p in params]
        spec["requestBody"] = {
            "required": True,
            "description": "JSONL, one memory per line (the `memoryctl import` format)",
            "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
        }
        return spec
    schemas[f"{_camel(op)}Params"] = {
        "type": "object",
        "additionalProperties": False,
        "required": [p.name for p in params if p.required],
        "properties": {p.name: p.schema() for p in params},
    }
    spec["requestBody"] = {
        "required": any(p.required for p in params),
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{_camel(op)}Params"}}},
    }
    return spec


def document() -> dict[str, Any]:
    schemas: dict[str, Any] = {"Error": ERROR}
    paths: dict[str, Any] = {op.path: {"post": _operation(op, schemas)} for op in OPERATIONS.values() if not op.local}
    paths[f"{API}/status"] = {
        "get": {
            "operationId": "status",
            "summary": "The service itself: pid, uptime, workers, connections, request counts.",
            "responses": {"200": {"description": "status", "content": {"application/json": {"schema": {}}}}},
        }
    }
    paths[f"{API}/openapi.json"] = {
        "get": {
            "operationId": "openapi",
            "summary": "This description.",
            "responses": {"200": {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {}}}}},
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "memoryctl",
            "version": __version__,
            "description": "The operations of the memoryctl CLI, answered by `memoryctl serve`. "
            "Over HTTP every request needs `Authorization: Bearer <token>` (the operator's, or an agent "
            "token from `memoryctl token issue`); over the Unix socket the socket's file mode is the access "
            "control. MCP (streamable HTTP) is at /mcp behind the same token (docs/mcp.md).",
        },
        "servers": [{"url": "/"}],
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }
