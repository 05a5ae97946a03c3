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
one store after the other as before (``Writes._deliver_write`` in ``memoryctl/write/pipeline.py``),
bounded by each store's own timeouts, and reports what happened. Rows are delivered by idempotent
upserts, so a late delivery racing a later one is harmless.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from functools import partial

from memoryctl.deadline import Breaker, Breakers, Call, deadline_in
from memoryctl.write.outbox import DeliveryReport


class WriteDelivery:
    """One per client (the service keeps one for every request): breakers keyed by target."""

    def __init__(self, *, reset_s: float) -> None:
        self.reset_s = reset_s
        self._breakers = Breakers(failures_to_open=1, reset_s=reset_s)
        self._lock = threading.Lock()
        self._probing: set[str] = set()

    def breaker(self, target: str) -> Breaker:
        return self._breakers[target]

    def probe(self, targets: Sequence[str], ping: Callable[[str], object], timeout_s: float) -> list[Call[None]]:
        """Ask each target that is not being asked already whether it answers, in the background;
        a target whose ``ping`` fails, or does not answer within ``timeout_s``, has its breaker
        opened. An answer changes nothing (a store that answers a ping may still fail a delivery:
        only a delivery closes a breaker). Returns the probes (tests wait for them)."""
        probes = []
        for target in targets:
            with self._lock:
                if target in self._probing:
                    continue
                self._probing.add(target)
            probes.append(Call(partial(self._probe_one, target, ping, timeout_s), name=f"probe-{target}"))
        return probes

    def _probe_one(self, target: str, ping: Callable[[str], object], timeout_s: float) -> None:
        try:
            answer = Call(partial(ping, target), name=f"ping-{target}")
            # Any failure to answer counts, as a failed delivery would.
            if not answer.wait(timeout_s) or answer.error is not None:
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
        deadline = deadline_in(budget_s)
        report = DeliveryReport()
        runs: dict[str, tuple[Call[DeliveryReport], Call[DeliveryReport | None]]] = {}
        for target in targets:
            breaker = self.breaker(target)
            if not breaker.allow():
                ago = breaker.clock() - (breaker.opened_at or breaker.clock())
                report.failed[target] = (
                    f"not tried: its delivery failed {ago:.0f} s ago; the outbox delivers it"
                    f" (a write tries again {self.reset_s:g} s after the failure; or `memoryctl sync`)"
                )
                continue
            mine = Call(partial(own, target), name=f"deliver-{target}")
            runs[target] = (mine, Call(partial(_backlog_after, mine, target, backlog), name=f"backlog-{target}"))
        for target, (mine, _) in runs.items():
            breaker = self.breaker(target)
            if not mine.wait_until(deadline):
                breaker.record(False)
                report.failed[target] = (
                    f"{store_name(target)} did not take it within {budget_s:g} s of the commit; the outbox delivers it"
                )
                continue
            taken = mine.outcome()
            breaker.record(target not in taken.failed)
            report.merge(taken)
        for mine, rest in runs.values():
            if mine.done and mine.error is None and rest.wait_until(deadline) and rest.result is not None:
                report.merge(rest.result)
        report.seconds = time.perf_counter() - started
        return report


def _backlog_after(
    own: Call[DeliveryReport], target: str, backlog: Callable[[str], DeliveryReport] | None
) -> DeliveryReport | None:
    """``backlog(target)`` once ``target`` took the write's own rows; None when it did not, or when
    the backlog failed (it is other writes' rows: the outbox keeps them)."""
    own.wait()
    if backlog is None or own.error is not None or target in own.outcome().failed:
        return None
    try:
        return backlog(target)
    except Exception:
        return None
