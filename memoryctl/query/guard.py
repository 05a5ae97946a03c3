"""Timeouts and circuit breakers around every store call the query engine makes.

Each call runs as a ``memoryctl.deadline.Call`` (a daemon thread): a store that hangs costs the
query exactly the store's timeout. Each store has a ``Breaker``: after ``failures`` consecutive
failures its calls fail fast for ``reset_s``, then one is let through to try.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from memoryctl.deadline import Breaker, Breakers, Call
from memoryctl.errors import MemoryctlError, StoreError, StoreUnavailable

T = TypeVar("T")


class Guard:
    """One per process (per client): breakers keyed by store name."""

    def __init__(self, *, timeout_s: float = 2.0, failures: int = 3, reset_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self._breakers = Breakers(failures_to_open=failures, reset_s=reset_s)

    def breaker(self, store: str) -> Breaker:
        return self._breakers[store]

    def start(self, store: str, fn: Callable[[], T]) -> Pending[T]:
        """Begin a call in the background (for fan-out); ``Pending.wait`` applies the timeout."""
        return Pending(self, store, fn)

    def call(self, store: str, fn: Callable[[], T], *, timeout_s: float | None = None) -> T:
        return self.start(store, fn).wait(timeout_s)


class Pending(Generic[T]):
    def __init__(self, guard: Guard, store: str, fn: Callable[[], T]) -> None:
        self.guard, self.store = guard, store
        self.breaker = guard.breaker(store)
        self.call = Call(fn, name=f"store-{store}") if self.breaker.allow() else None

    def wait(self, timeout_s: float | None = None) -> T:
        if self.call is None:
            raise StoreUnavailable(self.store, "circuit breaker open after repeated failures; not retried yet")
        budget = self.guard.timeout_s if timeout_s is None else timeout_s
        if not self.call.wait_until(self.call.started + budget):
            self.breaker.record(False)
            raise StoreUnavailable(self.store, f"no answer within {budget:.1f}s")
        err = self.call.error
        if err is None:
            self.breaker.record(True)
            return self.call.outcome()
        # A store that answered with an error about the request is working.
        self.breaker.record(not isinstance(err, StoreUnavailable))
        if isinstance(err, MemoryctlError):
            raise err
        raise StoreError(self.store, f"{type(err).__name__}: {err}") from err
