"""Neo4j's write path: plans that do not depend on statistics, bounded transactions, and timeouts
retried in smaller pieces without half-written memories (issue 16).

Uses the shared test Neo4j (``scripts/services``) with an agent of its own, removed afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import SecretStr

from memoryctl.config import Neo4jSettings
from memoryctl.errors import StoreTimeout
from memoryctl.model import RELATION_TYPES, entity_key
from memoryctl.stack import neo4j_graph
from memoryctl.stores import graph_neo4j
from memoryctl.stores.cypher_sandbox import plan_operators
from memoryctl.stores.graph_neo4j import Neo4jGraphStore
from memoryctl.stores.protocols import GraphEdge, GraphEntity, GraphMemory

pytestmark = pytest.mark.integration


def _settings(timeout_s: float) -> Neo4jSettings:
    uri = os.environ.get("MEMORYCTL_TEST_NEO4J_URI")
    if not uri:
        pytest.fail('MEMORYCTL_TEST_NEO4J_URI is not set: eval "$(scripts/services env)"', pytrace=False)
    password = os.environ.get("MEMORYCTL_TEST_NEO4J_PASSWORD") or None
    return Neo4jSettings(uri=uri, password=SecretStr(password) if password else None, timeout_s=timeout_s)


@pytest.fixture
def agent() -> Iterator[str]:
    name = f"gw-{uuid.uuid4().hex[:10]}"
    yield name
    with neo4j_graph(_settings(30.0)).backend.driver as driver, driver.session() as session:
        session.run("MATCH (n) WHERE n.agent_id = $a OR n.key STARTS WITH $p DETACH DELETE n", a=name, p=name).consume()


@pytest.fixture
def store() -> Iterator[Neo4jGraphStore]:
    s = neo4j_graph(_settings(30.0))
    s.ensure_schema()
    yield s
    s.close()


def _memory(agent: str, i: int, *, hub: bool) -> GraphMemory:
    """Memory ``i``: mentions its ticket; with ``hub``, also authored by and mentioning the hub user."""
    ticket = GraphEntity(entity_key(agent, "Ticket", f"T-{i}"), "Ticket", f"T-{i}")
    author = GraphEntity(entity_key(agent, "User", "hub"), "User", "hub")
    mid = uuid.uuid5(uuid.NAMESPACE_URL, f"{agent}/{i}")
    entities, mentions, edges = [ticket], [ticket.key], []
    if hub:
        entities.append(author)
        mentions.append(author.key)
        edges.append(GraphEdge(author.key, "AUTHORED", mid))
    return GraphMemory(
        mid, agent, datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=i), False, entities, mentions, edges
    )


def _stored(store: Neo4jGraphStore, mid: uuid.UUID) -> tuple[bool, int]:
    """(memory node exists, edges whose origin is this memory)."""
    with store.backend.driver.session() as session:
        rec = session.run(
            "OPTIONAL MATCH (m:Memory {id: $id}) "
            "RETURN m IS NOT NULL AS node, COUNT { (m)-[r]-() WHERE r.origin = $id } AS edges",
            id=str(mid),
        ).single()
    assert rec is not None
    return bool(rec["node"]), int(rec["edges"])


def _operators(store: Neo4jGraphStore, cypher: str, **params: object) -> list[str]:
    with store.backend.driver.session() as session:
        plan = session.run("EXPLAIN " + cypher, params).consume().plan
    return [op.split("@")[0] for op, _ in plan_operators(plan)]


@pytest.mark.parametrize("ends", [(False, True), (True, False), (False, False), (True, True)])
def test_edge_writes_never_look_edges_up(store: Neo4jGraphStore, ends: tuple[bool, bool]) -> None:
    """The edge statements read no relationship at all, so their cost cannot depend on a plan choice.

    (A MERGE of the edge let the planner pick a full scan of the ``origin`` index per row on a
    graph with few edges of the type: 25M db hits for 5,000 rows.)
    """
    for rel_type in ("AUTHORED", "MENTIONS", "BELONGS_TO"):
        ops = _operators(store, graph_neo4j._create_edges_cypher(rel_type, *ends), rows=[])
        assert "Create" in ops, ops
        assert not [op for op in ops if "Relationship" in op or "Expand" in op], ops


def test_drops_use_their_index_whatever_the_statistics(store: Neo4jGraphStore) -> None:
    # A type's origin index is created the first time a remote edge of it is written, which is
    # before any memory can record that type as one to drop (the set of types is open).
    types = {*RELATION_TYPES, "SAID", f"ATTENDED_{uuid.uuid4().hex[:6].upper()}"}
    store.backend._ensure_origin_indexes(types)
    for rel_type in sorted(types):
        ops = _operators(store, graph_neo4j._drop_remote_cypher(rel_type), ids=[])
        assert "DirectedRelationshipIndexSeek" in ops, (rel_type, ops)
    ops = _operators(store, graph_neo4j._DROP_NEAR, ids=[])
    assert any(op.startswith("NodeUniqueIndexSeek") for op in ops), ops


def test_a_large_batch_is_written_in_bounded_transactions(
    store: Neo4jGraphStore, agent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store.backend, "write_rows", 25)
    sizes: list[int] = []
    upsert = store.backend.upsert
    monkeypatch.setattr(store.backend, "upsert", lambda batch: (sizes.append(len(batch.memories)), upsert(batch))[1])
    items = [_memory(agent, i, hub=True) for i in range(60)]  # 4 rows each: node, 2 mentions, 1 edge
    store.upsert_memories(items)
    assert sizes == [6, 6, 6, 6, 6, 6, 6, 6, 6, 6]
    assert all(_stored(store, m.id) == (True, 3) for m in items)
    # Written again: the same graph (the edges were replaced, not duplicated).
    store.upsert_memories(items)
    assert all(_stored(store, m.id) == (True, 3) for m in items)
    assert store.count(agent_id=agent) == 60


def test_a_timed_out_write_is_split_and_nothing_is_half_written(store: Neo4jGraphStore, agent: str) -> None:
    """A transaction holding the hub's lock makes every write touching the hub time out.

    The store splits the batch until the memories that do not touch the hub are written, reports
    the timeout for the one that does, and leaves no memory with part of its edges; once the lock
    is gone the same call writes everything.
    """
    items = [_memory(agent, 0, hub=False), _memory(agent, 1, hub=False), _memory(agent, 2, hub=True)]
    store.upsert_memories([items[2]])  # the hub exists
    short = neo4j_graph(_settings(1.5))
    blocker = store.backend.driver.session()
    tx = blocker.begin_transaction()
    try:
        tx.run("MATCH (u:Entity {key: $k}) SET u.name = u.name", k=entity_key(agent, "User", "hub")).consume()
        with pytest.raises(StoreTimeout):
            short.upsert_memories(items)
        assert _stored(store, items[0].id) == (True, 1)
        assert _stored(store, items[1].id) == (True, 1)
        assert _stored(store, items[2].id) == (True, 3)  # the earlier, complete version, untouched
    finally:
        tx.rollback()
        blocker.close()
    short.upsert_memories(items)
    assert [_stored(store, m.id) for m in items] == [(True, 1), (True, 1), (True, 3)]
    short.close()
