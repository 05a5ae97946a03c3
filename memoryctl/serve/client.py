"""Finding a running service and calling it: what the CLI does before working in-process.

Discovery: ``serve.url`` (another host, HTTP with the token) if set, else the Unix socket in the
data directory. No service there (no socket, connection refused) means ``None``: the caller does
the work itself. Only a failure *before anything was sent* falls back; once a request is on the
wire an error is reported, never retried in-process (a write must not be applied twice -- and
``add`` sends its id, so a retry by the user is idempotent anyway).

Cheap to import on purpose (``http.client``, ``json``): it runs in every CLI call.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

from memoryctl.errors import ExitCode, MemoryctlError
from memoryctl.serve.wire import CONFIG_DIFFERS, CONFIG_HEADER, EXIT_HEADER, WARNINGS_HEADER, Reply, load_token

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


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


class ServiceClient:
    def __init__(
        self, *, socket_path: Path | None = None, url: str | None = None, token: str | None = None, timeout: float
    ) -> None:
        self.socket_path, self.url, self.token, self.timeout = socket_path, url, token, timeout
        self.where = url or str(socket_path)

    def _connection(self, timeout: float | None) -> http.client.HTTPConnection:
        if self.url:
            parts = urlsplit(self.url)
            cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
            return cls(parts.hostname or "localhost", parts.port, timeout=timeout)
        assert self.socket_path is not None
        return _UnixConnection(self.socket_path, timeout)

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
        body: Any
        if upload is not None:
            target += "?" + urlencode({k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()})
            headers["Content-Type"] = "application/x-ndjson"
            headers["Content-Length"] = str(upload.stat().st_size)
        else:
            body = json.dumps({k: v for k, v in params.items() if v is not None}).encode()
            headers["Content-Type"] = "application/json"
        # An import answers when it is done, however long that takes; nothing else should be slow.
        conn = self._connection(None if upload is not None else self.timeout)
        try:
            try:
                conn.connect()
            except (FileNotFoundError, ConnectionRefusedError):
                return None  # nobody listens: work in-process
            except OSError as exc:
                raise MemoryctlError(
                    f"cannot reach memoryctl serve at {self.where}: {exc}",
                    hint="start it, or set MEMORYCTL_SERVE__USE=false to work in-process",
                ) from None
            try:
                if upload is not None:
                    with upload.open("rb") as stream:
                        conn.request("POST", target, body=stream, headers=headers)
                else:
                    conn.request("POST", target, body=body, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                raise MemoryctlError(
                    f"memoryctl serve at {self.where} failed during the request: {exc}",
                    hint="the request may or may not have been applied; check with `memoryctl get` before retrying",
                ) from None
        finally:
            conn.close()
        return _reply(resp, payload, self.where)


def _reply(resp: http.client.HTTPResponse, payload: bytes, where: str) -> Reply:
    try:
        data = json.loads(payload) if payload else None
    except json.JSONDecodeError:
        raise MemoryctlError(f"memoryctl serve at {where} answered {resp.status} with a non-JSON body") from None
    if resp.status != 200:
        error = data if isinstance(data, dict) else {}
        kind = ConfigDiffers if resp.status == CONFIG_DIFFERS else ServiceError
        raise kind(
            str(error.get("error") or f"memoryctl serve answered {resp.status}"),
            hint=error.get("hint"),
            exit_code=int(error.get("exit_code", ExitCode.FAILURE)),
        )
    warnings = json.loads(resp.getheader(WARNINGS_HEADER) or "[]")
    return Reply(data, int(resp.getheader(EXIT_HEADER) or 0), [str(w) for w in warnings])


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
