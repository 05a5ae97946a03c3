"""One bad record never holds back the outbox (issue 22, item 1), on the real stores.

The poison is the issue's: a memory whose ``created_at`` PostgreSQL stored but psycopg cannot read
back (0001 BC in UTC). The door refuses such timestamps now (tests/unit/test_model.py), so the row
is written the way an older memoryctl wrote it, by SQL. Then stores that refuse one memory, or
every memory, show the line between "set this record aside" and "the store is failing: wait".
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from memoryctl.client import MemoryClient
from memoryctl.errors import StoreError
from memoryctl.health.exposition import prometheus
from memoryctl.model import Memory
from memoryctl.write.outbox import Deliverer

pytestmark = pytest.mark.integration

BC = "0001-12-31 10:00:00+00 BC"  # `--at 0001-01-01T00:00:00+14:00`, as it was stored


def poison(client: MemoryClient, dsn: str, agent: str = "dates") -> uuid.UUID:
    mid = uuid.uuid4()
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO memories (id, agent_id, text, kind, created_at, updated_at, content_hash)"
            " VALUES (%s, %s, 'x', 'note', %s, now(), 'h')",
            (mid, agent, BC),
        )
        conn.execute(
            "INSERT INTO outbox (memory_id, target, op) VALUES (%s, 'vector', 'upsert'), (%s, 'graph', 'upsert')",
            (mid, mid),
        )
    return mid


def good(client: MemoryClient, n: int, agent: str = "others") -> list[uuid.UUID]:
    memories = [Memory(text=f"memory {i} of {agent}", agent_id=agent) for i in range(n)]
    client.add(memories, deliver=False)
    return [m.id for m in memories]


def in_stores(client: MemoryClient, agent: str) -> tuple[int, int]:
    return client.stack.require_vectors().count(agent_id=agent), client.stack.require_graph().count(agent_id=agent)


def test_a_poison_row_is_set_aside_and_the_rest_flows(cluster: MemoryClient, pg_dsn: str) -> None:
    bad = poison(cluster, pg_dsn)
    ok = good(cluster, 5)  # queued after the poison: the first batch holds both
    report, pending = cluster.sync()
    assert report.failed == {} and pending == {"qdrant": 0, "neo4j": 0}
    assert in_stores(cluster, "others") == (len(ok), len(ok))
    aside = cluster.set_aside()
    assert {(r["memory_id"], r["target"]) for r in aside} == {(bad, "vector"), (bad, "graph")}
    assert all("timestamp too small" in r["last_error"] and r["agent_id"] == "dates" for r in aside)
    # A later write of another agent delivers and reports nothing pending (it used to exit 3).
    later = cluster.add([Memory(text="after the poison", agent_id="others")])
    assert later.pending == {"qdrant": 0, "neo4j": 0} and later.delivery.failed == {}
    # health says so, the metric the alert reads counts it; sync stays quiet about it.
    health = cluster.health()
    outbox = health.components["outbox"]
    assert outbox["status"] == "degraded" and "memoryctl outbox list" in outbox["error"]
    assert 'memoryctl_outbox_set_aside{target="vector"} 1' in prometheus(health)
    # Fixed by hand, put back, delivered; nothing set aside any more.
    with psycopg.connect(pg_dsn) as conn:  # a hypertable row cannot change chunks: written anew
        conn.execute("DELETE FROM memories WHERE id = %s", (bad,))
        conn.execute(
            "INSERT INTO memories (id, agent_id, text, kind, created_at, updated_at, content_hash)"
            " VALUES (%s, 'dates', 'x', 'note', '2026-01-01T00:00:00Z', now(), 'h')",
            (bad,),
        )
    assert cluster.retry_set_aside([aside[0]["id"]]) == 1
    assert cluster.retry_set_aside(None) == 1
    cluster.sync()
    assert in_stores(cluster, "dates") == (1, 1) and cluster.set_aside() == []
    assert cluster.health().components["outbox"]["status"] == "ok"
    # Dropped: gone from the outbox, nothing pending.
    again = poison(cluster, pg_dsn)
    cluster.sync()
    assert [r["memory_id"] for r in cluster.set_aside()] == [again, again]
    assert cluster.drop_set_aside(None) == 2 and cluster.set_aside() == []


class Refusing:
    """The real vector store, refusing the memories ``refuse`` names with a plain store error (no
    ``BadRecord``: only the other memories' delivery tells the record from the store)."""

    def __init__(self, inner: Any, refuse: Callable[[uuid.UUID], bool]) -> None:
        self.inner, self.refuse = inner, refuse

    def upsert(self, points: list[Any], **kw: Any) -> None:
        if any(self.refuse(p.id) for p in points):
            raise StoreError("qdrant", "upsert: HTTP 500: refused")
        self.inner.upsert(points, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def deliver_with(client: MemoryClient, refuse: Callable[[uuid.UUID], bool]) -> Any:
    stack = client.stack
    vectors = Refusing(stack.require_vectors(), refuse)
    return Deliverer(stack.records, vectors, None, stack.embedder).deliver(targets=("vector",))  # type: ignore[arg-type]


def test_a_memory_the_store_refuses_among_others_is_set_aside(cluster: MemoryClient) -> None:
    ids = good(cluster, 40)
    refused = {ids[7], ids[31]}
    report = deliver_with(cluster, lambda mid: mid in refused)
    assert report.failed == {} and report.delivered["vector"] == 38
    assert {r["memory_id"] for r in cluster.set_aside()} == refused
    assert (
        cluster.stack.records.pending_count()["graph"] == 40 and "vector" not in cluster.stack.records.pending_count()
    )


@pytest.mark.parametrize("n", [1, 40])
def test_a_store_that_refuses_everything_is_failing_not_the_records(cluster: MemoryClient, n: int) -> None:
    """Every memory refused (or the only one): nothing is set aside, the batch waits as in an outage."""
    good(cluster, n)
    report = deliver_with(cluster, lambda mid: True)
    assert report.delivered["vector"] == 0 and "refused" in report.failed["vector"]
    assert cluster.set_aside() == [] and cluster.stack.records.pending_count()["vector"] == n
