"""Recording a maintenance run in ``maintenance_runs``, whatever way the run ends.

Why a context manager: ``health`` and ``memoryctl runs`` must show a failed or interrupted run as
failed, not as ``running`` forever, so the record is finished in ``finally``-like fashion by one
piece of code instead of by every command remembering to do it.
"""

from __future__ import annotations

import contextvars
import getpass
import os
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from memoryctl.errors import MemoryctlError

if TYPE_CHECKING:  # the CLI asks for current_trigger/current_actor without loading psycopg
    from memoryctl.stores.records import RunLog

TRIGGERS = ("cli", "cron", "nightly", "api", "test")
R = TypeVar("R")


# Who asked for the run being done in this thread: set by memoryctl.operations.run from the
# caller's parameters, so that a run done by the service is recorded with its caller's trigger
# (cron) and user; unset, this process's own.
_CALLER: contextvars.ContextVar[tuple[str | None, str | None]] = contextvars.ContextVar(
    "memoryctl_run_caller", default=(None, None)
)


@contextmanager
def caller(trigger: str | None, actor: str | None) -> Iterator[None]:
    """Record the runs started in this block with ``trigger`` and ``actor`` (None: this process's)."""
    token = _CALLER.set((trigger if trigger in TRIGGERS else None, actor))
    try:
        yield
    finally:
        _CALLER.reset(token)


def current_trigger() -> str:
    """The caller's trigger, else ``MEMORYCTL_TRIGGER`` (cron sets ``cron``), else ``cli``."""
    given = _CALLER.get()[0]
    if given:
        return given
    value = os.environ.get("MEMORYCTL_TRIGGER", "cli").strip().lower()
    return value if value in TRIGGERS else "cli"


def current_actor() -> str | None:
    given = _CALLER.get()[1]
    if given:
        return given
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


@dataclass(slots=True)
class RunRecord:
    """What a command fills in while it runs; written when the block ends."""

    run_id: int
    counts: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"  # a command may set "partial" (e.g. a store was unavailable)
    error: str | None = None  # why a run that ended without an exception is not "ok"


# The operations a person acts with on the stack (the console's forms): whichever door they come
# through with a token (HTTP, MCP, the console), each is a run in the runs log with the token's name.
ACTIONS = frozenset({"forget", "outbox retry", "outbox drop"})


def recorded_action(runs: RunLog, command: str, actor: str, params: dict[str, Any], work: Callable[[], R]) -> R:
    """``work()`` recorded as the run ``command`` of ``actor`` (trigger ``api``), with the
    parameters it was given and the counts of its reply."""
    with recorded_run(runs, command, trigger="api", actor=actor) as rec:
        rec.details = {"params": {k: v for k, v in params.items() if v not in (None, False, [])}}  # a refusal too
        reply = work()
        data = getattr(reply, "data", None)
        rec.counts = {k: v for k, v in (data or {}).items() if isinstance(v, int)} if isinstance(data, dict) else {}
    return reply


@contextmanager
def recorded_run(
    runs: RunLog, command: str, *, trigger: str | None = None, actor: str | None = None
) -> Iterator[RunRecord]:
    """``trigger``/``actor`` default to this process's; the service records its caller's."""
    rec = RunRecord(runs.start(command, trigger=trigger or current_trigger(), actor=actor or current_actor()))
    try:
        yield rec
    except MemoryctlError as exc:
        try:
            runs.finish(rec.run_id, "failed", counts=rec.counts, error=exc.message, details=rec.details)
        except MemoryctlError:
            pass  # the record could not be finished (PostgreSQL away): the caller's error matters more
        raise
    except BaseException as exc:  # KeyboardInterrupt, SIGTERM-as-exception, bugs: still recorded
        error = f"{type(exc).__name__}: {exc}".strip()
        details = {**rec.details, "traceback": traceback.format_exc(limit=5)[-2000:]}
        try:
            runs.finish(rec.run_id, "failed", counts=rec.counts, error=error[:2000], details=details)
        except MemoryctlError:
            pass  # PostgreSQL itself went away; the original error matters more
        raise
    else:
        runs.finish(rec.run_id, rec.status, counts=rec.counts, error=rec.error, details=rec.details)
