"""Waiting with a deadline: a call in a daemon thread, a condition polled, a circuit breaker.

A call that may hang (a store call, a probe, a ping, a delivery) runs in a daemon thread
(:class:`Call`) and its caller waits for it at most until a deadline: a hang costs the caller
exactly that, and never blocks interpreter exit (a ThreadPoolExecutor would join the stuck worker
at exit). A call that outlives its deadline goes on in its thread; its outcome is then nobody's.

A condition that comes true later (a server answering after its restart, a replica active again)
is asked for at an interval until a deadline (:func:`poll_until`).

A :class:`Breaker` opens after ``failures_to_open`` consecutive failures and fails fast for
``reset_s``; then one trial call is let through (half-open) and its outcome closes or re-opens it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


def deadline_in(seconds: float | None) -> float | None:
    """The monotonic time ``seconds`` from now; None (no deadline) for None."""
    return None if seconds is None else time.monotonic() + seconds


def left(deadline: float | None) -> float | None:
    """Seconds until ``deadline`` (0 once it passed); None for no deadline."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class Call(Generic[T]):
    """``fn()`` running in a daemon thread from construction on; ``wait`` for it with a timeout."""

    def __init__(self, fn: Callable[[], T], *, name: str) -> None:
        self.started = time.monotonic()
        self.result: T | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, args=(fn,), daemon=True, name=name).start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # handed to whoever waits
            self.error = exc
        finally:
            self._done.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Whether the call finished within ``timeout_s`` from now (None: as long as it takes)."""
        return self._done.wait(None if timeout_s is None else max(0.0, timeout_s))

    def wait_until(self, deadline: float | None) -> bool:
        """Whether the call finished by the monotonic ``deadline`` (None: as long as it takes)."""
        return self.wait(left(deadline))

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def outcome(self) -> T:
        """What the finished call returned; what it raised is raised here."""
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]  # T may itself allow None


@dataclass(frozen=True, slots=True)
class Polled(Generic[T]):
    """How polling ended: ``ok`` when the condition held; the last answer (or the error that
    stood for it) either way, and the seconds it took."""

    ok: bool
    value: T | None
    error: Exception | None
    seconds: float


def poll_until(
    ask: Callable[[], T],
    *,
    timeout_s: float,
    interval_s: float,
    ready: Callable[[T], bool] = bool,
    retry_on: tuple[type[Exception], ...] = (),
    sleep: Callable[[float], None] = time.sleep,
) -> Polled[T]:
    """``ask()`` every ``interval_s`` until ``ready(answer)``, or ``timeout_s`` after the first ask.

    An error of ``retry_on`` counts as "not yet" (a server not listening yet); any other propagates.
    The caller says what a timeout means (its own error, naming its setting).
    """
    t0 = time.monotonic()
    while True:
        value: T | None = None
        error: Exception | None = None
        try:
            value = ask()
            if ready(value):
                return Polled(True, value, None, time.monotonic() - t0)
        except retry_on as exc:
            error = exc
        if time.monotonic() - t0 > timeout_s:
            return Polled(False, value, error, time.monotonic() - t0)
        sleep(interval_s)


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


class Breakers:
    """One :class:`Breaker` per key (a store, a delivery target), made on first use."""

    def __init__(self, *, failures_to_open: int, reset_s: float) -> None:
        self.failures_to_open = failures_to_open
        self.reset_s = reset_s
        self._made: dict[str, Breaker] = {}
        self._lock = threading.Lock()

    def __getitem__(self, key: str) -> Breaker:
        with self._lock:
            if key not in self._made:
                self._made[key] = Breaker(self.failures_to_open, self.reset_s)
            return self._made[key]
