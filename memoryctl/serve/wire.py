"""What travels between the CLI and the service, known to both sides without importing each other.

A ``Reply`` (what a command prints), the reply headers that carry a command's exit code and
warnings, how a reply is read back (errors become the same ``MemoryctlError`` the command would
raise in-process), the bearer token, and the JSON encoding of the values memoryctl answers with
(datetimes, UUIDs, sets). Standard library only: the CLI's fast path imports it on every call.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memoryctl.errors import ExitCode, MemoryctlError
from memoryctl.operations.reply import Reply

if TYPE_CHECKING:
    from memoryctl.config import Settings

API = "/v1"
EXIT_HEADER = "Memoryctl-Exit-Code"
WARNINGS_HEADER = "Memoryctl-Warnings"
# Sent by the CLI's fast path: the digest of the configuration layers it read (config_layers). The
# service answers 412 (a precondition that failed), running nothing, when its own differ; the CLI
# then validates them itself.
CONFIG_HEADER = "Memoryctl-Config-Digest"
CONFIG_DIFFERS = 412


class ServiceError(MemoryctlError):
    """An error the service answered with: the same message, hint and exit code as in-process."""

    def __init__(self, message: str, *, hint: str | None, exit_code: int, status: int = 500) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        try:
            self.exit_code = ExitCode(exit_code)
        except ValueError:
            self.exit_code = ExitCode.FAILURE


class ConfigDiffers(ServiceError):
    """The service runs with other configuration layers than the caller sent the digest of."""


def reply_timeout(io_timeout_s: float) -> float:
    """How long the CLI waits for the reply of an operation that is not ``long``."""
    return max(io_timeout_s, 300.0)


def route(name: str) -> str:
    """An operation's HTTP path: ``query`` -> ``/v1/query``, ``backup status`` -> ``/v1/backup/status``."""
    return f"{API}/{name.replace(' ', '/')}"


def decode_reply(status: int, headers: Mapping[str, str], payload: bytes, where: str) -> Reply:
    """The reply of a call, or the error it carries raised as the command would raise it."""
    try:
        data = json.loads(payload) if payload else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise MemoryctlError(f"memoryctl serve at {where} answered {status} with a non-JSON body") from None
    if status != 200:
        error = data if isinstance(data, dict) else {}
        kind = ConfigDiffers if status == CONFIG_DIFFERS else ServiceError
        raise kind(
            str(error.get("error") or f"memoryctl serve answered {status}"),
            hint=error.get("hint"),
            exit_code=int(error.get("exit_code", ExitCode.FAILURE)),
            status=status,
        )
    # header names in lower case (httpx's headers ignore the case)
    warnings = json.loads(headers.get(WARNINGS_HEADER.lower()) or "[]")
    code = headers.get(EXIT_HEADER.lower()) or 0
    return Reply(data, int(code), [str(w) for w in warnings])


def json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def encode(data: Any) -> bytes:
    return json.dumps(data, default=json_default, ensure_ascii=False).encode()


def load_token(settings: Settings, *, create: bool) -> str | None:
    """The operator's HTTP bearer token: ``serve.token``, else the token file (made 0600 by ``serve``)."""
    if settings.serve.token is not None:
        return settings.serve.token.get_secret_value()
    path = settings.serve_token_file
    with contextlib.suppress(FileNotFoundError):
        return path.read_text().strip() or None
    if not create:
        return None
    import secrets  # only the service makes a token: not every CLI call needs hmac and base64

    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token
