"""A write whose outbox rows another delivery is moving waits for it, and says "searchable".

Found by CI (tests/e2e/test_serve_load.py, 8 clients on one service): every write also takes one
batch of whatever else is due (issue 22, item 3), with ``SKIP LOCKED``; a second write whose rows
sat in that batch skipped them, counted them as still in the outbox and answered exit 3 "delivery
to graph is pending" for a memory that was being delivered at that moment. Here the other delivery
is a real ``Deliverer`` on the real Neo4j that holds its claim until the write is seen waiting on
it in ``pg_locks`` (so the test does not depend on timing: the old code never waits, the holder
gives up after its deadline and the write has already answered "pending").
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from memoryctl.client import MemoryClient
from memoryctl.model import Memory
from memoryctl.write.outbox import Deliverer

pytestmark = pytest.mark.integration


def lock_waiters(dsn: str) -> int:
    """Sessions of this test's own database (a fresh one per test) blocked by another of its
    sessions: a lock wait anywhere else on the shared server must not release the holder
    (issue 42, item 6), or the test would pass without the write ever waiting."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity w"
            " WHERE w.datname = current_database() AND w.pid <> pg_backend_pid()"
            " AND EXISTS (SELECT 1 FROM pg_stat_activity h"
            "  WHERE h.pid = ANY(pg_blocking_pids(w.pid)) AND h.datname = current_database())"
        ).fetchone()
    return int(row[0]) if row else 0


class HoldingGraph:
    """The real graph store, whose writes wait until somebody waits on the claim they run under."""

    def __init__(self, inner: Any, dsn: str, claimed: threading.Event) -> None:
        self.inner, self.dsn, self.claimed = inner, dsn, claimed

    def upsert_memories(self, memories: Any) -> None:
        self.claimed.set()
        deadline = time.monotonic() + 10
        while lock_waiters(self.dsn) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.inner.upsert_memories(memories)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_write_waits_for_its_rows_another_delivery_holds(cluster: MemoryClient, pg_dsn: str) -> None:
    memory = Memory(text="the rollback was Alice's call", agent_id="held")
    cluster.add([memory], deliver=False)  # queued, as between a write's commit and its delivery
    stack = cluster.stack
    claimed = threading.Event()
    other = Deliverer(stack.records, None, HoldingGraph(stack.require_graph(), pg_dsn, claimed), None)  # type: ignore[arg-type]
    reports: list[Any] = []
    backlog = threading.Thread(target=lambda: reports.append(other.deliver(targets=("graph",))))
    backlog.start()
    assert claimed.wait(10), "the other delivery never claimed the row"
    report = cluster.writes.deliver([memory.id], targets=("graph",))  # the write's own delivery
    pending = cluster.writes.pending([memory.id])  # what `add` answers from (exit 3 when not 0)
    backlog.join(15)
    assert reports and reports[0].delivered["graph"] == 1
    assert report.failed == {}
    assert pending["neo4j"] == 0
    assert stack.require_graph().count(agent_id="held") == 1


def test_a_write_says_what_holds_its_rows_when_the_wait_runs_out(
    cluster: MemoryClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held past the bound: an honest "pending" naming the holder, and the row still queued."""
    monkeypatch.setattr("memoryctl.write.pipeline.OWN_ROWS_WAIT_S", 0.2)
    memory = Memory(text="held for good", agent_id="stuck")
    cluster.add([memory], deliver=False)
    with cluster.stack.records.claim("graph", limit=10, memory_ids=[memory.id]) as items:
        assert [i.memory_id for i in items] == [memory.id]
        report = cluster.writes.deliver([memory.id], targets=("graph",))
        items[:] = []  # this holder delivered nothing: the row stays
    assert "held by another delivery" in report.failed["graph"]
    assert cluster.stack.records.pending_count([memory.id]) == {"vector": 1, "graph": 1}
