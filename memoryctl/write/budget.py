"""A committed write's delivery: every store at once, under one budget, behind a breaker.

The write has committed in PostgreSQL (the truth) with one outbox row per store: delivering it
now only makes it searchable sooner, the outbox delivers it anyway. Done one store after the other,
each with its own timeouts and retries, a write met a lost node's stores in turn: the failover
drill (issue 26) measured 39-49 s from the power cut to the first acknowledged write, 20-26 s of it
after the new primary had taken the commit, spent on the dead index node's Neo4j and Qdrant
replica. So a write waits for its stores **in parallel** and, in ``memoryctl serve`` on the
cluster profile, at most ``budget_s`` after the commit, and a store whose delivery just failed
is not waited for again until its breaker lets one write try (``reset_s``): meanwhile writes
answer at once "stored, delivery pending" (exit 3) and the outbox (the next write after the
reset, ``sync``, cron) delivers them.

A commit that hangs is the sign of a lost node (the primary's: a failover takes 20-25 s), and the
node may have held the other stores too: the write waiting for the new primary would then spend its
whole budget on them once it commits. So while a commit takes longer than ``probe_after_s``, every
store is asked whether it answers (:meth:`WriteDelivery.probe`); one that does not answer within the
budget opens its breaker, and the write that commits on the new primary answers at once, stored and
pending, instead of after another budget.

The budget is the service's: it answers agents that must not hang on a lost node, keeps the
delivery that outlives the budget going in its daemon thread, and lives long enough for a breaker
to matter. A one-shot command or a library call (a batch of 300 memories, a test's seed) delivers
one store after the other as before (``MemoryClient._deliver_write``), bounded by each store's own
timeouts, and reports what happened. Rows
are delivered by idempotent upserts, so a late delivery racing a later one is harmless.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memoryctl.delivery import DeliveryReport
from memoryctl.query.guard import Breaker


@dataclass
class _Run:
    """One store's delivery in its thread: the write's own rows first, then any backlog."""

    own_done: threading.Event = field(default_factory=threading.Event)
    all_done: threading.Event = field(default_factory=threading.Event)
    own: DeliveryReport | None = None
    backlog: DeliveryReport | None = None
    error: BaseException | None = None


class WriteDelivery:
    """One per client (the service keeps one for every request): breakers keyed by target."""

    def __init__(self, *, reset_s: float) -> None:
        self.reset_s = reset_s
        self._breakers: dict[str, Breaker] = {}
        self._lock = threading.Lock()
        self._probing: set[str] = set()

    def breaker(self, target: str) -> Breaker:
        with self._lock:
            if target not in self._breakers:
                self._breakers[target] = Breaker(failures_to_open=1, reset_s=self.reset_s)
            return self._breakers[target]

    def probe(self, targets: Sequence[str], ping: Callable[[str], object], timeout_s: float) -> list[threading.Thread]:
        """Ask each target that is not being asked already whether it answers, each in a daemon
        thread; a target whose ``ping`` fails, or does not answer within ``timeout_s``, has its
        breaker opened. An answer changes nothing (a store that answers a ping may still fail a
        delivery: only a delivery closes a breaker). Returns the threads (tests join them)."""
        threads = []
        for target in targets:
            with self._lock:
                if target in self._probing:
                    continue
                self._probing.add(target)
            thread = threading.Thread(
                target=self._probe_one, args=(target, ping, timeout_s), daemon=True, name=f"probe-{target}"
            )
            thread.start()
            threads.append(thread)
        return threads

    def _probe_one(self, target: str, ping: Callable[[str], object], timeout_s: float) -> None:
        answered = threading.Event()
        failed: list[BaseException] = []

        def ask() -> None:
            try:
                ping(target)
            except Exception as exc:  # any failure to answer counts, as a failed delivery would
                failed.append(exc)
            finally:
                answered.set()

        threading.Thread(target=ask, daemon=True, name=f"ping-{target}").start()
        try:
            if not answered.wait(timeout_s) or failed:
                self.breaker(target).record(False)
        finally:
            with self._lock:
                self._probing.discard(target)

    def run(
        self,
        targets: Sequence[str],
        own: Callable[[str], DeliveryReport],
        backlog: Callable[[str], DeliveryReport] | None = None,
        store_name: Callable[[str], str] = str,
        budget_s: float | None = None,
    ) -> DeliveryReport:
        """``own(target)`` for every target at once; what did not answer within the budget, or is
        behind an open breaker, is reported failed (pending). ``backlog(target)`` runs after a
        target's own rows went through and is counted only if it finishes within the budget.

        An exception ``own`` raises (PostgreSQL lost after the commit) is raised here, as a
        sequential delivery would have: the caller reports the write stored and pending.
        ``budget_s`` None: every store is waited for as long as it takes (its own timeouts bound it).
        """
        started = time.perf_counter()
        deadline = None if budget_s is None else started + budget_s
        report = DeliveryReport()
        runs: dict[str, _Run] = {}
        for target in targets:
            breaker = self.breaker(target)
            if not breaker.allow():
                ago = breaker.clock() - (breaker.opened_at or breaker.clock())
                report.failed[target] = (
                    f"not tried: its delivery failed {ago:.0f} s ago; the outbox delivers it"
                    f" (a write tries again {self.reset_s:g} s after the failure; or `memoryctl sync`)"
                )
                continue
            run = runs[target] = _Run()
            threading.Thread(
                target=_deliver, args=(run, target, own, backlog), daemon=True, name=f"deliver-{target}"
            ).start()
        for target, run in runs.items():
            breaker = self.breaker(target)
            if not run.own_done.wait(_left(deadline)):
                breaker.record(False)
                report.failed[target] = (
                    f"{store_name(target)} did not take it within {budget_s:g} s of the commit; the outbox delivers it"
                )
                continue
            if run.error is not None:
                raise run.error
            assert run.own is not None
            breaker.record(target not in run.own.failed)
            report.merge(run.own)
        for run in runs.values():
            if run.own is not None and run.all_done.wait(_left(deadline)):
                if run.backlog is not None:
                    report.merge(run.backlog)
        report.seconds = time.perf_counter() - started
        return report


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.perf_counter())


def _deliver(
    run: _Run,
    target: str,
    own: Callable[[str], DeliveryReport],
    backlog: Callable[[str], DeliveryReport] | None,
) -> None:
    try:
        run.own = own(target)
    except BaseException as exc:  # handed to the waiting caller, which raises it
        run.error = exc
        return
    finally:
        run.own_done.set()
    try:
        if backlog is not None and target not in run.own.failed:
            run.backlog = backlog(target)
    except Exception:  # the backlog is other writes' rows: the outbox keeps them
        run.backlog = None
    finally:
        run.all_done.set()
