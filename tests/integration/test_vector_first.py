"""The vector-first plan (graph + text, high fan-out) against real PostgreSQL, real Neo4j and
Qdrant: same answers as graph-first, honest fallback when too few of the top K are connected."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from memoryctl.client import MemoryClient
from memoryctl.model import EntityRef, Memory, MemoryRef, Relation
from memoryctl.query.results import QueryResult
from memoryctl.query.spec import GraphFilter, MemoryQuery

pytestmark = pytest.mark.integration

ALICE, BOB = EntityRef("User", "Alice"), EntityRef("User", "Bob")
NOW = datetime.now(UTC)


def _by(who: EntityRef, text: str, hours: float) -> Memory:
    mid = uuid.uuid4()
    return Memory(
        id=mid,
        agent_id="vf",
        text=text,
        kind="dialogue",
        created_at=NOW - timedelta(hours=hours),
        entities=[who],
        relations=[Relation(who, "AUTHORED", MemoryRef(mid))],
    )


@pytest.fixture
def world(cluster: MemoryClient) -> tuple[MemoryClient, list[Memory]]:
    alice_rollback = [_by(ALICE, f"alice rollback payments service step {i}", i + 1) for i in range(3)]
    alice_lunch = [_by(ALICE, f"alice lunch pizza menu number {i}", i + 2) for i in range(40)]
    bob = [_by(BOB, f"bob rollback payments database migration {i}", i + 1) for i in range(300)]
    out = cluster.add([*alice_rollback, *alice_lunch, *bob], extract=False)
    assert out.pending == {"qdrant": 0, "neo4j": 0}, out.delivery.failed
    return cluster, alice_rollback


def _run(client: MemoryClient, q: MemoryQuery, *, min_fanout: int) -> QueryResult:
    engine = client.engine
    saved = engine.options
    engine.options = replace(saved, vector_first_min_fanout=min_fanout)
    try:
        return engine.run(q)
    finally:
        engine.options = saved


def _q(limit: int, **kw: object) -> MemoryQuery:
    return MemoryQuery(
        text="rollback payments",
        agent_id="vf",
        graph=GraphFilter(ALICE, ("AUTHORED",)),
        limit=limit,
        decay=False,
        **kw,  # type: ignore[arg-type]
    )


def by_score(r: QueryResult) -> list[set[uuid.UUID]]:
    """The hits grouped by equal score, in rank order. The Qdrant server returns equal scores in no
    set order, so within a group either plan may rank them differently, and the last group may be
    cut at the limit differently; every group above it must be the same."""
    groups: list[tuple[float, set[uuid.UUID]]] = []
    for h in r.hits:
        if groups and abs(groups[-1][0] - h.score) < 1e-9:
            groups[-1][1].add(h.id)
        else:
            groups.append((h.score, {h.id}))
    return [ids for _, ids in groups]


def test_vector_first_gives_the_graph_first_answer(
    world: tuple[MemoryClient, list[Memory]], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, rollback = world
    # Both plans give the same candidates. Forty lunch notes tie on both legs, and which of them
    # fill the candidates' window at its cut is the stores' choice; a note's conversational
    # context (the candidates written just before it, query/turns.py) and its session's support
    # (the candidates of its session, query/sessions.py) depend on that choice.
    monkeypatch.setattr(client.engine, "options", replace(client.engine.options, context_turns=0, sessions=False))
    for q in (_q(3), _q(5), _q(3, since=NOW - timedelta(hours=2, minutes=30))):
        graph_first = _run(client, q, min_fanout=0)
        vector_first = _run(client, q, min_fanout=10)
        assert graph_first.plan.startswith("graph → vector"), graph_first.plan
        assert "vector-first" in vector_first.plan, vector_first.plan
        assert [h.score for h in vector_first.hits] == pytest.approx([h.score for h in graph_first.hits])
        assert by_score(vector_first)[:-1] == by_score(graph_first)[:-1]
        # Known answer: the rollback memories inside the time range are the only ones matching the text.
        expected = {m.id for m in rollback if q.since is None or m.created_at >= q.since}
        assert expected <= {h.id for h in vector_first.hits} and expected <= {h.id for h in graph_first.hits}
        names = [s.name for s in vector_first.steps]
        assert "graph.traverse" not in names and {"graph.fanout", "vector.search", "graph.verify"} <= set(names)
        verify = next(s for s in vector_first.steps if s.name == "graph.verify")
        assert verify.rows_in is not None and verify.rows_out is not None and verify.rows_out <= verify.rows_in
        assert all(h.memory.agent_id == "vf" for h in vector_first.hits)
        assert all("neo4j" in h.sources and h.scores["graph"] == 1.0 for h in vector_first.hits)
    top3 = _run(client, _q(3), min_fanout=10)
    assert {h.id for h in top3.hits} == {m.id for m in rollback}  # Alice's, not Bob's better-matching ones
    fanout = next(s for s in top3.steps if s.name == "graph.fanout")
    assert fanout.rows_out == 43  # 43 AUTHORED (and 43 mentions): the larger, not the sum


def test_too_few_connected_falls_back_to_graph_first(world: tuple[MemoryClient, list[Memory]]) -> None:
    """limit 1: K is sized for 12 connected hits in the top K, but Bob's 300 outrank Alice's lunch
    notes, so fewer than 12 of the top K are Alice's: the engine must not guess."""
    client, rollback = world
    r = _run(client, _q(1), min_fanout=10)
    assert r.plan.startswith("graph → vector"), r.plan
    assert any("graph-first instead" in n for n in r.notes), r.notes
    assert [h.id for h in r.hits] == [h.id for h in _run(client, _q(1), min_fanout=0).hits]
    assert r.hits[0].id in {m.id for m in rollback}


def test_vector_first_never_returns_deleted_or_other_agents(world: tuple[MemoryClient, list[Memory]]) -> None:
    client, rollback = world
    client.forget([rollback[0].id], agent_id="vf")
    twin = Memory(text=rollback[1].text, agent_id="other", entities=[ALICE])
    client.add([twin], extract=False)
    r = _run(client, _q(5), min_fanout=10)
    assert "vector-first" in r.plan
    ids = {h.id for h in r.hits}
    assert rollback[0].id not in ids and twin.id not in ids and rollback[1].id in ids


def test_low_fanout_stays_graph_first(world: tuple[MemoryClient, list[Memory]]) -> None:
    client, _ = world
    r = _run(client, _q(3), min_fanout=1000)  # 43 < 1000
    assert r.plan.startswith("graph → vector") and not r.notes
    assert [s.name for s in r.steps][:2] == ["graph.fanout", "graph.traverse"]
