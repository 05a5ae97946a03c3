"""Finding a running service and calling it (httpx): what the CLI does before working in-process.

Discovery: ``serve.url`` (another host, HTTP with the token) if set, else the Unix socket in the
data directory (``httpx.HTTPTransport(uds=…)``). No service there (no socket, connection refused)
means ``None``: the caller does the work itself. Only a failure *before anything was sent* falls
back; once a request is on the wire an error is reported, never retried in-process (a write must
not be applied twice -- and ``add`` sends its id, so a retry by the user is idempotent anyway).

The console script's fast path does not use this module: importing httpx costs ~200 ms of CPU
(``python -X importtime -c "import httpx"``: 213 ms cumulative on this host), four times the
whole fast path; it speaks HTTP/1.1 over the socket with the standard library instead
(``memoryctl.cli.fastwire``). Everything else -- the full command line, which imports typer anyway,
``memoryctl mcp``, the benchmarks -- calls the service here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from memoryctl.errors import InputError, MemoryctlError
from memoryctl.operations.reply import Reply
from memoryctl.serve.wire import (
    CONFIG_HEADER,
    ConfigDiffers,
    ServiceError,
    decode_reply,
    load_token,
    reply_timeout,
    route,
)

if TYPE_CHECKING:
    from memoryctl.config import Settings

__all__ = ["ConfigDiffers", "ServiceClient", "ServiceError", "discover", "reply_timeout"]


class ServiceClient(AbstractContextManager["ServiceClient"]):
    """One service, over its Unix socket or over HTTP with a bearer token (``with``: closed after)."""

    def __init__(
        self, *, socket_path: Path | None = None, url: str | None = None, token: str | None = None, timeout: float
    ) -> None:
        self.socket_path, self.url, self.token, self.timeout = socket_path, url, token, timeout
        self.where = url or str(socket_path)
        transport = httpx.HTTPTransport(uds=str(socket_path)) if socket_path is not None else httpx.HTTPTransport()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(transport=transport, base_url=url or "http://memoryctl", headers=headers)

    def close(self) -> None:
        self._http.close()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        name: str,
        params: Mapping[str, Any],
        *,
        upload: Path | None = None,
        config_digest: str | None = None,
        long: bool = False,
    ) -> Reply | None:
        """The operation's reply, or None when no service answers (nothing was sent).

        With ``config_digest`` the service runs the operation only if its configuration layers
        have that digest, else raises ``ConfigDiffers`` having run nothing. ``long``: an operation
        that may take minutes (an import, a reconcile) answers when it is done.
        """
        headers = {CONFIG_HEADER: config_digest} if config_digest else {}
        timeout = None if long or upload is not None else self.timeout
        given = {k: v for k, v in params.items() if v is not None}
        _check_text(given)
        try:
            if upload is not None:
                query = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in given.items()}
                headers["Content-Type"] = "application/x-ndjson"
                with upload.open("rb") as body:
                    answer = self._http.post(route(name), params=query, content=body, headers=headers, timeout=timeout)
            else:
                answer = self._http.post(route(name), json=given, headers=headers, timeout=timeout)
        except httpx.ConnectError as exc:
            if _nobody_listens(exc):
                return None  # work in-process
            raise MemoryctlError(
                f"cannot reach memoryctl serve at {self.where}: {exc}",
                hint="start it, or set MEMORYCTL_SERVE__USE=false to work in-process",
            ) from None
        except httpx.HTTPError as exc:
            raise MemoryctlError(
                f"memoryctl serve at {self.where} failed during the request: {exc or type(exc).__name__}",
                hint="the request may or may not have been applied; check with `memoryctl get` before retrying",
            ) from None
        return decode_reply(answer.status_code, answer.headers, answer.content, self.where)


def _nobody_listens(exc: BaseException) -> bool:
    """Connection refused or no socket file: nothing was sent, the caller may work in-process."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, FileNotFoundError | ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    return "No such file" in text or "Connection refused" in text


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


def _check_text(params: Mapping[str, Any]) -> None:
    """Refuse, before anything is sent, an argument JSON cannot carry: text that is not text (an
    unpaired surrogate: what Python makes of bytes that are not UTF-8 on a command line) or a
    number that is not finite. The encoder's errors were tracebacks (found by the hostile-client
    harness)."""
    for key, value in params.items():
        for item in value if isinstance(value, list | tuple) else [value]:
            if isinstance(item, float) and not math.isfinite(item):
                # `--threshold inf` parses as a float; JSON has no spelling for it and the encoder's
                # ValueError was a traceback (the hostile-client harness, seed 2396642252).
                raise InputError(
                    f"--{key.replace('_', '-')}: {item} is not a finite number", hint="give a finite number"
                )
            if isinstance(item, str):
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise InputError(
                        f"--{key.replace('_', '-')}: not valid UTF-8 text ({ascii(item)[:60]})",
                        hint="pass the argument as UTF-8",
                    ) from None
