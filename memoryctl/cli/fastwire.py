"""The fast path's one HTTP exchange with the service over its Unix socket, standard library only.

Why not httpx (``memoryctl.serve.client``, which everything else uses): importing it costs ~200 ms
of CPU (``python -X importtime -c "import httpx"``, 213 ms cumulative here), and ``http.client``
~27 ms (it imports email and ssl), against ~45 ms for the whole fast path. One request per
connection (``Connection: close``), a JSON body with its length, the reply read to the end.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from memoryctl.errors import MemoryctlError
from memoryctl.operations.reply import Reply
from memoryctl.serve.wire import CONFIG_HEADER, decode_reply, route


def call(path: Path, name: str, params: dict[str, Any], *, digest: str, timeout: float | None) -> Reply | None:
    """The operation's reply, or None when nobody listens on the socket (nothing was sent)."""
    body = json.dumps(params).encode()
    head = (
        f"POST {route(name)} HTTP/1.1\r\nHost: memoryctl\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{CONFIG_HEADER}: {digest}\r\n\r\n"
    )
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    with sock:
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            return None  # nobody listens: the full command line works in-process
        except OSError as exc:
            raise MemoryctlError(
                f"cannot reach memoryctl serve at {path}: {exc}",
                hint="start it, or set MEMORYCTL_SERVE__USE=false to work in-process",
            ) from None
        try:
            sock.sendall(head.encode("latin-1") + body)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except OSError as exc:
            raise _failed(path, str(exc)) from None
    status, headers, payload = _parse(b"".join(chunks), path)
    return decode_reply(status, headers, payload, str(path))


def _failed(path: Path, why: str) -> MemoryctlError:
    return MemoryctlError(
        f"memoryctl serve at {path} failed during the request: {why}",
        hint="the request may or may not have been applied; check with `memoryctl get` before retrying",
    )


def _parse(raw: bytes, path: Path) -> tuple[int, dict[str, str], bytes]:
    """A whole HTTP/1.x reply: status line, headers (lower-case names), the body to Content-Length."""
    head, sep, payload = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if not sep or len(status_line) < 2 or not status_line[0].startswith("HTTP/") or not status_line[1].isdigit():
        raise _failed(path, f"not an HTTP reply: {raw[:60]!r}")
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    length = headers.get("content-length", "")
    if length.isdigit():
        if len(payload) < int(length):
            raise _failed(path, f"the reply ended after {len(payload)} of {length} bytes")
        payload = payload[: int(length)]
    return int(status_line[1]), headers, payload
