"""Both GraphStore implementations against real servers, with the same cases and the same answers.

``Neo4jGraphStore`` talks to the Neo4j 5.26 server from ``scripts/neo4j-server``; ``SqlGraphStore``
to the test PostgreSQL (a fresh schema per test). Identical expectations are the point: the
embedded profile's SQL traversal must mean exactly what the cluster's Cypher means.

Neo4j Community has one user database, shared with other test modules, so every test here uses
its own agent-id prefix and removes only its own nodes afterwards.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import neo4j
import psycopg_pool
import pytest
from psycopg import sql
from psycopg.rows import dict_row, tuple_row
from pydantic import SecretStr

from memoryctl.config import Neo4jSettings
from memoryctl.errors import InputError, StoreError, StoreUnavailable, UsageError
from memoryctl.model import entity_key
from memoryctl.stack import neo4j_graph
from memoryctl.stores.cypher_sandbox import ReadOnlyCypher
from memoryctl.stores.graph_neo4j import Neo4jGraphStore
from memoryctl.stores.graph_sql import SqlGraphStore
from memoryctl.stores.protocols import (
    GraphEdge,
    GraphEntity,
    GraphMemory,
    GraphStore,
    GraphTraversal,
)

pytestmark = pytest.mark.integration

# The stores' timeouts here are hang guards, not a speed target: these tests compare answers, and a
# windowed traversal took over 10 s in Neo4j with the deploy stage's cluster beside it (CI rehearsal;
# its timeout is tested on its own below, with 1 s).
HANG_GUARD_S = 120.0

HINT = 'start the servers with `scripts/services up` and `eval "$(scripts/services env)"`'

HOSTILE_NAMES = [
    'O\'Brien "the" `tick`',
    "{braces: $param}",
    "semi; colon;",
    "MATCH (n) DETACH DELETE n",
    "'; DROP TABLE x; --",
    "x`]->() DETACH DELETE n //",
    "back\\slash \\' \\\"",
    "ünïcødé ✓",
]


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: {HINT}", pytrace=False)
    return value


# ------------------------------------------------------------------------------------------------
# Fixtures (local to this module on purpose)
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph_pg_pool() -> Iterator[psycopg_pool.ConnectionPool[Any]]:
    """Dict rows, like the record store's pool that SqlGraphStore shares in production."""
    dsn = _env("MEMORYCTL_TEST_PG_DSN")
    pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
        dsn, min_size=1, max_size=4, open=False, kwargs={"connect_timeout": 5, "row_factory": dict_row}
    )
    try:
        pool.open(wait=True, timeout=10)
    except psycopg_pool.PoolTimeout as exc:
        pytest.fail(f"PostgreSQL at {dsn} is unreachable ({exc}): {HINT}", pytrace=False)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def graph_neo4j_settings() -> Neo4jSettings:
    settings = Neo4jSettings(
        uri=_env("MEMORYCTL_TEST_NEO4J_URI"),
        password=SecretStr(_env("MEMORYCTL_TEST_NEO4J_PASSWORD")),
        timeout_s=HANG_GUARD_S,
    )
    store = neo4j_graph(settings)
    try:
        store.ensure_schema()
    except StoreError as exc:
        pytest.fail(f"Neo4j at {settings.uri} is unusable ({exc}): {HINT}", pytrace=False)
    finally:
        store.close()
    return settings


@dataclass
class Ctx:
    """One test's store plus what it needs to check raw state and to clean up after itself."""

    store: GraphStore
    prefix: str
    raw_counts: Any  # () -> (memories, entities, edges) under this test's prefix
    run_raw: Any = None
    ids: list[uuid.UUID] = field(default_factory=list)

    def agent(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def new_ids(self, n: int) -> list[uuid.UUID]:
        """Sorted, so that ties in traversal order (by id) are predictable."""
        ids = sorted(uuid.uuid4() for _ in range(n))
        self.ids.extend(ids)
        return ids


@pytest.fixture(params=["neo4j", "sql"])
def ctx(
    request: pytest.FixtureRequest,
) -> Iterator[Ctx]:
    prefix = f"t{uuid.uuid4().hex[:10]}-"
    if request.param == "sql":
        pool: psycopg_pool.ConnectionPool[Any] = request.getfixturevalue("graph_pg_pool")
        schema = f"gtest_{uuid.uuid4().hex[:12]}"
        sql_store = SqlGraphStore(pool, schema=schema, timeout_s=HANG_GUARD_S)
        sql_store.ensure_schema()

        def sql_counts() -> tuple[int, int, int]:
            with pool.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
                row = cur.execute(
                    sql.SQL(
                        "SELECT (SELECT count(*) FROM {s}.graph_memories), (SELECT count(*) FROM {s}.graph_entities),"
                        " (SELECT count(*) FROM {s}.graph_edges)"
                    ).format(s=sql.Identifier(schema))
                ).fetchone()
            assert row is not None
            return int(row[0]), int(row[1]), int(row[2])

        yield Ctx(sql_store, prefix, sql_counts)
        sql_store.close()
        with pool.connection() as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        return

    settings: Neo4jSettings = request.getfixturevalue("graph_neo4j_settings")
    store = neo4j_graph(settings)
    assert settings.password is not None
    driver = neo4j.GraphDatabase.driver(settings.uri, auth=("neo4j", settings.password.get_secret_value()))
    context = Ctx(store, prefix, None)

    def neo_counts() -> tuple[int, int, int]:
        ids = [str(i) for i in context.ids]
        recs, _, _ = driver.execute_query(
            "CALL () { MATCH (m:Memory) WHERE m.id IN $ids AND m.agent_id IS NOT NULL RETURN count(m) AS m }"
            " CALL () { MATCH (e:Entity) WHERE e.key STARTS WITH $p RETURN count(e) AS e }"
            " CALL () { MATCH ()-[r]->() WHERE r.origin IN $ids RETURN count(r) AS r }"
            " RETURN m, e, r",
            ids=ids,
            p=prefix,
        )
        return int(recs[0]["m"]), int(recs[0]["e"]), int(recs[0]["r"])

    context.raw_counts = neo_counts
    yield context
    store.close()
    driver.execute_query(
        "MATCH (n) WHERE n.key STARTS WITH $p OR n.agent_id STARTS WITH $p OR n.id IN $ids DETACH DELETE n",
        p=prefix,
        ids=[str(i) for i in context.ids],
    )
    driver.close()


# ------------------------------------------------------------------------------------------------
# The hand-made graph
# ------------------------------------------------------------------------------------------------


def ent(agent: str, type_: str, name: str) -> GraphEntity:
    return GraphEntity(key=entity_key(agent, type_, name), type=type_, name=name)


def mem(
    mid: uuid.UUID,
    agent: str,
    entities: Sequence[GraphEntity],
    mentions: Sequence[GraphEntity],
    edges: Sequence[GraphEdge] = (),
    deleted: bool = False,
    created_at: datetime = datetime(2026, 11, 29, 10, 0, tzinfo=UTC),
) -> GraphMemory:
    return GraphMemory(
        id=mid,
        agent_id=agent,
        created_at=created_at,
        deleted=deleted,
        entities=list(entities),
        mentions=[e.key for e in mentions],
        edges=list(edges),
    )


@dataclass
class World:
    a: str
    b: str
    m: list[uuid.UUID]  # m[1]..m[6] in agent a (m[0] unused), sorted ids
    mb: uuid.UUID  # agent b's memory
    alice: GraphEntity
    bob: GraphEntity
    projx: GraphEntity
    carol: GraphEntity
    doc: GraphEntity
    alice_b: GraphEntity
    items: list[GraphMemory]


def build_world(c: Ctx) -> World:
    """Agent a::

        m1 -MENTIONS-> Alice -AUTHORED-> m1          (declared by m1)
        m2 -MENTIONS-> Bob;  Alice -KNOWS-> Bob       (m2);  Alice -KNOWS-> Alice@b (m2, cross-agent)
        m3 -MENTIONS-> ProjX; Bob -WORKS_ON-> ProjX   (m3)
        m4 -MENTIONS-> Carol; Carol -WORKS_ON-> ProjX, Bob -WORKS_ON-> ProjX (m4: shared with m3)
        m5 -MENTIONS-> Doc;  Doc -PART_OF-> ProjX, m5 -REFERENCES-> m1   (m5)
        m6 (soft-deleted) -MENTIONS-> Alice

    Agent b: Alice@b (same name as a's Alice), Bob@b; mb -MENTIONS-> Alice@b; Alice@b -KNOWS-> Bob@b.
    """
    a, b = c.agent("a"), c.agent("b")
    ids = c.new_ids(7)
    (mb,) = c.new_ids(1)
    alice, bob, projx = ent(a, "User", "Alice"), ent(a, "User", "Bob"), ent(a, "Project", "ProjX")
    carol, doc = ent(a, "User", "Carol"), ent(a, "Document", "Doc")
    alice_b, bob_b = ent(b, "User", "Alice"), ent(b, "User", "Bob")
    m = ids
    items = [
        mem(m[1], a, [alice], [alice], [GraphEdge(alice.key, "AUTHORED", m[1])]),
        mem(
            m[2],
            a,
            [alice, bob],
            [bob],
            [GraphEdge(alice.key, "KNOWS", bob.key), GraphEdge(alice.key, "KNOWS", alice_b.key)],
        ),
        mem(m[3], a, [bob, projx], [projx], [GraphEdge(bob.key, "WORKS_ON", projx.key)]),
        mem(
            m[4],
            a,
            [carol, bob, projx],
            [carol],
            [GraphEdge(carol.key, "works_on", projx.key), GraphEdge(bob.key, "WORKS_ON", projx.key)],
        ),
        mem(
            m[5],
            a,
            [doc, projx],
            [doc],
            [GraphEdge(doc.key, "PART_OF", projx.key), GraphEdge(m[5], "REFERENCES", str(m[1]))],
        ),
        mem(m[6], a, [alice], [alice], deleted=True),
        mem(mb, b, [alice_b, bob_b], [alice_b], [GraphEdge(alice_b.key, "KNOWS", bob_b.key)]),
    ]
    c.store.upsert_memories(items)
    return World(a, b, m, mb, alice, bob, projx, carol, doc, alice_b, items)


def trav(w: World, start: GraphEntity, *, agent: str | None = "a", **kw: Any) -> GraphTraversal:
    return GraphTraversal(agent_id={"a": w.a, "b": w.b}.get(agent or "", None), start_key=start.key, **kw)


# ------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------


def test_protocol_and_names(ctx: Ctx) -> None:
    assert isinstance(ctx.store, GraphStore)
    if isinstance(ctx.store, Neo4jGraphStore):
        assert (ctx.store.name, ctx.store.engine) == ("neo4j", "neo4j")
    else:
        assert (ctx.store.name, getattr(ctx.store, "engine", None)) == ("graph", "postgres-sql")
    info = ctx.store.ping()
    assert info["engine"] in ("neo4j", "postgres-sql") and info["version"]
    if info["engine"] == "neo4j":
        assert info["edition"] == "community" and info["version"].startswith("5.26")
        assert info["name"] == "Neo4j Kernel"
    # ping reads the live store, not constants: its counts follow this test's writes exactly
    w = build_world(ctx)
    after = ctx.store.ping()
    memories, entities, _ = ctx.raw_counts()
    assert memories > 0 and entities > 0
    assert (after["memories"] - info["memories"], after["entities"] - info["entities"]) == (memories, entities)
    ctx.store.ensure_schema()  # idempotent: nothing dropped or rebuilt, the graph still answers
    assert ctx.raw_counts()[:2] == (memories, entities) and ctx.store.ping()["memories"] == after["memories"]
    assert ctx.store.traverse(trav(w, w.alice, hops=1, relation_types=["KNOWS"], direction="out"))


def test_hops_along_typed_relations(ctx: Ctx) -> None:
    w = build_world(ctx)
    m, s = w.m, ctx.store
    kw: dict[str, Any] = {"relation_types": ["KNOWS", "WORKS_ON"], "direction": "out"}
    assert s.traverse(trav(w, w.alice, hops=1, **kw)) == [m[1], m[2]]
    assert s.traverse(trav(w, w.alice, hops=2, **kw)) == [m[1], m[2], m[3]]
    assert s.traverse(trav(w, w.alice, hops=3, **kw)) == [m[1], m[2], m[3]]
    kw["direction"] = "both"
    assert s.traverse(trav(w, w.alice, hops=2, **kw)) == [m[1], m[2], m[3]]
    assert s.traverse(trav(w, w.alice, hops=3, **kw)) == [m[1], m[2], m[3], m[4]]
    assert s.traverse(trav(w, w.alice, hops=3, limit=2, **kw)) == [m[1], m[2]]


def test_direction(ctx: Ctx) -> None:
    w = build_world(ctx)
    m, s = w.m, ctx.store
    works: dict[str, Any] = {"relation_types": ["WORKS_ON"], "hops": 1}
    # Into ProjX: Bob and Carol work on it. ProjX's own mentioner is one step away, theirs two.
    assert s.traverse(trav(w, w.projx, direction="in", **works)) == [m[3], m[2], m[4]]
    assert s.traverse(trav(w, w.projx, direction="out", **works)) == [m[3]]
    assert s.traverse(trav(w, w.projx, direction="both", **works)) == [m[3], m[2], m[4]]
    # Bob -WORKS_ON-> ProjX: out from Bob reaches it, in does not.
    assert s.traverse(trav(w, w.bob, direction="out", **works)) == [m[2], m[3]]
    assert s.traverse(trav(w, w.bob, direction="in", **works)) == [m[2]]


def test_any_type_walks_through_memories_and_mentions(ctx: Ctx) -> None:
    w = build_world(ctx)
    m, s = w.m, ctx.store
    # Every whitelisted type (MENTIONS and memory->memory edges included); m6 is deleted.
    assert s.traverse(trav(w, w.alice, hops=1, direction="out")) == [m[1], m[2]]
    assert s.traverse(trav(w, w.alice, hops=1)) == [m[1], m[2]]
    assert s.traverse(trav(w, w.alice, hops=2)) == [m[1], m[2], m[5], m[3]]


def test_relation_type_restriction(ctx: Ctx) -> None:
    w = build_world(ctx)
    m, s = w.m, ctx.store
    assert s.traverse(trav(w, w.alice, relation_types=["AUTHORED"], hops=3, direction="out")) == [m[1]]
    assert s.traverse(trav(w, w.alice, relation_types=["REFERENCES"], hops=3)) == [m[1]]
    assert s.traverse(trav(w, w.alice, relation_types=["authored", "REFERENCES"], hops=2)) == [m[1], m[5]]
    assert s.traverse(trav(w, w.doc, relation_types=["PART_OF"], hops=1, direction="out")) == [m[5], m[3]]


def test_agent_isolation(ctx: Ctx) -> None:
    w = build_world(ctx)
    m, s = w.m, ctx.store
    assert w.alice.key != w.alice_b.key
    # a's traversal never steps onto b's Alice, although m2 declares a cross-agent KNOWS edge.
    knows: dict[str, Any] = {"relation_types": ["KNOWS"], "hops": 2, "direction": "out"}
    assert s.traverse(trav(w, w.alice, **knows)) == [m[1], m[2]]
    assert s.traverse(trav(w, w.alice_b, agent="b", **knows)) == [w.mb]
    # Starting from another agent's entity finds nothing.
    assert s.traverse(trav(w, w.alice, agent="b", **knows)) == []
    assert s.traverse(trav(w, w.alice_b, agent="a", **knows)) == []
    # An operator query (no agent) follows the cross-agent edge.
    assert s.traverse(trav(w, w.alice, agent=None, **knows)) == [m[1], *sorted([m[2], w.mb])]
    assert s.count(agent_id=w.a) == 6 and s.count(agent_id=w.b) == 1


def test_soft_deleted_memories_are_neither_results_nor_bridges(ctx: Ctx) -> None:
    w = build_world(ctx)
    m, s = w.m, ctx.store
    assert m[6] not in s.traverse(trav(w, w.alice, hops=3))
    s.set_deleted([m[1]])
    # m5 was reachable only through m1 (REFERENCES); ProjX's mentioner m3 is 3 steps away.
    assert s.traverse(trav(w, w.alice, hops=2)) == [m[2], m[3]]
    assert {r.id: r.deleted for page in s.scroll(agent_id=w.a) for r in page}[m[1]] is True
    s.set_deleted([m[1]], deleted=False)
    assert s.traverse(trav(w, w.alice, hops=2)) == [m[1], m[2], m[5], m[3]]


def test_connected_is_traverse_restricted_to_candidates(ctx: Ctx) -> None:
    """``connected`` answers "which of these are reachable" exactly as ``traverse`` would."""
    w = build_world(ctx)
    m, s = w.m, ctx.store
    everyone = [*m[1:], w.mb, uuid.uuid4()]  # plus an id no store has
    cases = [
        trav(w, w.alice, hops=1),
        trav(w, w.alice, hops=2),
        trav(w, w.alice, hops=3, relation_types=["KNOWS", "WORKS_ON"], direction="out"),
        trav(w, w.projx, relation_types=["WORKS_ON"], direction="in"),
        trav(w, w.alice, relation_types=["authored", "REFERENCES"], hops=2),
        trav(w, w.alice_b, agent="b", relation_types=["KNOWS"], hops=2),
        trav(w, w.alice, agent="b", hops=2),  # another agent's start: nothing
        trav(w, w.alice, agent=None, relation_types=["KNOWS"], hops=2, direction="out"),
    ]
    for q in cases:
        reached = set(s.traverse(q))
        assert s.connected(q, everyone) == reached, q
        assert s.connected(q, everyone[::2]) == reached & set(everyone[::2]), q
        near = s.near_entities(q)  # fetched ahead by the engine; the same answer with it
        assert near is None or q.hops == 1
        assert s.connected(q, everyone, near=near) == reached, q
    assert s.connected(cases[0], []) == set()
    assert m[6] not in s.connected(trav(w, w.alice, hops=3), [m[6]])  # soft-deleted
    s.set_deleted([m[1]])
    assert s.connected(trav(w, w.alice, hops=2), everyone) == {m[2], m[3]}  # m1 is no bridge to m5 now
    with pytest.raises(InputError):
        s.connected(cases[0], ["not-a-uuid"])  # type: ignore[list-item]


def test_fanout_estimates_from_degrees(ctx: Ctx) -> None:
    w = build_world(ctx)
    s = ctx.store
    # Alice: AUTHORED m1, KNOWS Bob, KNOWS Alice@b, mentioned by m1 and m6: the larger count wins.
    assert s.fanout(trav(w, w.alice, relation_types=["AUTHORED"], direction="out")) == 2  # mentions (2) > 1
    assert s.fanout(trav(w, w.alice)) == 5  # every type, both directions: 1 + 2 + 2 MENTIONS
    assert s.fanout(trav(w, w.projx, relation_types=["WORKS_ON"], direction="in")) == 3  # Bob twice, Carol
    assert s.fanout(trav(w, w.alice, agent="b")) == 0  # not this agent's entity
    assert s.fanout(GraphTraversal(agent_id=w.a, start_key="nobody")) == 0


def test_upsert_is_idempotent(ctx: Ctx) -> None:
    w = build_world(ctx)
    s = ctx.store
    before = ctx.raw_counts()
    rels_before = s.relationships(w.m[1:])
    assert before == (7, 7, 16)  # 7 memories; 5 + 2 entities; 7 MENTIONS + 9 declared edges
    s.upsert_memories(w.items)
    s.upsert_memories(w.items[2:4])
    assert ctx.raw_counts() == before
    assert s.relationships(w.m[1:]) == rels_before
    assert s.count(agent_id=w.a) == 6


def test_reupsert_replaces_declared_edges(ctx: Ctx) -> None:
    w = build_world(ctx)
    m, s = w.m, ctx.store
    knows: dict[str, Any] = {"relation_types": ["KNOWS"], "hops": 1, "direction": "out"}
    assert s.traverse(trav(w, w.alice, **knows)) == [m[1], m[2]]
    # m2 now says Alice RELATES_TO Carol instead of knowing Bob.
    s.upsert_memories(
        [mem(m[2], w.a, [w.alice, w.bob, w.carol], [w.bob], [GraphEdge(w.alice.key, "RELATES_TO", w.carol.key)])]
    )
    assert s.traverse(trav(w, w.alice, **knows)) == [m[1]]
    assert s.traverse(trav(w, w.alice, relation_types=["RELATES_TO"], hops=1)) == [m[1], m[4]]
    assert ctx.raw_counts() == (7, 7, 15)  # two KNOWS gone, one RELATES_TO added
    # An edge declared by two memories survives the deletion of one of them.
    s.delete([m[3]])
    assert s.traverse(trav(w, w.projx, relation_types=["WORKS_ON"], hops=1, direction="in")) == [m[2], m[4]]


def test_open_relation_types_on_both_engines(ctx: Ctx) -> None:
    """Any identifier of the documented shape is a type: written, traversed, and (a remote edge of a
    type never seen before, so Neo4j creates its origin index on first use) replaced on re-upsert.
    ``MATCH`` is a Cypher keyword: backquoted, it is still just a name."""
    a = ctx.agent("o")
    said_id, remote_id = ctx.new_ids(2)
    ann, bob, party = ent(a, "Speaker", "Ann"), ent(a, "Speaker", "Bob"), ent(a, "Event", "Party")
    kind = f"ATTENDED_{uuid.uuid4().hex[:6].upper()}"  # new to this server: no index exists yet
    s = ctx.store
    s.upsert_memories(
        [
            mem(said_id, a, [ann], [], [GraphEdge(ann.key, "said", said_id)]),
            mem(
                remote_id,
                a,
                [ann, bob, party],
                [],
                [GraphEdge(bob.key, kind, party.key), GraphEdge(ann.key, "MATCH", bob.key)],
            ),
        ]
    )
    assert s.traverse(GraphTraversal(a, ann.key, ("SAID",), 1, "out")) == [said_id]
    assert s.traverse(GraphTraversal(a, party.key, (kind,), 1, "in")) == []  # Bob has no memory yet
    assert s.traverse(GraphTraversal(a, ann.key, ("MATCH", kind), 2, "out")) == []
    assert s.traverse(GraphTraversal(a, ann.key, (), 1, "out")) == [said_id]  # no types: any type
    rels = s.relationships([said_id])[said_id]
    assert [(r["type"], r["direction"]) for r in rels] == [("SAID", "in")]
    # Re-declaring the remote edges without the custom type drops exactly that edge.
    s.upsert_memories([mem(remote_id, a, [ann, bob], [], [GraphEdge(ann.key, "MATCH", bob.key)])])
    assert ctx.raw_counts() == (2, 2, 2)


def test_relationships(ctx: Ctx) -> None:
    w = build_world(ctx)
    m, s = w.m, ctx.store
    rels = s.relationships([m[1], m[5], m[6], uuid.UUID(int=0)])
    assert rels[uuid.UUID(int=0)] == []
    alice = {"kind": "entity", "key": w.alice.key, "type": "User", "name": "Alice"}
    doc = {"kind": "entity", "key": w.doc.key, "type": "Document", "name": "Doc"}
    assert rels[m[1]] == [
        {"type": "AUTHORED", "direction": "in", "node": alice},
        {"type": "MENTIONS", "direction": "out", "node": alice},
        {"type": "REFERENCES", "direction": "in", "node": {"kind": "memory", "id": str(m[5])}},
    ]
    assert rels[m[5]] == [
        {"type": "MENTIONS", "direction": "out", "node": doc},
        {"type": "REFERENCES", "direction": "out", "node": {"kind": "memory", "id": str(m[1])}},
    ]
    assert rels[m[6]] == [{"type": "MENTIONS", "direction": "out", "node": alice}]


def test_a_memory_edge_to_itself_is_listed_once(ctx: Ctx) -> None:
    """m -RELATES_TO-> m is one edge: both stores list it once, as ``out`` (the SQL graph listed it
    ``in`` as well), and it does not make m its own neighbour in a traversal from an entity."""
    a = ctx.agent("self")
    (mid,) = ctx.new_ids(1)
    ann = ent(a, "Speaker", "Ann")
    s = ctx.store
    s.upsert_memories([mem(mid, a, [ann], [ann], [GraphEdge(mid, "RELATES_TO", str(mid))])])
    assert s.relationships([mid])[mid] == [
        {
            "type": "MENTIONS",
            "direction": "out",
            "node": {"kind": "entity", "key": ann.key, "type": "Speaker", "name": "Ann"},
        },
        {"type": "RELATES_TO", "direction": "out", "node": {"kind": "memory", "id": str(mid)}},
    ]
    assert s.traverse(GraphTraversal(a, ann.key, (), 2, "both")) == [mid]


def test_scroll_pages_and_count(ctx: Ctx) -> None:
    w = build_world(ctx)
    s = ctx.store
    pages = list(s.scroll(agent_id=w.a, batch=4))
    assert [len(p) for p in pages] == [4, 2]
    records = [r for p in pages for r in p]
    assert [r.id for r in records] == sorted(w.m[1:])
    assert {r.agent_id for r in records} == {w.a}
    assert [r.id for r in records if r.deleted] == [w.m[6]]
    assert [len(p) for p in s.scroll(agent_id=w.a, batch=3)] == [3, 3]
    assert [[r.id for r in p] for p in s.scroll(agent_id=w.b)] == [[w.mb]]
    assert list(s.scroll(agent_id=ctx.agent("nobody"))) == []
    assert s.count(agent_id=w.a) == 6 and s.count(agent_id=ctx.agent("nobody")) == 0
    assert s.count() >= 7


def test_delete_purges_memory_edges_and_orphan_entities(ctx: Ctx) -> None:
    w = build_world(ctx)
    m, s = w.m, ctx.store
    s.delete([m[4]])  # Carol: mentioned only by m4, and her only edge was declared by m4
    assert ctx.raw_counts() == (6, 6, 13)
    assert s.traverse(trav(w, w.carol, hops=3)) == []
    assert s.count(agent_id=w.a) == 5
    # Bob -WORKS_ON-> ProjX is still declared by m3.
    assert s.traverse(trav(w, w.projx, relation_types=["WORKS_ON"], hops=1, direction="in")) == [m[3], m[2]]
    s.delete([m[1]])  # REFERENCES from m5 goes with the node; Alice stays (m2's edges, m6's mention)
    assert s.relationships([m[5]])[m[5]] == [
        {
            "type": "MENTIONS",
            "direction": "out",
            "node": {"kind": "entity", "key": w.doc.key, "type": "Document", "name": "Doc"},
        }
    ]
    assert ctx.raw_counts() == (5, 6, 10)
    s.delete([m[2], m[6], m[3], m[5]])
    assert ctx.raw_counts() == (1, 2, 2)  # agent b's memory, its two entities, its two edges
    s.delete([w.mb, uuid.uuid4()])
    assert ctx.raw_counts() == (0, 0, 0)


def test_hostile_names_are_data(ctx: Ctx) -> None:
    a = ctx.agent("h")
    ents = [ent(a, "Thing", name) for name in HOSTILE_NAMES]
    (mid, other) = ctx.new_ids(2)
    hub = ent(a, "Thing", "hub")
    ctx.store.upsert_memories(
        [
            mem(mid, a, [*ents, hub], ents, [GraphEdge(e.key, "RELATES_TO", hub.key) for e in ents]),
            mem(other, a, [hub], [hub]),
        ]
    )
    rels = ctx.store.relationships([mid])[mid]
    names = sorted(r["node"]["name"] for r in rels)
    assert names == sorted(HOSTILE_NAMES)
    assert {r["node"]["key"] for r in rels} == {e.key for e in ents}
    for e in ents:
        assert ctx.store.traverse(GraphTraversal(agent_id=a, start_key=e.key, relation_types=["RELATES_TO"])) == [
            mid,
            other,
        ]
    # Hostile start keys are just keys that do not exist.
    for name in HOSTILE_NAMES:
        assert ctx.store.traverse(GraphTraversal(agent_id=a, start_key=name, hops=3)) == []
    assert ctx.raw_counts() == (2, len(ents) + 1, 2 * len(ents) + 1)


@pytest.mark.parametrize(
    "bad",
    [
        {"relation_types": ["KNOWS]->() DETACH DELETE n //"]},
        {"relation_types": ["FOLLOWS-"]},
        {"relation_types": ["2HOPS"]},
        {"relation_types": ["KNOWS`|`X"]},
        {"relation_types": "KNOWS"},
        {"hops": 0},
        {"hops": 4},
        {"hops": "2"},
        {"hops": True},
        {"hops": 2.0},
        {"direction": "sideways"},
        {"limit": 0},
        {"agent_id": "bad agent'; --"},
        {"start_key": ""},
    ],
)
def test_invalid_traversals_refused_before_the_store(ctx: Ctx, bad: dict[str, Any]) -> None:
    w = build_world(ctx)
    before = ctx.raw_counts()
    args: dict[str, Any] = {"agent_id": w.a, "start_key": w.alice.key, **bad}
    with pytest.raises(InputError):
        ctx.store.traverse(GraphTraversal(**args))
    assert ctx.raw_counts() == before


def test_malformed_relation_type_refused_and_nothing_written(ctx: Ctx) -> None:
    a = ctx.agent("x")
    x, y = ent(a, "User", "X"), ent(a, "User", "Y")
    good, bad = ctx.new_ids(2)
    for rel_type in ["KNOWS]->(n) DETACH DELETE n //", "EVIL`]->()", "", "KNOWS|MENTIONS", "1ST", "ÜBER"]:
        with pytest.raises(InputError):
            ctx.store.upsert_memories(
                [mem(good, a, [x, y], [x]), mem(bad, a, [x, y], [x], [GraphEdge(x.key, rel_type, y.key)])]
            )
        assert ctx.raw_counts() == (0, 0, 0)
    with pytest.raises(InputError):
        ctx.store.upsert_memories([mem(good, "bad agent!", [x], [x])])
    with pytest.raises(InputError):
        ctx.store.upsert_memories([mem(good, a, [GraphEntity(x.key, "Bad Type", "X")], [x])])
    assert ctx.raw_counts() == (0, 0, 0)


# ------------------------------------------------------------------------------------------------
# Neo4j only: read-only power-user Cypher, error mapping
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def neo(graph_neo4j_settings: Neo4jSettings) -> Iterator[ReadOnlyCypher]:
    store = neo4j_graph(graph_neo4j_settings)
    yield ReadOnlyCypher(store.backend)
    store.close()


@pytest.mark.parametrize(
    "cypher",
    [
        "CREATE (n:Intruder) RETURN n",
        "MERGE (n:Intruder {x: 1}) RETURN n",
        "MATCH (n:Memory) WHERE n.agent_id = $agent_id DETACH DELETE n",
        "MATCH (n:Memory) WHERE n.agent_id = $agent_id SET n.deleted = true",
        "MATCH (n:Memory) WHERE n.agent_id = $agent_id REMOVE n.deleted",
        "CALL db.createLabel('Intruder')",
        "CREATE INDEX intruder IF NOT EXISTS FOR (n:Intruder) ON (n.x)",
    ],
)
def test_run_read_refuses_writes(neo: ReadOnlyCypher, cypher: str) -> None:
    with pytest.raises(UsageError, match="read-only transaction"):
        neo.run_read(cypher, agent_id="agent1" if "$agent_id" in cypher else None)


@pytest.mark.parametrize(
    "cypher",
    [
        "CALL dbms.killConnections(['bolt-1'])",
        "CALL dbms.listConfig() YIELD name RETURN name",
        "CALL dbms.listConnections() YIELD connectionId RETURN connectionId",
        "CALL `dbms`.`listConfig`() YIELD name RETURN name",
        "CALL db.clearQueryCaches()",
        "LOAD CSV FROM 'file:///etc/passwd' AS line RETURN line",
        "load   csv from 'http://127.0.0.1:1/' AS line RETURN line",
    ],
)
def test_run_read_refuses_dbms_procedures_and_load_csv(neo: ReadOnlyCypher, cypher: str) -> None:
    with pytest.raises(UsageError, match="not allowed in read-only queries"):
        neo.run_read(cypher)


@pytest.mark.parametrize("ctx", ["neo4j"], indirect=True)
def test_run_read_reads_and_scopes(ctx: Ctx) -> None:
    assert isinstance(ctx.store, Neo4jGraphStore)  # the SQL store deliberately offers no raw queries
    w = build_world(ctx)
    reader = ReadOnlyCypher(ctx.store.backend)
    rows = reader.run_read(
        "MATCH (m:Memory)-[:MENTIONS]->(e:Entity) WHERE m.agent_id = $agent_id AND e.name = $name"
        " RETURN m.id AS id, m.created_at AS created, e ORDER BY id",
        {"name": "Alice"},
        agent_id=w.a,
    )
    assert [r["id"] for r in rows] == [str(w.m[1]), str(w.m[6])]
    assert rows[0]["created"] == datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    assert rows[0]["e"]["labels"] == ["Entity"] and rows[0]["e"]["name"] == "Alice"
    assert len(reader.run_read("UNWIND range(1, 50) AS i RETURN i", limit=7)) == 7
    assert reader.run_read("CALL dbms.components() YIELD edition RETURN edition") == [{"edition": "community"}]
    with pytest.raises(UsageError, match=r"\$agent_id"):
        reader.run_read("MATCH (m:Memory) RETURN m.id", agent_id=w.a)
    with pytest.raises(UsageError, match="Cypher rejected"):
        reader.run_read("MATCH (m:Memory RETURN m")


def test_neo4j_unreachable_is_store_unavailable() -> None:
    store = neo4j_graph(Neo4jSettings(uri="bolt://127.0.0.1:1", password=SecretStr("x"), timeout_s=1.0))
    try:
        with pytest.raises(StoreUnavailable) as info:
            store.count()
        assert info.value.store == "neo4j" and info.value.hint
        with pytest.raises(StoreUnavailable):
            store.traverse(GraphTraversal(agent_id="a", start_key="a/User:x"))
    finally:
        store.close()


def test_neo4j_wrong_password_is_store_error_not_unavailable(graph_neo4j_settings: Neo4jSettings) -> None:
    settings = graph_neo4j_settings.model_copy(update={"password": SecretStr("definitely-wrong")})
    store = neo4j_graph(settings)
    try:
        with pytest.raises(StoreError) as info:
            store.count()
        assert not isinstance(info.value, StoreUnavailable)
        assert "authentication" in str(info.value)
    finally:
        store.close()


def test_neo4j_transaction_timeout_is_store_unavailable(graph_neo4j_settings: Neo4jSettings) -> None:
    store = neo4j_graph(graph_neo4j_settings.model_copy(update={"timeout_s": 1.0}))
    try:
        with pytest.raises(StoreUnavailable, match="timed out"):
            ReadOnlyCypher(store.backend).run_read(
                "UNWIND range(1, 1000000000) AS i WITH i WHERE i < 0 RETURN count(i) AS c"
            )
    finally:
        store.close()


def test_sql_unreachable_is_store_unavailable() -> None:
    pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
        "postgresql://postgres@127.0.0.1:1/postgres", min_size=0, max_size=1, open=True, kwargs={"connect_timeout": 1}
    )
    try:
        store = SqlGraphStore(pool, timeout_s=1.0)
        with pytest.raises(StoreUnavailable) as info:
            store.count()
        assert info.value.store == "graph"
    finally:
        pool.close()


def test_sql_statement_timeout_is_store_unavailable(graph_pg_pool: psycopg_pool.ConnectionPool[Any]) -> None:
    store = SqlGraphStore(graph_pg_pool, timeout_s=0.2)
    with pytest.raises(StoreUnavailable, match="timed out"):
        store.backend._run(lambda cur: cur.execute("SELECT pg_sleep(2)"))


# ------------------------------------------------------------------------------------------------
# Both engines on the same random graphs: identical answers
# ------------------------------------------------------------------------------------------------


def test_newest_first_of_a_hub_entity(ctx: Ctx) -> None:
    """An entity many memories mention, asked newest first with a limit (the console's entity
    search): the first ``limit`` of the whole answer, ties in time broken by id, deleted memories and
    a MENTIONS a memory declared for another included as the full traversal has them."""
    a = ctx.agent("a")
    hub, other = ent(a, "User", "Hub"), ent(a, "User", "Other")
    ids = ctx.new_ids(40)
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    # Two memories at each time (ties broken by id); the newest two are deleted.
    when = {m: t0 + timedelta(minutes=i - i % 2) for i, m in enumerate(ids)}
    items = [mem(m, a, [hub], [hub], deleted=i >= 38, created_at=when[m]) for i, m in enumerate(ids) if i != 5]
    # ids[5] is mentioned by ids[0]'s declaration (not its own) and is newer than any live memory.
    when[ids[5]] = t0 + timedelta(days=1)
    items.append(mem(ids[5], a, [other], [other], created_at=when[ids[5]]))
    items[0] = mem(ids[0], a, [hub, other], [hub], [GraphEdge(ids[5], "MENTIONS", hub.key)], created_at=when[ids[0]])
    ctx.store.upsert_memories(items)
    full = ctx.store.traverse(GraphTraversal(agent_id=a, start_key=hub.key, hops=1))
    assert len(full) == 38 and ids[5] in full
    live = sorted(full, key=lambda i: (-when[i].timestamp(), str(i)))
    for limit in (1, 3, 10, 50):
        q = GraphTraversal(agent_id=a, start_key=hub.key, hops=1, newest_first=True, limit=limit)
        assert ctx.store.traverse(q) == live[:limit], limit
    assert live[0] == ids[5]


def test_graph_from_before_src_created_at_is_filled_on_open(graph_pg_pool: psycopg_pool.ConnectionPool[Any]) -> None:
    """A graph written before graph_edges.src_created_at: the next ensure_schema adds and fills it,
    and newest-first traversals read the mentions in time order from then on."""
    schema = f"gtest_{uuid.uuid4().hex[:12]}"
    store = SqlGraphStore(graph_pg_pool, schema=schema, timeout_s=HANG_GUARD_S)
    try:
        store.ensure_schema()
        hub = ent("old", "User", "Hub")
        ids = sorted(uuid.uuid4() for _ in range(6))
        t0 = datetime(2026, 3, 1, tzinfo=UTC)
        store.upsert_memories(
            [mem(m, "old", [hub], [hub], created_at=t0 - timedelta(hours=i)) for i, m in enumerate(ids)]
        )
        with graph_pg_pool.connection() as conn:
            conn.execute(
                sql.SQL("ALTER TABLE {}.graph_edges DROP COLUMN src_created_at").format(sql.Identifier(schema))
            )
        store.ensure_schema()
        store.ensure_schema()  # once: the second finds the column and leaves it
        with graph_pg_pool.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            row = cur.execute(
                sql.SQL("SELECT count(*), count(src_created_at) FROM {}.graph_edges").format(sql.Identifier(schema))
            ).fetchone()
        assert row == (6, 6)
        q = GraphTraversal(agent_id="old", start_key=hub.key, hops=1, newest_first=True, limit=2)
        assert store.traverse(q) == ids[:2]
    finally:
        store.close()
        with graph_pg_pool.connection() as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_graphs_same_answers_on_both_engines(
    graph_pg_pool: psycopg_pool.ConnectionPool[Any], graph_neo4j_settings: Neo4jSettings, seed: int
) -> None:
    import random

    rnd = random.Random(seed)
    prefix = f"r{uuid.uuid4().hex[:10]}-"
    agents = [f"{prefix}a", f"{prefix}b"]
    types = ["KNOWS", "WORKS_ON", "REFERENCES", "PART_OF"]
    ents = {a: [ent(a, "Thing", f"e{i}") for i in range(12)] for a in agents}
    mids = sorted(uuid.uuid4() for _ in range(40))
    owner = {m: agents[0] if i % 4 else agents[1] for i, m in enumerate(mids)}
    items = []
    for m in mids:
        a = owner[m]
        mentions = rnd.sample(ents[a], rnd.randint(0, 2))
        edges = []
        for _ in range(rnd.randint(0, 3)):
            # Mostly within the agent; sometimes to another agent's entity or to another memory.
            pool_a = ents[a] if rnd.random() < 0.85 else ents[rnd.choice(agents)]
            src: str | uuid.UUID = rnd.choice(pool_a).key if rnd.random() < 0.7 else rnd.choice(mids)
            dst: str | uuid.UUID = rnd.choice(pool_a).key if rnd.random() < 0.7 else m
            edges.append(GraphEdge(src, rnd.choice(types), dst))
        touched = {e.key: e for e in mentions}
        for e in ents[a] + ents[agents[0]] + ents[agents[1]]:
            if any(e.key in (str(x.source), str(x.target)) for x in edges):
                touched[e.key] = e
        when = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=rnd.randint(0, 24 * 60))
        items.append(mem(m, a, list(touched.values()), mentions, edges, deleted=rnd.random() < 0.15, created_at=when))

    schema = f"gtest_{uuid.uuid4().hex[:12]}"
    sql_store = SqlGraphStore(graph_pg_pool, schema=schema, timeout_s=HANG_GUARD_S)
    neo_store = neo4j_graph(graph_neo4j_settings)
    try:
        sql_store.ensure_schema()
        for store in (sql_store, neo_store):
            store.upsert_memories(items[:20])
            store.upsert_memories(items[20:])
            store.delete(mids[:3])
        checked = 0
        for _ in range(40):
            start = rnd.choice(ents[rnd.choice(agents)])
            query = GraphTraversal(
                agent_id=rnd.choice([*agents, None, agents[0]]),
                start_key=start.key,
                relation_types=rnd.sample(types, rnd.randint(0, 3)),
                hops=rnd.randint(1, 3),
                direction=rnd.choice(["out", "in", "both"]),
            )
            got_sql, got_neo = sql_store.traverse(query), neo_store.traverse(query)
            if got_sql != got_neo:
                # Neo4j's single database is shared: say so when another test session wiped it.
                counts = {a: (sql_store.count(agent_id=a), neo_store.count(agent_id=a)) for a in agents}
                pytest.fail(f"{query}: sql {got_sql} != neo4j {got_neo}; (sql, neo4j) counts {counts}")
            # The vector-first plan's membership check must agree with the traversal, on any subset.
            subset = rnd.sample(mids, 15)
            assert neo_store.connected(query, subset) == set(got_neo) & set(subset), query
            near = neo_store.near_entities(query)
            assert neo_store.connected(query, subset, near=near) == set(got_neo) & set(subset), query
            assert sql_store.connected(query, subset) == set(got_sql) & set(subset), query
            assert neo_store.fanout(query) == sql_store.fanout(query), query
            # Graph-only queries: a time window and newest first, computed by the graph store.
            lo = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=rnd.randint(0, 30))
            windowed = dataclasses.replace(
                query, created_from=lo, created_to=lo + timedelta(days=rnd.randint(1, 40)), newest_first=True, limit=7
            )
            when = {it.id: it.created_at for it in items}
            expected = sorted(
                (i for i in got_sql if windowed.created_from <= when[i] < windowed.created_to),  # type: ignore[operator]
                key=lambda i: (-when[i].timestamp(), str(i)),
            )[:7]
            assert sql_store.traverse(windowed) == expected, windowed
            assert neo_store.traverse(windowed) == expected, windowed
            # Newest first with a limit below an entity's mentions: the SQL store reads only the
            # newest of each entity's mentions; the answer is still the full one's first.
            newest = dataclasses.replace(query, newest_first=True, limit=2)
            expected = sorted(got_sql, key=lambda i: (-when[i].timestamp(), str(i)))[:2]
            assert sql_store.traverse(newest) == expected, newest
            assert neo_store.traverse(newest) == expected, newest
            checked += bool(got_sql)
        assert checked >= 10  # the random queries did reach memories
        assert sql_store.relationships(mids) == neo_store.relationships(mids)
        for a in agents:
            assert [r for p in sql_store.scroll(agent_id=a) for r in p] == [
                r for p in neo_store.scroll(agent_id=a) for r in p
            ]
    finally:
        neo_store.delete(mids)
        neo_store.close()
        with graph_pg_pool.connection() as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
