"""Finding a running service and calling it: what the CLI does before working in-process.

Discovery: ``serve.url`` (another host, HTTP with the token) if set, else the Unix socket in the
data directory. No service there (no socket, connection refused) means ``None``: the caller does
the work itself. Only a failure *before anything was sent* falls back; once a request is on the
wire an error is reported, never retried in-process (a write must not be applied twice -- and
``add`` sends its id, so a retry by the user is idempotent anyway).

Cheap to import on purpose: it runs in every CLI call. Over the Unix socket it speaks the little
HTTP/1.0 our own server needs (one request per connection, the reply ends when the server closes
it) on a plain socket: importing ``http.client`` (email, ssl) cost ~40 ms of CPU per call, as much
as the rest of the console script's fast path. ``http.client`` serves ``serve.url`` (another host).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memoryctl.errors import ExitCode, MemoryctlError
from memoryctl.serve.wire import (
    CONFIG_DIFFERS,
    CONFIG_DIFFERS_MARK,
    CONFIG_HEADER,
    EXIT_HEADER,
    WARNINGS_HEADER,
    Reply,
    load_token,
)

if TYPE_CHECKING:
    from memoryctl.config import Settings


class ServiceError(MemoryctlError):
    """An error the service answered with: the same message, hint and exit code as in-process."""

    def __init__(self, message: str, *, hint: str | None, exit_code: int) -> None:
        super().__init__(message, hint=hint)
        try:
            self.exit_code = ExitCode(exit_code)
        except ValueError:
            self.exit_code = ExitCode.FAILURE


class ConfigDiffers(ServiceError):
    """The service runs with other configuration layers than the caller sent the digest of."""


class ServiceClient:
    def __init__(
        self, *, socket_path: Path | None = None, url: str | None = None, token: str | None = None, timeout: float
    ) -> None:
        self.socket_path, self.url, self.token, self.timeout = socket_path, url, token, timeout
        self.where = url or str(socket_path)

    def call(
        self, name: str, params: Mapping[str, Any], *, upload: Path | None = None, config_digest: str | None = None
    ) -> Reply | None:
        """The operation's reply, or None when no service answers (nothing was sent).

        With ``config_digest`` the service runs the operation only if its configuration layers
        have that digest, else raises ``ConfigDiffers`` having run nothing.
        """
        headers = {"Connection": "close"}
        if config_digest:
            headers[CONFIG_HEADER] = config_digest
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        target = f"/v1/{name}"
        body: bytes | Path
        if upload is not None:
            from urllib.parse import urlencode

            target += "?" + urlencode({k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()})
            headers["Content-Type"] = "application/x-ndjson"
            headers["Content-Length"] = str(upload.stat().st_size)
            body = upload
        else:
            body = json.dumps({k: v for k, v in params.items() if v is not None}).encode()
            headers["Content-Type"] = "application/json"
            headers["Content-Length"] = str(len(body))
        # An import answers when it is done, however long that takes; nothing else should be slow.
        timeout = None if upload is not None else self.timeout
        exchange = _http_exchange if self.url else _unix_exchange
        try:
            answer = exchange(self, target, headers, body, timeout)
        except _Unreachable as exc:
            raise MemoryctlError(
                f"cannot reach memoryctl serve at {self.where}: {exc.args[0]}",
                hint="start it, or set MEMORYCTL_SERVE__USE=false to work in-process",
            ) from None
        except _Failed as exc:
            raise MemoryctlError(
                f"memoryctl serve at {self.where} failed during the request: {exc.args[0]}",
                hint="the request may or may not have been applied; check with `memoryctl get` before retrying",
            ) from None
        return None if answer is None else _reply(*answer, self.where)


class _Unreachable(Exception):
    """Connecting failed otherwise than with nobody listening: nothing was sent."""


class _Failed(Exception):
    """The exchange failed once the request was (perhaps partly) sent."""


Answer = tuple[int, dict[str, str], bytes]  # status, headers (lower-case names), body


def _unix_exchange(
    client: ServiceClient, target: str, headers: dict[str, str], body: bytes | Path, timeout: float | None
) -> Answer | None:
    assert client.socket_path is not None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    with sock:
        try:
            sock.connect(str(client.socket_path))
        except (FileNotFoundError, ConnectionRefusedError):
            return None  # nobody listens: work in-process
        except OSError as exc:
            raise _Unreachable(exc) from None
        head = f"POST {target} HTTP/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        try:
            sock.sendall(head.encode("latin-1"))
            if isinstance(body, Path):
                with body.open("rb") as stream:
                    sock.sendfile(stream)
            else:
                sock.sendall(body)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except OSError as exc:
            raise _Failed(exc) from None
    return _parse(b"".join(chunks))


def _parse(raw: bytes) -> Answer:
    """A whole HTTP/1.x reply: status line, headers, and the body up to Content-Length."""
    head, sep, payload = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if not sep or len(status_line) < 2 or not status_line[0].startswith("HTTP/") or not status_line[1].isdigit():
        raise _Failed(f"not an HTTP reply: {raw[:60]!r}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length", "")
    if length.isdigit():
        if len(payload) < int(length):
            raise _Failed(f"the reply ended after {len(payload)} of {length} bytes")
        payload = payload[: int(length)]
    return int(status_line[1]), headers, payload


def _http_exchange(
    client: ServiceClient, target: str, headers: dict[str, str], body: bytes | Path, timeout: float | None
) -> Answer | None:
    import http.client
    from urllib.parse import urlsplit

    assert client.url is not None
    parts = urlsplit(client.url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "localhost", parts.port, timeout=timeout)
    try:
        try:
            conn.connect()
        except (FileNotFoundError, ConnectionRefusedError):
            return None  # nobody listens: work in-process
        except OSError as exc:
            raise _Unreachable(exc) from None
        try:
            if isinstance(body, Path):
                with body.open("rb") as stream:
                    conn.request("POST", target, body=stream, headers=headers)
            else:
                conn.request("POST", target, body=body, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise _Failed(exc) from None
    finally:
        conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload


def _reply(status: int, headers: dict[str, str], payload: bytes, where: str) -> Reply:
    try:
        data = json.loads(payload) if payload else None
    except json.JSONDecodeError:
        raise MemoryctlError(f"memoryctl serve at {where} answered {status} with a non-JSON body") from None
    if status != 200:
        error = data if isinstance(data, dict) else {}
        differs = status == CONFIG_DIFFERS and headers.get(CONFIG_HEADER.lower()) == CONFIG_DIFFERS_MARK
        kind = ConfigDiffers if differs else ServiceError
        raise kind(
            str(error.get("error") or f"memoryctl serve answered {status}"),
            hint=error.get("hint"),
            exit_code=int(error.get("exit_code", ExitCode.FAILURE)),
        )
    warnings = json.loads(headers.get(WARNINGS_HEADER.lower()) or "[]")
    return Reply(data, int(headers.get(EXIT_HEADER.lower()) or 0), [str(w) for w in warnings])


def reply_timeout(io_timeout_s: float) -> float:
    """How long the CLI waits for a reply: a sync of a long outbox may take a while."""
    return max(io_timeout_s, 300.0)


def discover(settings: Settings) -> ServiceClient | None:
    """The service the CLI should call, or None to work in-process."""
    cfg = settings.serve
    if not cfg.use:
        return None
    timeout = reply_timeout(cfg.io_timeout_s)
    if cfg.url:
        return ServiceClient(url=cfg.url, token=load_token(settings, create=False), timeout=timeout)
    path = settings.serve_socket
    if not path.exists():
        return None
    return ServiceClient(socket_path=path, timeout=timeout)
