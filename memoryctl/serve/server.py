"""The service's HTTP server: standard library, a bounded worker pool, one request per connection.

Why the standard library and not an ASGI framework: every operation is blocking work in our own
code (psycopg's pool, Qdrant Edge in-process, the embedding model through ctypes, which releases
the GIL), so an event loop would only hand each request to a thread pool anyway; and a framework
adds ~0.2-0.5 s of imports to the service's start and more dependencies to the core install.

Limits, so that a client can neither exhaust the process nor hang it:
- ``workers`` threads handle requests; accepted connections wait in a queue of ``queue``; when
  it is full the accept thread answers 503 with ``Retry-After`` at once (back-pressure, not a
  growing backlog).
- One request per connection (``Connection: close``): an idle client never pins a worker.
- ``io_timeout_s`` on every socket read and write (a slow or stalled client is dropped);
  ``max_body_mb`` caps a body (413 before reading it; the rest is drained, bounded, so that the
  client reads the 413 instead of a reset). Store calls have their own timeouts.
- Errors are JSON (``{"error", "hint", "exit_code"}``) with 4xx/5xx statuses; a bug is logged
  here with its traceback and the client gets a 500 without one.
- Shutdown (SIGTERM/SIGINT): stop accepting, let queued and running requests finish (bounded),
  close the stores (the embedded PostgreSQL stops cleanly), remove the socket.

Access: the Unix socket is created mode 0600 in the data directory (the file system is the
access control); HTTP always requires ``Authorization: Bearer <token>`` and binds only to a given
address -- loopback or the mesh -- never to every interface.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
import os
import queue
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from memoryctl.errors import ConfigError, ConflictError, ExitCode, MemoryctlError, NotFoundError, StoreError
from memoryctl.serve.operations import OPERATIONS, run
from memoryctl.serve.wire import (
    CONFIG_DIFFERS,
    CONFIG_DIFFERS_MARK,
    CONFIG_HEADER,
    EXIT_HEADER,
    WARNINGS_HEADER,
    Reply,
    json_default,
    load_token,
)

if TYPE_CHECKING:
    from memoryctl.client import MemoryClient
    from memoryctl.config import Settings

log = logging.getLogger("memoryctl.serve")

API = "/v1"
SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with its NUL
LINGER_S, LINGER_BYTES = 2.0, 64 << 20  # draining a refused body: see _Handler._linger


class HttpError(Exception):
    def __init__(self, status: int, message: str, *, hint: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.hint, self.headers = status, message, hint, headers or {}


def encode(data: Any) -> bytes:
    return json.dumps(data, default=json_default, ensure_ascii=False).encode()


def status_for(exc: MemoryctlError) -> int:
    """HTTP status of a deliberate error: bad input 400, an id of another agent 409, unknown id
    404, store down 503."""
    if isinstance(exc, ConflictError):
        return ConflictError.http_status
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, StoreError):
        return 503
    if exc.exit_code == ExitCode.USAGE:
        return 400
    return 500


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


@dataclass(slots=True)
class _Job:
    conn: socket.socket
    trusted: bool  # came in over the Unix socket
    queued_at: float


class Service:
    """Holds one ``MemoryClient`` open and answers operations until told to stop."""

    def __init__(self, settings: Settings, client: MemoryClient | None = None, *, http: str | None = None) -> None:
        from memoryctl.client import MemoryClient

        self.settings = settings
        self.client = client or MemoryClient(settings)
        cfg = settings.serve
        bind = http or cfg.http
        self.http = parse_bind(bind) if bind else None
        self.socket_path = settings.serve_socket
        self.token = load_token(settings, create=self.http is not None)
        self.max_body = int(cfg.max_body_mb * 1024 * 1024)
        self.io_timeout = cfg.io_timeout_s
        self._jobs: queue.Queue[_Job | None] = queue.Queue(maxsize=cfg.queue or 1)
        self._listeners: list[tuple[socket.socket, bool]] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.started_at = time.time()
        self.counts = {"requests": 0, "errors": 0, "rejected": 0, "in_flight": 0}

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
        ):
            t0 = time.perf_counter()
            step()
            timings[name] = round((time.perf_counter() - t0) * 1000, 1)
        return timings

    def start(self) -> None:
        self._listeners.append((self._bind_unix(), True))
        if self.http is not None:
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
            self._listeners.append((tcp, False))
        for _ in range(self.settings.serve.workers):
            self._spawn(self._work, "serve-worker")
        for listener, trusted in self._listeners:
            listener.settimeout(0.2)  # the accept loop notices a stop within this
            self._spawn(lambda s=listener, t=trusted: self._accept(s, t), "serve-accept")

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

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def serve_forever(self) -> None:
        """Run until SIGTERM/SIGINT (or ``stop()`` from another thread), then shut down."""
        previous = {sig: signal.signal(sig, lambda *_: self._stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            while not self._stop.wait(0.5):
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.shutdown()

    def stop(self) -> None:
        self._stop.set()

    def shutdown(self, grace_s: float = 30.0) -> None:
        self._stop.set()
        for listener, _ in self._listeners:
            with contextlib.suppress(OSError):
                listener.close()
        deadline = time.monotonic() + grace_s
        for _ in range(self.settings.serve.workers):
            with contextlib.suppress(queue.Full):
                self._jobs.put(None, timeout=max(0.0, deadline - time.monotonic()))
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self.client.close()

    # ---- connections ---------------------------------------------------------------------------
    def _accept(self, listener: socket.socket, trusted: bool) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by shutdown
            conn.settimeout(self.io_timeout)
            try:
                self._jobs.put_nowait(_Job(conn, trusted, time.perf_counter()))
            except queue.Full:
                self._reject_busy(conn)

    def _reject_busy(self, conn: socket.socket) -> None:
        with self._lock:
            self.counts["rejected"] += 1
        body = encode({"error": "the service is busy", "hint": "retry after a second", "exit_code": 1})
        head = (
            "HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        with contextlib.suppress(OSError):
            conn.settimeout(1.0)
            conn.sendall(head.encode() + body)
        conn.close()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                self.counts["in_flight"] += 1
            try:
                _Handler(job.conn, ("unix" if job.trusted else "tcp", 0), self, job.trusted)
            except Exception:  # a broken connection must not end the worker
                log.exception("connection failed")
            finally:
                with contextlib.suppress(OSError):
                    job.conn.close()
                with self._lock:
                    self.counts["in_flight"] -= 1

    # ---- requests ------------------------------------------------------------------------------
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
            "queued": self._jobs.qsize(),
            **counts,
        }

    def authorize(self, trusted: bool, header: str | None) -> None:
        if trusted:
            return
        scheme, _, given = (header or "").partition(" ")
        # As bytes: compare_digest refuses str with non-ASCII characters (a TypeError, a 500: found
        # by the hostile-client harness with `Authorization: Bearer \xab\xa1`).
        offered = given.strip().encode("utf-8", "surrogateescape")
        if self.token is None or scheme.lower() != "bearer" or not hmac.compare_digest(offered, self.token.encode()):
            raise HttpError(
                401,
                "missing or wrong bearer token",
                hint=f"send Authorization: Bearer <token> (serve.token, or {self.settings.serve_token_file})",
                headers={"WWW-Authenticate": 'Bearer realm="memoryctl"'},
            )

    def handle(self, method: str, target: str, headers: Any, body: Any, trusted: bool) -> tuple[int, Reply]:
        """One request: route, check, read the body within its limit, run the operation."""
        self.authorize(trusted, headers.get("Authorization"))
        url = urlsplit(target)
        path = url.path.rstrip("/")
        if not path.startswith(API + "/"):
            raise HttpError(
                404, f"no such path {url.path!r}", hint=f"operations are under {API}/; see {API}/openapi.json"
            )
        name = path[len(API) + 1 :]
        if name == "openapi.json" and method == "GET":
            from memoryctl.serve.openapi import document

            return 200, Reply(document())
        if name == "status" and method == "GET":
            return 200, Reply(self.status())
        op = OPERATIONS.get(name)
        if op is None:
            raise HttpError(404, f"no operation {name!r}", hint=f"one of {', '.join(OPERATIONS)}")
        if method != "POST":
            raise HttpError(405, f"{name} takes POST", headers={"Allow": "POST"})
        length = self._length(headers, required=op.upload)
        if op.upload:
            params: dict[str, Any] = {k: _query_value(v) for k, v in parse_qsl(url.query, keep_blank_values=True)}
            with _spooled(body, length) as upload:
                self._same_config(headers)
                reply = run(self.client, name, params, upload=upload)
        else:
            raw = body.read(length) if length else b"{}"
            try:
                params = json.loads(raw or b"{}")
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise HttpError(400, f"the body is not JSON: {exc}") from None
            if not isinstance(params, dict):
                raise HttpError(400, "the body must be a JSON object of parameters")
            self._same_config(headers)
            reply = run(self.client, name, params)
        if name == "health" and isinstance(reply.data, dict):
            reply.data.setdefault("components", {})["serve"] = {**self.status(), "latency_ms": 0.0}
        return 200, reply

    def _same_config(self, headers: Any) -> None:
        """Refuse (409, nothing run) a request whose sender read other configuration layers.

        Checked once the body is read: a reply sent while the client still writes its body would
        reach it as a broken pipe instead of the 409.
        """
        digest = headers.get(CONFIG_HEADER)
        if digest is not None and digest != self.settings.layers_digest:
            raise HttpError(
                CONFIG_DIFFERS,
                "memoryctl serve runs with another configuration than this command read",
                hint="the command validates its own configuration and calls again without the digest",
                headers={CONFIG_HEADER: CONFIG_DIFFERS_MARK},
            )

    def _length(self, headers: Any, *, required: bool) -> int:
        raw = headers.get("Content-Length")
        if raw is None:
            if required:
                raise HttpError(411, "a Content-Length is required")
            return 0
        try:
            length = int(raw)
        except ValueError:
            raise HttpError(400, f"bad Content-Length {raw!r}") from None
        if length < 0:
            raise HttpError(400, f"bad Content-Length {raw!r}")
        if length > self.max_body:
            raise HttpError(
                413,
                f"the body is {length} bytes; the limit is {self.max_body}",
                hint="split the import, or raise serve.max_body_mb",
            )
        return length


def _query_value(value: str) -> Any:
    return {"true": True, "false": False}.get(value.lower(), value)


@contextlib.contextmanager
def _spooled(body: Any, length: int) -> Iterator[Path]:
    """The request body in a private temporary file, read in 1 MiB pieces (never all in memory)."""
    with tempfile.NamedTemporaryFile(prefix="memoryctl-import-", suffix=".jsonl") as tmp:
        left = length
        while left:
            chunk = body.read(min(left, 1 << 20))
            if not chunk:
                raise HttpError(400, f"the body ended {left} bytes before its Content-Length")
            tmp.write(chunk)
            left -= len(chunk)
        tmp.flush()
        yield Path(tmp.name)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection: see the module docstring
    server_version = "memoryctl"
    service: Service

    def __init__(self, conn: socket.socket, addr: tuple[str, int], service: Service, trusted: bool) -> None:
        self.service, self.trusted = service, trusted
        self.timeout = service.io_timeout  # type: ignore[misc]  # StreamRequestHandler reads it per instance
        super().__init__(conn, addr, service)  # type: ignore[arg-type]

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        t0 = time.perf_counter()
        svc = self.service
        headers: dict[str, str] = {}
        try:
            status, reply = svc.handle(method, self.path, self.headers, self.rfile, self.trusted)
            body = encode(reply.data)
            headers[EXIT_HEADER] = str(reply.exit_code)
            if reply.warnings:
                headers[WARNINGS_HEADER] = json.dumps(reply.warnings, ensure_ascii=True)
        except HttpError as exc:
            status, headers = exc.status, exc.headers
            body = encode({"error": exc.message, "hint": exc.hint, "exit_code": int(ExitCode.USAGE)})
        except MemoryctlError as exc:
            status = status_for(exc)
            body = encode({"error": exc.message, "hint": exc.hint, "exit_code": int(exc.exit_code)})
        except Exception as exc:
            log.exception("%s %s failed", method, self.path)
            status = 500
            body = encode({"error": f"internal error ({type(exc).__name__}); see the service's log", "exit_code": 1})
        with svc._lock:
            svc.counts["requests"] += 1
            svc.counts["errors"] += status >= 500
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)
        if status >= 400:
            self._linger()
        log.info("%s %s %d %.1f ms", method, self.path.split("?")[0], status, (time.perf_counter() - t0) * 1000)

    def _linger(self) -> None:
        """Read and drop what the client still sends after an error reply, within bounds.

        A 401/404/413 is sent before the body is read. Closing a socket with unread data makes the
        kernel reset the connection, and the reset can reach the client before it has read the
        reply: it would report a broken pipe instead of the error meant for it. So half-close and
        drain until the client closes (it has the reply by then), at most LINGER_S and LINGER_BYTES.
        """
        conn = self.connection
        try:
            conn.shutdown(socket.SHUT_WR)
            deadline, left = time.monotonic() + LINGER_S, LINGER_BYTES
            while left > 0 and (remaining := deadline - time.monotonic()) > 0:
                conn.settimeout(remaining)
                chunk = self.rfile.read1(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:  # the client went away or the deadline passed: nothing more to do
            pass

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Malformed requests (bad request line, headers too long) get JSON like every other error."""
        body = encode({"error": message or "bad request", "exit_code": int(ExitCode.USAGE)})
        self.send_response(code, message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD" and code >= 200 and code not in (204, 304):
            self.wfile.write(body)
