"""The service's ASGI application (Starlette): one route per operation of the table, the OpenAPI
document, the status, and MCP (streamable HTTP) at ``/mcp`` -- all behind one bearer token check --
and the operator console at ``/console`` (``memoryctl.console``), which a browser signs in to with
a form and a session cookie instead: the token in that form is checked by the same ``caller_of``.

Requests (``POST /v1/<operation>``, ``/v1/backup/status`` for a grouped one):
- Who calls: the Unix socket is the operator (its file mode is the access control); over TCP the
  bearer token says -- the operator's token, an issued operator token, or an agent token bound to
  one agent (``memoryctl.operations.access``). Checked before anything else, in constant time.
- The body: a JSON object of parameters, with a ``Content-Length`` (411 without one: a chunked
  body is not read), at most ``serve.max_body_mb`` (413 before reading it), each read within
  ``serve.io_timeout_s`` (408). ``import`` takes JSONL, spooled to a private file in 1 MiB pieces.
  JSON nested too deeply for the parser is a 400, not a crash.
- The operation runs in a worker thread of the listener's own pool (``serve.workers`` each: the
  Unix socket never waits for threads busy with TCP callers), through ``memoryctl.operations.run``
  -- the code the command line runs in-process.
- The reply: exactly what ``memoryctl <operation> --json`` prints, the exit code and the stderr
  lines in headers. Errors are ``{"error", "hint", "exit_code"}`` with a 4xx/5xx status: 400 bad
  input, 401 token, 403 an agent token outside its agent, 404 unknown path or memory, 405 method,
  408/411/413 body, 412 another configuration (the fast path's digest), 503 a store down, 500 a
  bug (logged here with its traceback, never sent).
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from memoryctl.console.app import build as console
from memoryctl.declaration.declare import Operation
from memoryctl.declaration.table import OPERATIONS
from memoryctl.diskspace import disk_full
from memoryctl.errors import ExitCode, MemoryctlError
from memoryctl.operations.access import OPERATOR, Caller, bind, caller_of, status_for
from memoryctl.operations.reply import Reply
from memoryctl.serve.wire import API, CONFIG_DIFFERS, CONFIG_HEADER, EXIT_HEADER, WARNINGS_HEADER, encode

if TYPE_CHECKING:
    from memoryctl.client import MemoryClient
    from memoryctl.config import Settings
    from memoryctl.operations.tokens import AgentTokens

T = TypeVar("T")
log = logging.getLogger("memoryctl.serve")

CALLER = "memoryctl.caller"  # the scope key the token check leaves for the routes
TRUSTED = "memoryctl.trusted"  # set by the Unix socket's listener
LINGER_S, LINGER_BYTES = 2.0, 64 << 20  # reading what a refused client still sends: see _drain


class Service(Protocol):
    """What the application asks of the service that runs it (``memoryctl.serve.server.Service``)."""

    settings: Settings
    token: str | None
    tokens: AgentTokens
    client: MemoryClient
    max_body: int
    io_timeout: float

    def count(self, name: str, by: int = 1) -> None: ...

    def status(self) -> dict[str, Any]: ...

    def execute(
        self, op: Operation, params: dict[str, Any], upload: Path | None, caller: Caller | None = None
    ) -> Reply:
        """``caller``: a remote caller (HTTP's bearer token, MCP's), whose actions are recorded."""
        ...

    async def run_in_worker(self, trusted: bool, work: Callable[[], T]) -> T: ...

    async def mcp_app(self, scope: Scope, receive: Receive, send: Send) -> None: ...


class HttpError(Exception):
    def __init__(self, status: int, message: str, *, hint: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.hint, self.headers = status, message, hint, headers or {}


def error_response(status: int, message: str, hint: str | None, exit_code: int, headers: dict[str, str]) -> Response:
    body = encode({"error": message, "hint": hint, "exit_code": exit_code})
    return Response(body, status, headers=headers, media_type="application/json")


class TokenCheck:
    """Who calls, before anything else: the socket's caller is the operator; over TCP the bearer
    token must be the operator's or an agent's (401 otherwise, with no hint of where tokens live)."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app, self.service = app, service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.service.count("requests")
        if _console(scope["path"]):  # a browser: signs in with a form, then a session (memoryctl.console)
            await self.app(scope, receive, send)
            return
        try:
            caller = OPERATOR if scope.get(TRUSTED) else self.caller(_header(scope, b"authorization"))
        except HttpError as exc:
            await _drain(scope, receive)
            response = error_response(exc.status, exc.message, exc.hint, int(ExitCode.USAGE), exc.headers)
            await response(scope, receive, send)
            return
        scope[CALLER] = caller
        if scope["path"].startswith("/mcp"):
            from memoryctl.serve.mcp_auth import authenticated

            scope["user"] = authenticated(caller)
        await self.app(scope, receive, send)

    def caller(self, header: str | None) -> Caller:
        scheme, _, given = (header or "").partition(" ")
        given = given.strip()
        if scheme.lower() == "bearer" and given:
            found = caller_of(given, self.service.token, self.service.tokens)
            if found is not None:
                return found
        raise HttpError(
            401,
            "missing or wrong bearer token",
            hint="send Authorization: Bearer <token>: the operator's (serve.token) or an agent's"
            " (memoryctl token issue)",
            headers={"WWW-Authenticate": 'Bearer realm="memoryctl"'},
        )


def _console(path: str) -> bool:
    return path == "/console" or path.startswith("/console/")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


async def _drain(scope: Scope, receive: Receive) -> None:
    """Read and drop what a refused client still sends, within bounds, before answering.

    A 401/411/413 is decided before the body is read. Closing a connection with unread data makes
    the kernel reset it, and the reset can reach the client before the reply: it would report a
    broken pipe instead of the error meant for it. So read (and drop) the body, at most
    LINGER_BYTES for LINGER_S.
    """
    if scope["type"] != "http" or scope["method"] not in ("POST", "PUT"):
        return
    left = LINGER_BYTES
    with anyio.move_on_after(LINGER_S):
        while left > 0:
            message = await receive()
            left -= len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body"):
                return


def build(service: Service) -> Starlette:
    """The application: every operation that may run in the service, the documents, MCP."""
    routes: list[BaseRoute] = [
        Route(op.path, _endpoint(service, op), methods=["POST"]) for op in OPERATIONS.values() if not op.local
    ]
    routes += [
        Route(f"{API}/openapi.json", _openapi, methods=["GET"]),
        Route(f"{API}/status", lambda request: _json(service.status()), methods=["GET"]),
        Route("/mcp", _Asgi(service.mcp_app)),
        Mount("/console", console(service)),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        status = int(getattr(exc, "status_code", 404))
        if status == 405:
            return error_response(405, f"{request.url.path} takes POST", None, int(ExitCode.USAGE), {"Allow": "POST"})
        hint = f"operations are under {API}/ (see {API}/openapi.json); MCP is at /mcp; the console at /console"
        return error_response(status, f"no such path {request.url.path!r}", hint, int(ExitCode.USAGE), {})

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    return app


class _Asgi:
    """An ASGI callable as a route's endpoint (a bound method would be taken for a request handler)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def _json(data: Any) -> Response:
    return Response(encode(data), media_type="application/json")


async def _openapi(request: Request) -> Response:
    from memoryctl.serve.openapi import document

    return _json(document())


def _endpoint(service: Service, op: Operation) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        t0 = time.perf_counter()
        headers: dict[str, str] = {}
        try:
            reply = await _handle(service, op, request)
            body, status = encode(reply.data), 200
            headers[EXIT_HEADER] = str(reply.exit_code)
            if reply.warnings:
                headers[WARNINGS_HEADER] = json.dumps(reply.warnings, ensure_ascii=True)
        except HttpError as exc:
            await _drain(request.scope, request.receive)
            return error_response(exc.status, exc.message, exc.hint, int(ExitCode.USAGE), exc.headers)
        except MemoryctlError as exc:
            status = status_for(exc)
            body = encode({"error": exc.message, "hint": exc.hint, "exit_code": int(exc.exit_code)})
        except Exception as exc:
            full = disk_full(exc) if isinstance(exc, OSError) else None
            if full is not None:  # the operator's to fix, said as the CLI says it
                status = status_for(full)
                body = encode({"error": full.message, "hint": full.hint, "exit_code": int(full.exit_code)})
            else:
                log.exception("%s failed", op.path)
                status = 500
                body = encode(
                    {"error": f"internal error ({type(exc).__name__}); see the service's log", "exit_code": 1}
                )
        if status >= 500:
            service.count("errors")
        log.info("POST %s %d %.1f ms", op.path, status, (time.perf_counter() - t0) * 1000)
        return Response(body, status, headers=headers, media_type="application/json")

    return endpoint


async def _handle(service: Service, op: Operation, request: Request) -> Reply:
    length = _length(request, service.max_body)
    caller: Caller = request.scope.get(CALLER, OPERATOR)
    trusted = bool(request.scope.get(TRUSTED))
    remote = None if trusted else caller  # the socket is the operator's command line, recorded as such
    if op.upload:
        params: dict[str, Any] = {k: _query_value(v) for k, v in request.query_params.items()}
        async with _spooled(request, length, service.io_timeout) as upload:
            _same_config(service, request)
            bound = bind(op, params, caller)
            return await service.run_in_worker(trusted, lambda: service.execute(op, bound, upload, remote))
    raw = await _body(request, length, service.io_timeout)
    try:
        params = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise HttpError(400, "the body is JSON nested too deeply", hint="parameters are a flat JSON object") from None
    if not isinstance(params, dict):
        raise HttpError(400, "the body must be a JSON object of parameters")
    _same_config(service, request)
    bound = bind(op, params, caller)
    return await service.run_in_worker(trusted, lambda: service.execute(op, bound, None, remote))


def _length(request: Request, limit: int) -> int:
    raw = request.headers.get("content-length")
    if raw is None or "transfer-encoding" in request.headers:
        raise HttpError(411, "a Content-Length is required", hint="send the body whole, not chunked")
    if not raw.isdigit():
        raise HttpError(400, f"bad Content-Length {raw!r}")
    length = int(raw)
    if length > limit:
        raise HttpError(
            413,
            f"the body is {length} bytes; the limit is {limit}",
            hint="split the import, or raise serve.max_body_mb",
        )
    return length


async def _chunks(request: Request, timeout: float) -> AsyncIterator[bytes]:
    """The body as it arrives, each read within ``timeout`` (a stalled client is dropped: 408)."""
    stream = request.stream().__aiter__()
    while True:
        try:
            with anyio.fail_after(timeout):
                chunk = await stream.__anext__()
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise HttpError(408, f"the body did not arrive within {timeout:g} s") from None
        except ClientDisconnect:  # the client went away mid-body: nobody to answer, no bug to log
            raise HttpError(400, "the client closed the connection before the body ended") from None
        if chunk:
            yield chunk


async def _body(request: Request, length: int, timeout: float) -> bytes:
    parts, size = [], 0
    async for chunk in _chunks(request, timeout):
        size += len(chunk)
        if size > length:
            raise HttpError(400, "the body is longer than its Content-Length")
        parts.append(chunk)
    return b"".join(parts)


@contextlib.asynccontextmanager
async def _spooled(request: Request, length: int, timeout: float) -> AsyncIterator[Path]:
    """The request body in a private temporary file, read in pieces (never all in memory)."""
    with _tempfile() as (tmp, path):
        size = 0
        async for chunk in _chunks(request, timeout):
            size += len(chunk)
            tmp.write(chunk)
        if size != length:
            raise HttpError(400, f"the body ended after {size} of its {length} bytes")
        tmp.flush()
        yield path


@contextlib.contextmanager
def _tempfile() -> Iterator[tuple[Any, Path]]:
    with tempfile.NamedTemporaryFile(prefix="memoryctl-import-", suffix=".jsonl") as tmp:
        yield tmp, Path(tmp.name)


def _query_value(value: str) -> Any:
    return {"true": True, "false": False}.get(value.lower(), value)


def _same_config(service: Service, request: Request) -> None:
    """Refuse (412, nothing run) a request whose sender read other configuration layers.

    Checked once the body is read: a reply sent while the client still writes its body would
    reach it as a broken pipe instead of the 412.
    """
    digest = request.headers.get(CONFIG_HEADER)
    if digest is not None and digest != service.settings.layers_digest:
        raise HttpError(
            CONFIG_DIFFERS,
            "memoryctl serve runs with another configuration than this command read",
            hint="the command validates its own configuration and calls again without the digest",
        )
