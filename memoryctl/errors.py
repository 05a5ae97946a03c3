"""Every error memoryctl raises on purpose, and the exit code each one maps to.

The CLI catches ``MemoryctlError`` in one place (``memoryctl.cli.main``) and turns it into a
one-paragraph message plus an exit code; anything else is a bug and is the only thing allowed to
show a traceback. Each error carries *what* failed and a *hint* that names the setting or command
that fixes it, the way pip's diagnostic errors do.

Hierarchy::

    MemoryctlError                 exit 1 unless a subclass says otherwise
    ├── UsageError                 exit 2  bad flags, bad values, hostile identifiers
    │   ├── ConfigError            exit 2  the TOML/env configuration is wrong
    │   └── InputError             exit 2  a record/line of user data is invalid
    │       └── ConflictError      exit 2  an id that exists under another agent (HTTP 409)
    ├── NotFoundError              exit 1  a memory id that does not exist
    ├── DiskFullError              exit 1  a write ran out of space or quota (nothing half-written kept)
    ├── StoreError                 exit 1  a store answered with an error
    │   ├── BadRecord              exit 1  it refused one record's data (delivery sets that record aside)
    │   └── StoreUnavailable       exit 1  a store could not be reached (refused, breaker open)
    │       └── StoreTimeout       exit 1  it did not answer within the deadline (callers may retry smaller)
    └── PartialFailure             exit 3  the primary write/read succeeded, a secondary store is degraded
"""

from __future__ import annotations

import uuid
from enum import IntEnum


class ExitCode(IntEnum):
    """Named exit codes; part of the CLI contract documented in the README."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    PARTIAL = 3


class MemoryctlError(Exception):
    """Base of every deliberate error. ``hint`` tells the operator what to change."""

    exit_code: ExitCode = ExitCode.FAILURE

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"


class UsageError(MemoryctlError):
    exit_code = ExitCode.USAGE


class ConfigError(UsageError):
    pass


class InputError(UsageError):
    pass


class ConflictError(InputError):
    """The request names an existing memory of another agent: refused, never a move (HTTP 409).

    ``ids`` are the memory ids in conflict; an import turns them into bad lines of their own.
    """

    http_status = 409

    def __init__(self, message: str, *, ids: list[uuid.UUID], hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.ids = ids


class NotFoundError(MemoryctlError):
    pass


class DiskFullError(MemoryctlError):
    """A file write ran out of space (ENOSPC) or quota (EDQUOT) on this host.

    The message names the filesystem's device and the path, what is free and, when the caller
    knows, about how much the write needed; the writer has removed what it had half-written
    (``memoryctl.diskspace``), so a rerun after freeing space starts clean.
    """

    def __init__(self, path: str | None, device: str | None, free_bytes: int | None, needs_bytes: int | None) -> None:
        needs = f", needs about {_mb(needs_bytes)} MB" if needs_bytes is not None else ""
        if path is None or device is None or free_bytes is None:
            # A write() that failed does not say which file it was writing (Python's OSError
            # carries no filename then): the sentence without what is not known.
            message = f"no space left on a device this command writes to{needs}"
            hint = "see `df -h` for the full filesystem and free space there"
        else:
            message = f"no space left on {device} ({path}): {_mb(free_bytes)} MB free{needs}"
            hint = f"free space on {device}, or point the command at a larger filesystem"
        super().__init__(message, hint=f"{hint} (e.g. [backup] spool_dir for snapshot sets)")
        self.path, self.device, self.free_bytes, self.needs_bytes = path, device, free_bytes, needs_bytes


def _mb(n: int) -> str:
    """MB with the digits that tell a small free space from a small need apart ("0.07 MB free,
    needs about 0.15 MB", not "0.1 ... 0.1"): whole MB from 10 MB on, one decimal below, two below 1."""
    mb = n / 1_000_000
    if mb >= 10 or mb == 0:
        return f"{mb:.0f}"
    return f"{mb:.1f}" if mb >= 1 else f"{mb:.2f}"


class StoreError(MemoryctlError):
    """A store answered, but with an error. ``store`` is one of "postgres", "qdrant", "neo4j", …"""

    def __init__(self, store: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"{store}: {message}", hint=hint)
        self.store = store


class BadRecord(StoreError):
    """The store answered that this data cannot be taken or read (a PostgreSQL data exception, a
    Qdrant 400, a Neo4j type or constraint error): retrying the same record cannot help, so the
    outbox sets it aside instead of letting it hold back every other delivery (memoryctl.write.outbox).
    """


class StoreUnavailable(StoreError):
    """The store could not be reached in time; callers degrade instead of failing where they can."""


class StoreTimeout(StoreUnavailable):
    """The store was reached but the call outlived its deadline (e.g. a transaction timeout).

    Distinct from "unreachable" because the remedy differs: a write that timed out may succeed
    when split into smaller pieces (the graph store does that before giving up).
    """


class PartialFailure(MemoryctlError):
    exit_code = ExitCode.PARTIAL

    def __init__(self, message: str, *, degraded: list[str], hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.degraded = degraded
