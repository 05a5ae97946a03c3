"""Timeouts and circuit breakers around every store call the query engine makes.

Calls run in daemon threads: a store that hangs costs the caller exactly its timeout and never
blocks interpreter exit (a ThreadPoolExecutor would join the stuck worker at exit). A breaker
opens after ``failures`` consecutive failures and fails fast for ``reset_s``; then one trial call
is let through (half-open) and its outcome closes or re-opens it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from memoryctl.errors import MemoryctlError, StoreError, StoreUnavailable

T = TypeVar("T")


@dataclass
class Breaker:
    failures_to_open: int = 3
    reset_s: float = 30.0
    failures: int = 0
    opened_at: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)  # tests step their own

    def allow(self) -> bool:
        with self._lock:
            if self.opened_at is None:
                return True
            if self.clock() - self.opened_at >= self.reset_s:
                self.opened_at = self.clock()  # half-open: let this one call try
                return True
            return False

    def record(self, ok: bool) -> None:
        with self._lock:
            if ok:
                self.failures, self.opened_at = 0, None
            else:
                self.failures += 1
                if self.failures >= self.failures_to_open:
                    self.opened_at = self.clock()

    @property
    def state(self) -> str:
        return "closed" if self.opened_at is None else "open"


class _Call(Generic[T]):
    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()


class Guard:
    """One per process (per client): breakers keyed by store name."""

    def __init__(self, *, timeout_s: float = 2.0, failures: int = 3, reset_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self._failures = failures
        self._reset_s = reset_s
        self.breakers: dict[str, Breaker] = {}

    def breaker(self, store: str) -> Breaker:
        if store not in self.breakers:
            self.breakers[store] = Breaker(self._failures, self._reset_s)
        return self.breakers[store]

    def start(self, store: str, fn: Callable[[], T]) -> Pending[T]:
        """Begin a call in the background (for fan-out); ``Pending.wait`` applies the timeout."""
        return Pending(self, store, fn)

    def call(self, store: str, fn: Callable[[], T], *, timeout_s: float | None = None) -> T:
        return self.start(store, fn).wait(timeout_s)


class Pending(Generic[T]):
    def __init__(self, guard: Guard, store: str, fn: Callable[[], T]) -> None:
        self.guard, self.store = guard, store
        self.breaker = guard.breaker(store)
        self.started = time.perf_counter()
        self.call: _Call[T] | None = None
        if self.breaker.allow():
            self.call = _Call(fn)
            threading.Thread(target=self.call.run, daemon=True, name=f"store-{store}").start()

    def wait(self, timeout_s: float | None = None) -> T:
        if self.call is None:
            raise StoreUnavailable(self.store, "circuit breaker open after repeated failures; not retried yet")
        budget = self.guard.timeout_s if timeout_s is None else timeout_s
        remaining = max(0.0, budget - (time.perf_counter() - self.started))
        if not self.call.done.wait(remaining):
            self.breaker.record(False)
            raise StoreUnavailable(self.store, f"no answer within {budget:.1f}s")
        if self.call.error is not None:
            err = self.call.error
            if isinstance(err, StoreUnavailable):
                self.breaker.record(False)
            else:
                self.breaker.record(True)  # the store answered; the error is about the request
            if isinstance(err, MemoryctlError):
                raise err
            raise StoreError(self.store, f"{type(err).__name__}: {err}") from err
        self.breaker.record(True)
        return self.call.result  # type: ignore[return-value]
