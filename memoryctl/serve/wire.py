"""What travels between the CLI and the service, known to both sides without importing each other.

A ``Reply`` (what a command prints), the reply headers that carry a command's exit code and
warnings, the HTTP bearer token, and the JSON encoding of the values memoryctl answers with
(datetimes, UUIDs, sets). Standard library only: the CLI imports it on every call.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memoryctl.errors import ExitCode

if TYPE_CHECKING:
    from memoryctl.config import Settings

EXIT_HEADER = "Memoryctl-Exit-Code"
WARNINGS_HEADER = "Memoryctl-Warnings"
# Sent by the CLI's fast path: the digest of the configuration layers it read (config_layers). The
# service answers 409, running nothing, when its own differ; the CLI then validates them itself.
CONFIG_HEADER = "Memoryctl-Config-Digest"
CONFIG_DIFFERS = 409
# The 409 that means "configuration differs" carries this value in CONFIG_HEADER; a 409 without it
# is a conflict of the data (an id that exists under another agent), an error like any other.
CONFIG_DIFFERS_MARK = "differs"


@dataclass(slots=True)
class Reply:
    """What a command prints: ``data`` (its ``--json`` document), its exit code, its stderr lines."""

    data: Any
    exit_code: int = int(ExitCode.OK)
    warnings: list[str] = field(default_factory=list)


def json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def load_token(settings: Settings, *, create: bool) -> str | None:
    """The HTTP bearer token: ``serve.token``, else the token file (made 0600 by ``serve``)."""
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
