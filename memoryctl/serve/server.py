"""The service's servers: the ASGI application (``memoryctl.serve.app``) on uvicorn, one server per
listener -- the Unix socket and, when configured, HTTP on loopback or the mesh address.

Why one uvicorn server per listener: each has its own limits, so that remote clients cannot starve
the local socket (issue 22, item 5: eight idle TCP connections sending half a header used to make
a local ``get`` wait 29 s, eighty made it fail):
- **connections**: ``serve.workers + serve.queue`` per listener (uvicorn's ``limit_concurrency``:
  beyond it a request is answered 503 at once); a flood on TCP fills TCP's, not the socket's.
- **threads**: an operation is blocking work (psycopg, Qdrant Edge, the embedding model), run in a
  worker thread from its listener's own pool of ``serve.workers``.
- **deadlines**: the request line and headers must arrive within ``serve.header_timeout_s`` of
  the connection (or of the previous reply on a kept-alive one), else the connection is closed
  (``_HeaderDeadline``: uvicorn itself only times out idle kept-alive connections); each read of a
  body within ``serve.io_timeout_s`` (408); an idle kept-alive connection is closed after 5 s.

Both servers share one event loop in one thread (``start`` returns once they listen;
``serve_forever`` waits for SIGTERM/SIGINT). Shutdown: stop accepting, let running requests finish
(bounded), close the stores (the embedded PostgreSQL stops cleanly), remove the socket.

Access: the Unix socket is created mode 0600 in the data directory (the file system is the access
control); HTTP always requires a bearer token (``memoryctl.serve.app.TokenCheck``) and binds only
to a given address -- loopback or the mesh -- never to every interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from memoryctl.errors import ConfigError
from memoryctl.operations.tokens import AgentTokens
from memoryctl.serve import app as asgi
from memoryctl.serve.wire import load_token

if TYPE_CHECKING:
    from pathlib import Path

    from memoryctl.client import MemoryClient
    from memoryctl.config import Settings
    from memoryctl.declaration.declare import Operation
    from memoryctl.operations.access import Caller
    from memoryctl.operations.reply import Reply

log = logging.getLogger("memoryctl.serve")

SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with its NUL
KEEP_ALIVE_S = 5
T = TypeVar("T")


def parse_bind(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``) for a specific address; every-interface binds are refused."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:  # 0: any free port (tests)
        raise ConfigError(f"serve.http = {value!r} is not HOST:PORT", hint="e.g. 127.0.0.1:8765 or 10.77.0.1:8765")
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise ConfigError(
                f"serve.http host {host!r} is not an IP address",
                hint="give the loopback or the mesh (WireGuard) address, e.g. 127.0.0.1:8765",
            ) from None
        return "127.0.0.1", int(port)
    if addr.is_unspecified:
        raise ConfigError(
            f"serve.http = {value!r} would listen on every interface",
            hint="bind to loopback (127.0.0.1) or the mesh address; the public side stays closed",
        )
    return str(addr), int(port)


class _HeaderDeadline(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, plus a deadline for a request's line and headers.

    uvicorn closes a kept-alive connection that stays idle, but waits forever for a request whose
    headers never end (a client that sends half a header and stops). This closes such a connection
    when its headers are not complete ``header_timeout`` seconds after it opened, or after the
    previous reply on a kept-alive one.
    """

    header_timeout: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(self.header_timeout, self._too_slow)

    def _too_slow(self) -> None:
        if self.cycle is None or self.cycle.response_complete:
            log.info("closing a connection whose request headers did not arrive in %.0f s", self.header_timeout)
            self.transport.close()

    def handle_events(self) -> None:
        started = self.cycle
        super().handle_events()
        if self.cycle is not started:  # a request's headers arrived: the app has it now
            self._deadline.cancel()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._deadline.cancel()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline.cancel()
        super().connection_lost(exc)


def _protocol(header_timeout: float) -> type[H11Protocol]:
    return type("HeaderDeadline", (_HeaderDeadline,), {"header_timeout": header_timeout})


class Service:
    """Holds one ``MemoryClient`` open and answers operations until told to stop."""

    def __init__(self, settings: Settings, client: MemoryClient | None = None, *, http: str | None = None) -> None:
        from memoryctl.client import MemoryClient

        self.settings = settings
        self.client = client or MemoryClient(settings)
        if settings.profile == "cluster":  # stores over the network: a lost node must not hang writes
            self.client.write_budget_s = settings.write.delivery_budget_s
        cfg = settings.serve
        bind = http or cfg.http
        self.http = parse_bind(bind) if bind else None
        self.socket_path = settings.serve_socket
        self.token = load_token(settings, create=self.http is not None)
        self.tokens = AgentTokens.of(settings)
        self.max_body = int(cfg.max_body_mb * 1024 * 1024)
        self.io_timeout = cfg.io_timeout_s
        self.started_at = time.time()
        self.counts = {"requests": 0, "errors": 0, "in_flight": 0}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._servers: list[uvicorn.Server] = []
        self._limiters: dict[bool, anyio.CapacityLimiter] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._mcp: Any = None

    # ---- lifecycle -----------------------------------------------------------------------------
    def warm_up(self) -> dict[str, float]:
        """Open every store and load the model before the first request (and before any two
        requests could race to open the same single-process store)."""
        timings: dict[str, float] = {}
        stack = self.client.stack
        for name, step in (
            ("postgres", lambda: stack.pool),
            ("vectors", stack.vectors),
            ("graph", stack.graph),
            ("engine", lambda: self.client.engine),
            ("extractor", lambda: stack.extractor),
            ("embedder", lambda: stack.embedder.embed_query("warm up") if stack.vectors() else None),
            ("mcp", self._mcp_server),
        ):
            t0 = time.perf_counter()
            step()
            timings[name] = round((time.perf_counter() - t0) * 1000, 1)
        return timings

    def start(self) -> None:
        """Listen on the socket (and HTTP); returns once both servers accept connections."""
        sockets = [(self._bind_unix(), True)]
        if self.http is not None:
            sockets.append((self._bind_tcp(), False))
        app = asgi.TokenCheck(asgi.build(self), self)
        cfg = self.settings.serve
        for _, trusted in sockets:
            listener = _Listener(app, trusted, cfg.workers + cfg.queue)
            config = uvicorn.Config(
                listener,
                http=_protocol(cfg.header_timeout_s),
                lifespan="off",
                timeout_keep_alive=KEEP_ALIVE_S,
                timeout_graceful_shutdown=30,
                log_config=None,
                access_log=False,
                server_header=False,
            )
            server = uvicorn.Server(config)  # no signal handlers: it runs off the main thread
            listener.state = server.server_state
            self._servers.append(server)
        ready = threading.Event()
        failed: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run, args=(sockets, ready, failed), name="memoryctl-serve", daemon=True
        )
        self._thread.start()
        if not ready.wait(60) or failed:
            self.shutdown(grace_s=0)
            raise ConfigError(f"memoryctl serve did not start: {failed[0] if failed else 'timed out'}")

    def _run(self, sockets: list[tuple[socket.socket, bool]], ready: threading.Event, failed: list[Any]) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            workers = self.settings.serve.workers
            self._limiters = {trusted: anyio.CapacityLimiter(workers) for _, trusted in sockets}
            if self._mcp is not None:
                await self._mcp.started()
            tasks = [
                asyncio.create_task(server.serve(sockets=[sock]))
                for server, (sock, _) in zip(self._servers, sockets, strict=True)
            ]
            while not all(s.started for s in self._servers):
                if any(t.done() for t in tasks):
                    break
                await asyncio.sleep(0.01)
            ready.set()
            await asyncio.gather(*tasks)

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by start() when it happens before the servers listen
            failed.append(exc)
            log.exception("memoryctl serve stopped")
        finally:
            ready.set()

    @property
    def address_http(self) -> str | None:
        if self.http is None:
            return None
        host, port = self.http
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def _bind_unix(self) -> socket.socket:
        path = self.socket_path
        if len(os.fsencode(path)) > SOCKET_PATH_MAX:
            raise ConfigError(
                f"socket path {path} is longer than {SOCKET_PATH_MAX} bytes",
                hint="set serve.socket to a shorter path (e.g. /run/memoryctl/serve.sock)",
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # left by a process that died: nobody answers on it
            else:
                raise ConfigError(
                    f"a memoryctl service already answers on {path}",
                    hint="stop it first (systemctl stop memoryctl-serve, or its Ctrl-C)",
                )
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        sock.listen(128)
        return sock

    def _bind_tcp(self) -> socket.socket:
        assert self.http is not None
        family = socket.AF_INET6 if ":" in self.http[0] else socket.AF_INET
        tcp = socket.socket(family, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            tcp.bind(self.http)
        except OSError as exc:
            tcp.close()
            raise ConfigError(
                f"cannot listen on {self.address_http}: {exc.strerror}",
                hint="is another service on that port, or is the address not on this host?",
            ) from None
        tcp.listen(128)
        self.http = (self.http[0], tcp.getsockname()[1])
        return tcp

    def serve_forever(self) -> None:
        """Run until SIGTERM/SIGINT (or ``stop()`` from another thread), then shut down."""
        previous = {sig: signal.signal(sig, lambda *_: self._stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            while not self._stop.wait(0.5):
                if self._thread is not None and not self._thread.is_alive():
                    break
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.shutdown()

    def stop(self) -> None:
        self._stop.set()

    def shutdown(self, grace_s: float = 30.0) -> None:
        self._stop.set()
        for server in self._servers:
            server.config.timeout_graceful_shutdown = max(1, int(grace_s))
            server.should_exit = True
        if self._thread is not None:
            self._thread.join(grace_s + 5)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self.client.close()

    # ---- what the application asks of its service ------------------------------------------------
    def count(self, name: str, by: int = 1) -> None:
        with self._lock:
            self.counts[name] += by

    async def run_in_worker(self, trusted: bool, work: Callable[[], T]) -> T:
        """``work()`` in a worker thread of the listener the request came in on (``trusted``: the
        Unix socket's)."""
        limiter = self._limiters.get(trusted) or self._limiters[True]
        self.count("in_flight")
        try:
            return await anyio.to_thread.run_sync(work, limiter=limiter)
        finally:
            self.count("in_flight", -1)

    def execute(
        self, op: Operation, params: dict[str, Any], upload: Path | None, caller: Caller | None = None
    ) -> Reply:
        """Run one operation for a request (HTTP or MCP): the code the command line runs in-process.
        An action (``ACTIONS``) of a remote ``caller`` is a run in the runs log with its token's name,
        as the console records its own: the same name whichever door the token came through."""
        from memoryctl.maintenance.runs import ACTIONS, recorded_action
        from memoryctl.operations import run

        def work() -> Reply:
            return run(self.client, op.name, params, upload=upload, in_service=True)

        if caller is not None and op.name in ACTIONS:
            reply = recorded_action(self.client.stack.runs, op.name, caller.name, params, work)
        else:
            reply = work()
        if op.service_status and isinstance(reply.data, dict) and "components" in reply.data:
            reply.data["components"]["serve"] = {**self.status(), "latency_ms": 0.0}
        return reply

    def status(self) -> dict[str, Any]:
        with self._lock:
            counts = dict(self.counts)
        return {
            "status": "ok",
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started_at, 1),
            "socket": str(self.socket_path),
            "http": self.address_http,
            "workers": self.settings.serve.workers,
            "connections": {
                "unix" if s is self._servers[0] else "http": len(s.server_state.connections) for s in self._servers
            },
            **counts,
        }

    # ---- MCP -------------------------------------------------------------------------------------
    def _mcp_server(self) -> Any:
        """MCP's streamable-HTTP endpoint (the SDK's import takes ~1.5 s: made at warm-up, or on
        the first request to /mcp)."""
        if self._mcp is None:
            from memoryctl.serve.mcp import HttpTools

            self._mcp = HttpTools(self)
        return self._mcp

    async def mcp_app(self, scope: Scope, receive: Receive, send: Send) -> None:
        tools = self._mcp
        if tools is None:
            tools = await anyio.to_thread.run_sync(self._mcp_server)
        await tools.started()
        await tools.asgi(scope, receive, send)


class _Listener:
    """The application as one listener serves it: requests from the Unix socket are marked
    trusted, and beyond ``limit`` open connections a request is answered 503 at once (JSON, with
    Retry-After), whatever other connections hold -- idle ones included, until their deadline."""

    def __init__(self, app: Callable[..., Any], trusted: bool, limit: int) -> None:
        self.app, self.trusted, self.limit = app, trusted, limit
        self.state: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.trusted:
            scope[asgi.TRUSTED] = True
        if scope["type"] == "http" and len(self.state.connections) > self.limit:
            busy = asgi.error_response(503, "the service is busy", "retry after a second", 1, {"Retry-After": "1"})
            await busy(scope, receive, send)
            return
        await self.app(scope, receive, send)
