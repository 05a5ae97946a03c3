"""One query's run: its steps with timings, the stores it found degraded, the notes it made.

Every store call of a query goes through ``QueryContext.call`` (or ``start`` for a call that
runs alongside another one), so each step is timed, guarded by the store's timeout and breaker,
and marked failed in one place. The ``or`` plan's legs run in threads, each with a ``leg()``
context of its own steps that shares the query's degraded stores and notes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sized
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from memoryctl.errors import MemoryctlError
from memoryctl.query.guard import Guard, Pending
from memoryctl.query.results import Step

T = TypeVar("T")


class QueryContext:
    def __init__(self, guard: Guard, *, degraded: list[str] | None = None, notes: list[str] | None = None) -> None:
        self.guard = guard
        self.steps: list[Step] = []
        self.degraded: list[str] = [] if degraded is None else degraded
        self.notes: list[str] = [] if notes is None else notes
        self._lock = threading.Lock()

    def leg(self) -> QueryContext:
        """A context for one parallel leg: its own steps, the query's degraded stores and notes."""
        return QueryContext(self.guard, degraded=self.degraded, notes=self.notes)

    # ---- steps ----------------------------------------------------------------------------------
    @contextmanager
    def step(self, name: str, store: str, detail: dict[str, Any]) -> Iterator[Step]:
        """Time a block as one step; a ``MemoryctlError`` marks the step failed and propagates."""
        step = Step(name, store, detail)
        self.steps.append(step)
        t0 = time.perf_counter()
        try:
            yield step
        except MemoryctlError as exc:
            step.status, step.error = "failed", exc.message
            raise
        finally:
            step.ms = round((time.perf_counter() - t0) * 1000, 2)

    def call(
        self,
        name: str,
        store: str,
        detail: dict[str, Any],
        fn: Callable[[], T],
        *,
        rows_in: int | None = None,
    ) -> T:
        """One store call under the store's timeout and breaker, as a step; rows out when sized."""
        with self.step(name, store, detail) as step:
            result = self.guard.call(store, fn)
            step.rows_in = rows_in
            if isinstance(result, Sized):
                step.rows_out = len(result)
            return result

    def start(self, name: str, store: str, detail: dict[str, Any], fn: Callable[[], T]) -> Running[T]:
        """Begin a store call that runs while the query does something else; ``wait`` for it."""
        step = Step(name, store, detail)
        self.steps.append(step)
        return Running(step, time.perf_counter(), self.guard.start(store, fn))

    # ---- outcome --------------------------------------------------------------------------------
    def degrade(self, store: str, note: str | None = None) -> None:
        with self._lock:
            self.degraded.append(store)
            if note:
                self.notes.append(note)

    def note(self, text: str) -> None:
        with self._lock:
            self.notes.append(text)

    def is_degraded(self, store: str) -> bool:
        return store in self.degraded


class Running(Generic[T]):
    """A started store call and the step it reports to."""

    def __init__(self, step: Step, t0: float, pending: Pending[T]) -> None:
        self.step, self._t0, self._pending = step, t0, pending

    def wait(self) -> T:
        try:
            return self._pending.wait()
        except MemoryctlError as exc:
            self.step.status, self.step.error = "failed", exc.message
            raise
        finally:
            self.step.ms = round((time.perf_counter() - self._t0) * 1000, 2)
