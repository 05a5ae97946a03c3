"""A committed write's delivery: both stores at once, one budget, a breaker per store (issue 26).

The stores here are callables that block on events the test controls, so each assertion is about
order and outcome (who was waited for, who was not even tried), never about a measured duration.
"""

from __future__ import annotations

import threading
import time

import pytest

from memoryctl.errors import StoreUnavailable
from memoryctl.write.budget import WriteDelivery
from memoryctl.write.outbox import DeliveryReport

# Only for a delivery that hangs when the code under test is broken: generous, never a measure.
HANG_GUARD_S = 30.0


def delivered(target: str, n: int = 1) -> DeliveryReport:
    report = DeliveryReport()
    report.delivered[target] = n
    return report


def test_both_stores_deliver_at_once() -> None:
    # Each store's delivery finishes only once the other one has started: one after the other,
    # the first would wait for the second, which never starts, and the budget would run out.
    started = {t: threading.Event() for t in ("vector", "graph")}

    def own(target: str) -> DeliveryReport:
        started[target].set()
        other = "graph" if target == "vector" else "vector"
        assert started[other].wait(5)
        return delivered(target)

    report = WriteDelivery(reset_s=30).run(("vector", "graph"), own, budget_s=5)
    assert report.failed == {}
    assert report.delivered == {"vector": 1, "graph": 1}


def test_a_store_that_does_not_answer_is_left_to_the_outbox_and_then_not_waited_for() -> None:
    release = threading.Event()
    calls: list[str] = []

    def own(target: str) -> DeliveryReport:
        calls.append(target)
        if target == "graph":
            release.wait(30)  # a lost node: no answer
        return delivered(target)

    writes = WriteDelivery(reset_s=3600)
    first = writes.run(("vector", "graph"), own, store_name=lambda t: {"graph": "neo4j"}.get(t, t), budget_s=0.2)
    assert not release.is_set()  # it answered while the graph's delivery was still hanging
    assert first.delivered["vector"] == 1
    assert "neo4j did not take it within 0.2 s of the commit" in first.failed["graph"]

    second = writes.run(("vector", "graph"), own, budget_s=0.2)
    assert calls.count("graph") == 1 and calls.count("vector") == 2  # the hanging store was not called again
    assert second.failed["graph"].startswith("not tried: its delivery failed")
    assert second.delivered["vector"] == 1
    release.set()


def test_the_breaker_lets_one_write_try_again_after_its_reset() -> None:
    fail = {"graph": True}

    def own(target: str) -> DeliveryReport:
        report = delivered(target, 0 if fail.get(target) else 1)
        if fail.get(target):
            report.failed[target] = "neo4j: unavailable"
        return report

    writes = WriteDelivery(reset_s=30)
    now = [1000.0]
    writes.breaker("graph").clock = lambda: now[0]  # the breaker's time is the test's
    assert writes.run(("graph",), own).failed == {"graph": "neo4j: unavailable"}
    now[0] += 29.9
    assert writes.run(("graph",), own).failed["graph"].startswith("not tried")
    now[0] += 0.1  # the reset: the next write is the trial
    fail["graph"] = False
    assert writes.run(("graph",), own).failed == {}
    assert writes.run(("graph",), own).delivered["graph"] == 1  # closed again


def test_after_the_reset_one_write_of_many_at_once_tries_the_store() -> None:
    """Half-open is one trial: the writes that arrive while it is under way are not sent to the
    store that failed (issue 42 item 5: dropping the breaker's re-arm passed every other test)."""
    trial = threading.Event()
    calls: list[str] = []

    def own(target: str) -> DeliveryReport:
        calls.append(target)
        assert trial.wait(HANG_GUARD_S)  # the trial write is still on its way while the others arrive
        return delivered(target)

    writes = WriteDelivery(reset_s=30)
    now = [1000.0]
    breaker = writes.breaker("graph")
    breaker.clock = lambda: now[0]
    breaker.record(False)  # a failed delivery opened it
    now[0] += 30
    at_once = threading.Barrier(8)
    reports: list[DeliveryReport] = []

    def write() -> None:
        at_once.wait(HANG_GUARD_S)
        reports.append(writes.run(("graph",), own, budget_s=HANG_GUARD_S))

    threads = [threading.Thread(target=write, daemon=True) for _ in range(8)]
    for thread in threads:
        thread.start()
    try:
        # seven answered while the trial still waits (or more than one write went to the store)
        deadline = time.monotonic() + HANG_GUARD_S
        while len(reports) < 7 and len(calls) < 2:
            assert time.monotonic() < deadline, (calls, reports)
            time.sleep(0.01)
        assert calls == ["graph"]
        assert len(reports) == 7 and all(r.failed["graph"].startswith("not tried") for r in reports), reports
    finally:
        trial.set()
        for thread in threads:
            thread.join(HANG_GUARD_S)
    assert len(reports) == 8 and reports[-1].failed == {} and breaker.state == "closed"


def test_losing_postgresql_after_the_commit_is_raised_to_the_write() -> None:
    def own(target: str) -> DeliveryReport:
        raise StoreUnavailable("postgres", "server closed the connection unexpectedly")

    with pytest.raises(StoreUnavailable, match="server closed"):
        WriteDelivery(reset_s=30).run(("vector", "graph"), own, budget_s=5)


def test_the_backlog_counts_when_it_finishes_in_the_budget_and_runs_on_when_it_does_not() -> None:
    slow = threading.Event()
    finished = threading.Event()

    def backlog(target: str) -> DeliveryReport:
        if target == "graph":
            slow.wait(30)
            finished.set()
        return delivered(target, 256)

    writes = WriteDelivery(reset_s=30)
    report = writes.run(("vector", "graph"), lambda t: delivered(t), backlog=backlog, budget_s=0.3)
    assert report.failed == {}  # the write's own rows went through: the backlog is not its failure
    assert report.delivered == {"vector": 257, "graph": 1}
    slow.set()
    assert finished.wait(5)  # the graph's backlog was not abandoned, only not waited for


def test_without_a_budget_every_store_is_waited_for() -> None:
    """The embedded profile: its stores are in this process; a slow one (a cold embedder) is waited for."""
    slow = threading.Event()

    def own(target: str) -> DeliveryReport:
        if target == "vector":
            threading.Timer(0.3, slow.set).start()
            assert slow.wait(5)
        return delivered(target)

    report = WriteDelivery(reset_s=30).run(("vector", "graph"), own)
    assert report.failed == {} and report.delivered == {"vector": 1, "graph": 1}


def test_a_probe_opens_the_breaker_of_a_store_that_does_not_answer_and_only_of_that_one() -> None:
    release = threading.Event()
    pings: list[str] = []

    def ping(target: str) -> None:
        pings.append(target)
        if target == "graph":
            release.wait(30)  # a lost node: no answer

    writes = WriteDelivery(reset_s=3600)
    for probe in writes.probe(("vector", "graph"), ping, timeout_s=0.2):
        probe.wait(5)
    assert writes.breaker("graph").state == "open" and writes.breaker("vector").state == "closed"

    calls: list[str] = []

    def own(target: str) -> DeliveryReport:
        calls.append(target)
        return delivered(target)

    report = writes.run(("vector", "graph"), own, budget_s=5)
    assert calls == ["vector"]  # the write that commits afterwards does not wait for the graph
    assert report.failed["graph"].startswith("not tried: its delivery failed")
    release.set()


def test_a_probe_that_fails_opens_the_breaker_and_one_in_flight_is_not_started_twice() -> None:
    def refused(target: str) -> None:
        raise StoreUnavailable("neo4j", "connection refused")

    writes = WriteDelivery(reset_s=3600)
    for probe in writes.probe(("graph",), refused, timeout_s=5):
        probe.wait(5)
    assert writes.breaker("graph").state == "open"

    release = threading.Event()
    asked: list[str] = []

    def hanging(target: str) -> None:
        asked.append(target)
        release.wait(30)

    again = WriteDelivery(reset_s=3600)
    first = again.probe(("vector",), hanging, timeout_s=5)
    assert again.probe(("vector",), hanging, timeout_s=5) == []  # still asking: not asked twice
    release.set()
    for probe in first:
        probe.wait(5)
    assert asked == ["vector"] and again.breaker("vector").state == "closed"
