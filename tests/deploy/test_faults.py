"""Faults on the deployed cluster: a Qdrant peer lost and back, Neo4j stopped and back.

Qdrant is the distributed store: with every shard on two of the three peers, losing one node's
peer must cost nothing — the same answers, not marked degraded, and writes still land — and when
it returns its replicas catch up (every replica Active, equal point counts per shard, reconcile
without drift). Neo4j is a single server: without it answers come back marked degraded (graph filters from the
PostgreSQL fallback, hits without their relationships), writes wait in the outbox, and ``sync``
delivers them once it is back.
The faults are injected by stopping the service at a point the test controls, never raced.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.deploy import e2e_data
from tests.deploy.cluster import NODES, memoryctl, node, peer_api, put, wait_for
from tests.deploy.conftest import record
from tests.deploy.test_e2e import health, ids, query

pytestmark = pytest.mark.deploy
GRAPH = ("query", "--agent", e2e_data.AGENT, "--json", "--half-life", "off", "--entity", "project:borealis")


def write(name: str, count: int, **fields: Any) -> dict[str, Any]:
    """Import ``count`` new memories (spread over every shard) through the write path."""
    lines = [
        json.dumps(
            {
                "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{name}/{n}")),
                "agent_id": e2e_data.AGENT,
                "text": f"{name}: fault-time memory number {n}",
                "created_at": datetime(2026, 11, 1, 12, n, tzinfo=UTC).isoformat(),
                **fields,
            }
        )
        for n in range(count)
    ]
    put("node1", "\n".join(lines) + "\n", f"/var/lib/memoryctl/{name}.jsonl", owner="memoryctl")
    outcome: dict[str, Any] = memoryctl("import", f"{name}.jsonl", "--json").json()
    assert outcome["inserted"] == count, outcome
    outcome["pending"] = {store: n for store, n in outcome["pending"].items() if n}
    return outcome


def replica_counts(collection: str) -> dict[int, set[int]]:
    """Shard -> the point counts its replicas hold, each read from the peer that holds it."""
    counts: dict[int, set[int]] = {}
    for name in NODES:
        for shard in peer_api(name, f"/collections/{collection}/cluster")["local_shards"]:
            counts.setdefault(shard["shard_id"], set()).add(shard["points_count"])
    return counts


def test_qdrant_peer_lost_answers_stay_whole_and_replicas_converge(imported: e2e_data.DataSet) -> None:
    needles = imported.needles()
    asked = [(n.query, n.id) for n in needles if n.query is not None]
    graph_text = (needles[0].query or "", "--entity", f"person:{needles[0].author}", "--via", "AUTHORED")
    collection = health()["components"]["qdrant"]["collection"]
    node("node2").run("systemctl stop qdrant")
    try:
        assert not node("node2").service("qdrant").is_running
        during = {text: ids(query(text))[:1] for text, _ in asked}  # query() asserts: not degraded
        assert during == {text: [needle] for text, needle in asked}
        assert ids(query(*graph_text))[0] == needles[0].id
        outcome = write("qdrant-down", 30, entities=[{"type": "project", "name": "atlas"}])
        assert outcome["pending"] == {}, outcome  # every write reached a live replica
        components = health()["components"]
        problems = components["qdrant"].get("cluster", {}).get("problems", [])
        assert components["qdrant"]["status"] == "degraded" and problems, components["qdrant"]
    finally:
        node("node2").run("systemctl start qdrant")
    t0 = time.monotonic()

    def converged() -> bool:
        cluster = health()["components"]["qdrant"].get("cluster", {})
        return cluster.get("problems") == [] and {r["state"] for r in cluster.get("replicas", [])} == {"Active"}

    wait_for("every Qdrant replica Active again", converged, timeout=180, interval=3)

    def equal_replicas() -> dict[int, set[int]] | None:
        counts = replica_counts(collection)
        return counts if all(len(v) == 1 for v in counts.values()) else None

    counts = wait_for("equal point counts on every replica of every shard", equal_replicas, timeout=120)
    total = len(imported.records) + 30
    assert sum(next(iter(v)) for v in counts.values()) == total, counts
    drift = memoryctl("reconcile", "--json").json()
    record(
        "fault_qdrant_peer",
        {
            "answers_during_outage": "same top hits, degraded []",
            "health_during_outage": problems,
            "seconds_to_converge_after_restart": round(time.monotonic() - t0, 1),
            "replica_point_counts": {str(k): sorted(v) for k, v in counts.items()},
            "reconcile_drift": drift["drift"],
        },
    )
    assert drift["drift"] == 0, drift


def test_neo4j_stopped_answers_degraded_writes_wait_then_sync_delivers(imported: e2e_data.DataSet) -> None:
    borealis = imported.ids(project="borealis")
    node("node2").run("systemctl stop neo4j")
    try:
        assert not node("node2").service("neo4j").is_running
        graph = memoryctl(*GRAPH)
        answer = graph.json()
        assert graph.returncode == 3 and answer["degraded"] == ["neo4j"], answer["degraded"]
        assert answer["hits"] and set(ids(answer)) <= borealis  # the PostgreSQL fallback (mentions)
        # A text query still ranks from Qdrant; only the relationships of its hits (from the graph)
        # are missing, and the answer says so.
        needle = imported.needles()[1]
        assert needle.query is not None
        text = memoryctl("query", "--agent", e2e_data.AGENT, "--json", "--half-life", "off", needle.query)
        assert text.returncode == 3 and text.json()["degraded"] == ["neo4j"]
        assert ids(text.json())[0] == needle.id
        outcome = write("neo4j-down", 5, entities=[{"type": "project", "name": "borealis"}])
        assert outcome["pending"] == {"neo4j": 5}, outcome
        record("fault_neo4j", {"degraded_query_seconds": round(graph.seconds, 2), "pending": outcome["pending"]})
    finally:
        node("node2").run("systemctl start neo4j")
    # What the assertions below need is a graph query that answers, not only a health probe: right
    # after a start Neo4j's caches are cold and a large query can outlast the 2 s store timeout
    # (degraded, exit 3) while health already says ok (docs/operations.md, "After a Neo4j restart").
    started = time.monotonic()
    wait_for(
        "a graph query answers again (not degraded)",
        lambda: memoryctl(*GRAPH, "--limit", "1000").returncode == 0,
        timeout=300,
        interval=5,
    )
    answered_s = round(time.monotonic() - started, 1)
    synced = memoryctl("sync")
    assert synced.returncode == 0, synced.stderr
    components = health()["components"]
    assert components["outbox"]["graph"]["pending"] == 0
    assert components["neo4j"]["memories"] == components["postgres"]["memories"]
    drift = memoryctl("reconcile", "--json").json()
    assert drift["drift"] == 0, drift
    after = query("--entity", "project:borealis", "--limit", "1000")
    assert len(after["hits"]) == len(borealis) + 5
    record("fault_neo4j_restart", {"graph_query_answered_after_start_s": answered_s})
