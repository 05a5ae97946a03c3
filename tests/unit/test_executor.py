"""The executor over in-memory fakes of the store protocols (tests/unit/fakes.py).

What each plan shape asks of which store, in what order, what it answers, and how it degrades;
the same behaviour against the real stores is in tests/integration/test_query_engine.py.
"""

from __future__ import annotations

import dataclasses
import random
import socket
import threading
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from memoryctl.deadline import Call
from memoryctl.embed import Embedder, HttpEmbedder
from memoryctl.errors import StoreError, StoreUnavailable
from memoryctl.model import EntityRef, Memory
from memoryctl.query.calls import settled, settled_search
from memoryctl.query.engine import QueryEngine
from memoryctl.query.guard import Guard
from memoryctl.query.plan import PlanOptions
from memoryctl.query.results import QueryResult
from memoryctl.query.spec import GraphFilter, MemoryQuery, Where
from memoryctl.stores.protocols import VectorFilter, VectorHit
from tests.unit.fakes import (
    EMBEDDER,
    FakeGraph,
    FakeRecalls,
    FakeRelational,
    FakeRows,
    FakeVectors,
    World,
    cosine_rank,
)

NOW = datetime.now(UTC)
ALICE, BOB = EntityRef("User", "Alice"), EntityRef("User", "Bob")


def memory(text: str, *, who: EntityRef = ALICE, hours: float = 1, agent: str = "a", **kw: object) -> Memory:
    return Memory(
        text=text,
        agent_id=agent,
        created_at=NOW - timedelta(hours=hours),
        entities=[who],
        **kw,  # type: ignore[arg-type]
    )


class Stack:
    """The fakes an engine is built from, and the engine."""

    def __init__(
        self,
        world: World,
        *,
        graph: FakeGraph | None = None,
        vectors: FakeVectors | None = None,
        embedder: Embedder = EMBEDDER,
        guard: Guard | None = None,
        **options: int,
    ) -> None:
        self.world = world
        self.rows, self.relational = FakeRows(world), FakeRelational(world)
        self.vectors = vectors or FakeVectors(world)
        self.graph = graph or FakeGraph(world, cheap_membership=False)
        self.recalls = FakeRecalls()
        self.vectors_up = self.graph_up = True
        self.engine = QueryEngine(
            self.rows,
            self.relational,
            vectors=lambda: self.vectors if self.vectors_up else None,
            graph=lambda: self.graph if self.graph_up else None,
            embedder=lambda: embedder,
            guard=guard or Guard(timeout_s=5.0),
            unavailable={"qdrant": "refused", "neo4j": "refused"},
            recalls=self.recalls,
            options=PlanOptions(**options),
        )


@pytest.fixture
def world() -> World:
    w = World()
    w.add(
        memory("alice rollback of payments finished", hours=1, metadata={"sentiment": 0.5}),
        memory("alice started the rollback of payments", hours=3, metadata={"sentiment": -0.5}),
        memory("alice lunch is pizza", hours=2),
        memory("bob rollback of the database", who=BOB, hours=1),
        memory("alice rollback of payments finished", hours=1, agent="other"),
    )
    return w


def texts(result: object) -> list[str]:
    return [h.memory.text for h in result.hits]  # type: ignore[attr-defined]


def test_vector_plan_is_one_search_then_hydration(world: World) -> None:
    s = Stack(world)
    r = s.engine.run(MemoryQuery(text="rollback payments", agent_id="a", where=[Where.parse("sentiment < 0")]))
    assert texts(r) == ["alice started the rollback of payments"]
    # relationships are fetched from the graph while PostgreSQL hydrates
    # the lexical leg runs in PostgreSQL while the query is embedded and the vector store searched
    # (after the entity names it says are looked up, query/dense_question.py)
    assert [st.name for st in r.steps] == [
        "lexical.search",
        "postgres.names",
        "embed.query",
        "vector.search",
        "fuse",
        "postgres.context",
        "graph.relationships",
        "postgres.hydrate",
    ]
    (search,) = s.vectors.calls.args("search")
    assert search["filter"].agent_id == "a" and search["filter"].meta[0].key == "sentiment"
    # nothing pulled up from PostgreSQL first: its one call is the lexical leg, scoped the same way
    # (then the candidates' conversational context, query/turns.py)
    # (the lexical leg runs in a thread of its own: its call is recorded in either order)
    assert sorted(s.relational.calls.names()) == ["following", "lexical", "names_said"]
    (lexical,) = s.relational.calls.args("lexical")
    assert lexical["where"] == search_where(r) and lexical["ids"] is None
    assert r.plan == "vector+lexical(pushdown: agent, meta.sentiment <)" and r.degraded == []
    assert r.hits[0].sources == ["postgres", "qdrant"]


def search_where(r: QueryResult) -> list[Where]:
    return list(r.query.where)


def test_answers_match_brute_force(world: World) -> None:
    s = Stack(world)
    # each memory ranked alone: the dense leg's own order
    s.engine.options = dataclasses.replace(s.engine.options, context_turns=0)
    q = MemoryQuery(text="rollback of payments", agent_id="a", decay=False, retrieval="dense")
    assert [h.id for h in s.engine.run(q).hits] == cosine_rank(world, q)


def conversation(agent: str = "a") -> list[Memory]:
    """Six turns a minute apart: the talk, a reply, its topic (which names neither), then chatter."""
    lines = [
        ("my talk got accepted at kubecon", ALICE),
        ("amazing what is the subject", BOB),
        ("cutting build times in half", ALICE),
        ("lunch is pizza today", BOB),
        ("the printer jammed", ALICE),
        ("kubecon tickets are expensive", BOB),
    ]
    start = NOW - timedelta(days=1)
    return [
        Memory(text=t, agent_id=agent, created_at=start + timedelta(minutes=n), entities=[who])
        for n, (t, who) in enumerate(lines)
    ]


def test_a_turn_is_read_with_the_turns_before_it() -> None:
    world = World()
    turns = conversation()
    world.add(*turns)
    s = Stack(world)
    q = MemoryQuery(text="kubecon talk", agent_id="a", retrieval="lexical")
    r = s.engine.run(q)
    ranked = [h.memory.text for h in r.hits]
    # neither leg returns the topic: it joins as the talk's next turn, lifted by the talk
    assert "cutting build times in half" in ranked
    topic = next(h for h in r.hits if h.memory.text == "cutting build times in half")
    assert "lexical" not in topic.scores and topic.scores["context"] == topic.scores["relevance"]
    # the turn that gives the context stays ahead of the turns it lifts; a memory more than two
    # turns after any hit, which no leg returned, does not join
    assert ranked.index("my talk got accepted at kubecon") < ranked.index("cutting build times in half")
    assert "the printer jammed" not in ranked
    (following,) = s.relational.calls.args("following")
    assert following["turns"] == 2 and set(following["ids"]) == {turns[0].id, turns[5].id}
    # off: each memory ranked alone, nothing joins, no extra statement
    s.engine.options = dataclasses.replace(s.engine.options, context_turns=0)
    alone = s.engine.run(q)
    assert [h.memory.text for h in alone.hits] == [t for t in ranked if t in {turns[0].text, turns[5].text}]
    assert "postgres.context" not in [st.name for st in alone.steps]


def test_the_context_stays_in_the_query_scope() -> None:
    world = World()
    turns = conversation()
    world.add(*turns, *conversation("other"))
    s = Stack(world)
    # a time range that ends before the topic: the turn after the talk is out of scope
    until = turns[2].created_at
    r = s.engine.run(MemoryQuery(text="kubecon talk", agent_id="a", until=until, retrieval="lexical"))
    assert {h.memory.text for h in r.hits} <= {turns[0].text, turns[1].text}
    assert all(h.memory.agent_id == "a" for h in r.hits)
    # under a graph filter nothing joins (the neighbours were not checked against it): every hit
    # is one of the graph's memories (Bob's turns), which the context only reorders
    g = s.engine.run(MemoryQuery(text="kubecon subject", agent_id="a", graph=GraphFilter(BOB)))
    assert {h.memory.text for h in g.hits} == {turns[1].text, turns[3].text, turns[5].text}


def test_postgres_is_the_truth_at_hydration(world: World) -> None:
    gone = next(m for m in world.memories.values() if m.text == "alice lunch is pizza")
    gone.deleted_at = NOW
    s = Stack(world, vectors=FakeVectors(world, stale=[gone.id]))  # the vector store still has it
    r = s.engine.run(MemoryQuery(text="alice lunch pizza", agent_id="a", limit=10))
    scope = VectorFilter(agent_id="a")
    assert gone.id in {h.id for h in s.vectors.search(EMBEDDER.embed_query("pizza").tolist(), scope, 10, model_id="m")}
    assert gone.id not in {h.id for h in r.hits}
    assert all(h.memory.agent_id == "a" for h in r.hits)


def test_vector_store_down_falls_back_to_full_text(world: World) -> None:
    s = Stack(world)
    s.vectors.calls.fail["search"] = StoreUnavailable("qdrant", "no answer within 2.0s")
    r = s.engine.run(MemoryQuery(text="rollback payments", agent_id="a"))
    assert r.degraded == ["qdrant"] and any("lexical leg alone" in n for n in r.notes)
    assert texts(r)[:2] == ["alice rollback of payments finished", "alice started the rollback of payments"]
    failed = next(st for st in r.steps if st.name == "vector.search")
    assert failed.status == "failed" and "no answer" in (failed.error or "")
    assert [st.name for st in r.steps][-4:] == ["fuse", "postgres.context", "graph.relationships", "postgres.hydrate"]
    # every hit is the lexical leg's, or a turn written just after one of them that it lifted
    assert all(set(h.scores) & {"lexical", "context"} and "vector" not in h.scores for h in r.hits)
    dense = s.engine.run(MemoryQuery(text="rollback payments", agent_id="a", retrieval="dense"))
    assert dense.hits and "fallback.lexical" in [st.name for st in dense.steps]  # asked for now
    raw = s.engine.run(MemoryQuery(vector=EMBEDDER.embed_query("rollback").tolist(), agent_id="a"))
    assert raw.hits == [] and any("raw vector" in n for n in raw.notes)


class SilentServer:
    """A TCP server on loopback that accepts every connection and never answers (a lost GPU node
    whose kernel still takes the connection): it counts the connections it took."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="silent-server").start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            self.held.append(conn)

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


# Only for a query that hangs when the code under test is broken: generous, never a measure, and
# shorter than the http embedder's own 30 s timeout (its default), which the query must not wait out.
QUERY_HANG_GUARD_S = 20.0


def test_an_embedder_that_never_answers_costs_the_query_its_store_timeout(world: World, silent: SilentServer) -> None:
    """The question's embedding runs under the store timeout and breaker like a store call: the
    http embedder's own timeout and retries (30 s, 3 retries: about two minutes) are not waited
    out; the dense leg degrades to the lexical one, with the reason."""
    embedder = HttpEmbedder(silent.url, "silent-model", dim=64)  # the defaults: timeout 30 s, 3 retries
    s = Stack(world, embedder=embedder, guard=Guard(timeout_s=1.0, failures=1, reset_s=3600))
    try:
        query = Call(lambda: s.engine.run(MemoryQuery(text="rollback payments", agent_id="a")), name="query")
        assert query.wait(QUERY_HANG_GUARD_S), "the query waited for the embedder's own timeout"
        r = query.outcome()
        assert len(silent.held) == 1  # answered while the embedder's first attempt still waits
        assert r.degraded == ["qdrant"]
        assert any("embedder: no answer within 1.0s" in n and "lexical leg alone" in n for n in r.notes), r.notes
        embedded = next(st for st in r.steps if st.name == "embed.query")
        assert embedded.status == "failed" and embedded.store == "embedder"
        assert texts(r)[:2] == ["alice rollback of payments finished", "alice started the rollback of payments"]

        # The breaker opened: the next query does not ask the embedder, and says why.
        again = Call(lambda: s.engine.run(MemoryQuery(text="rollback payments", agent_id="a")), name="query")
        assert again.wait(QUERY_HANG_GUARD_S)
        assert len(silent.held) == 1 and again.outcome().degraded == ["qdrant"]
        assert any("circuit breaker open" in n for n in again.outcome().notes)
    finally:
        embedder.close()


def test_lexical_leg_failure_degrades_to_the_dense_leg(world: World) -> None:
    s = Stack(world)
    s.relational.calls.fail["lexical"] = StoreUnavailable("postgres", "canceling statement due to statement timeout")
    r = s.engine.run(MemoryQuery(text="rollback payments", agent_id="a"))
    assert r.degraded == ["lexical"] and any("dense leg alone" in n for n in r.notes)
    failed = next(st for st in r.steps if st.name == "lexical.search")
    assert failed.status == "failed" and "statement timeout" in (failed.error or "")
    assert r.hits and all("vector" in h.scores and "lexical" not in h.scores for h in r.hits)
    dense = s.engine.run(MemoryQuery(text="rollback payments", agent_id="a", retrieval="dense"))
    assert [h.id for h in r.hits] == [h.id for h in dense.hits]  # ranked as the dense leg alone
    alone = s.engine.run(MemoryQuery(text="rollback payments", agent_id="a", retrieval="lexical"))
    assert alone.degraded == ["lexical"] and [h.id for h in alone.hits] == [h.id for h in dense.hits]
    # asked now
    assert [st.name for st in alone.steps][:4] == ["lexical.search", "postgres.names", "embed.query", "fallback.vector"]
    s.vectors.calls.fail["search"] = StoreUnavailable("qdrant", "refused")
    with pytest.raises(StoreUnavailable, match="statement timeout"):  # neither leg: nothing to rank by
        s.engine.run(MemoryQuery(text="rollback payments", agent_id="a"))


def test_graph_down_falls_back_to_mentions(world: World) -> None:
    s = Stack(world)
    s.graph_up = False
    r = s.engine.run(MemoryQuery(text="rollback", agent_id="a", graph=GraphFilter(ALICE)))
    assert r.degraded == ["neo4j"] and r.plan == "graph → vector+lexical(pushdown: agent, 3 ids)"
    assert ("mentions", {"entity": ("User", "Alice"), "limit": 100_000}) in s.relational.calls.log
    assert all(h.sources == ["postgres", "qdrant", "postgres-mentions"] for h in r.hits)
    assert all(h.relationships == [] for h in r.hits)  # no graph: no relationships asked for


def test_graph_only_is_answered_by_the_graph(world: World) -> None:
    s = Stack(world)
    r = s.engine.run(MemoryQuery(agent_id="a", graph=GraphFilter(ALICE), since=NOW - timedelta(hours=2.5), limit=1))
    assert texts(r) == ["alice rollback of payments finished"]
    (traverse,) = s.graph.calls.args("traverse")
    t = traverse["traversal"]
    assert t.newest_first and t.created_from is not None and t.limit == 12
    assert r.plan == "graph(time pushed down, newest first)"
    assert [st.name for st in r.steps if st.store == "postgres"] == ["postgres.hydrate"]
    assert r.hits[0].relationships  # fetched from the graph alongside hydration
    s.graph.calls.fail["traverse"] = StoreUnavailable("neo4j", "refused")
    fallback = s.engine.run(MemoryQuery(agent_id="a", graph=GraphFilter(ALICE), limit=2))
    assert fallback.plan == "graph → postgres(filter, newest first)" and fallback.degraded == ["neo4j"]
    assert texts(fallback) == ["alice rollback of payments finished", "alice lunch is pizza"]


def test_vector_first_gives_the_graph_first_answer(world: World) -> None:
    for i in range(30):
        world.add(memory(f"bob rollback payments note {i}", who=BOB, hours=4 + i))
    q = MemoryQuery(text="rollback payments", agent_id="a", graph=GraphFilter(ALICE), limit=2, decay=False)
    graph_first = Stack(world, graph=FakeGraph(world), vector_first_min_fanout=0).engine.run(q)
    s = Stack(world, graph=FakeGraph(world, fanout=3000))
    vector_first = s.engine.run(_same(q))
    assert "vector-first" in vector_first.plan and graph_first.plan.startswith("graph → vector")
    assert [h.id for h in vector_first.hits] == [h.id for h in graph_first.hits]
    names = [st.name for st in vector_first.steps]
    assert names[:3] == ["graph.fanout", "vector.count", "graph.near_entities"]
    assert "graph.traverse" not in names and "graph.verify" in names
    (search,) = s.vectors.calls.args("search")
    assert search["filter"].ids is None and search["limit"] >= 4 * 14
    # the scope is cached: the next query does not count again
    s.engine.run(_same(q))
    assert s.vectors.calls.names().count("count") == 1


def _same(q: MemoryQuery) -> MemoryQuery:
    return MemoryQuery(text=q.text, agent_id=q.agent_id, graph=q.graph, limit=q.limit, decay=q.decay)


def test_vector_first_falls_back_when_too_few_are_connected(world: World) -> None:
    for i in range(300):
        world.add(memory(f"bob rollback payments note {i}", who=BOB, hours=4 + i))
    s = Stack(world, graph=FakeGraph(world, fanout=3000))  # says 3000, reaches 3
    r = s.engine.run(MemoryQuery(text="rollback payments", agent_id="a", graph=GraphFilter(ALICE), limit=1))
    assert r.plan.startswith("graph → vector") and any("graph-first instead" in n for n in r.notes)
    names = [st.name for st in r.steps]
    assert names.index("graph.verify") < names.index("graph.traverse")
    assert texts(r) == ["alice rollback of payments finished"]


def test_vector_first_verification_failure_falls_back(world: World) -> None:
    s = Stack(world, graph=FakeGraph(world, fanout=3000))
    s.graph.calls.fail["connected"] = StoreUnavailable("neo4j", "no answer within 2.0s")
    r = s.engine.run(MemoryQuery(text="rollback", agent_id="a", graph=GraphFilter(ALICE), limit=1))
    assert any("verification failed" in n for n in r.notes) and r.plan.startswith("graph → vector")


def test_or_fuses_the_legs_and_survives_a_failed_one(world: World) -> None:
    s = Stack(world)
    r = s.engine.run(MemoryQuery(text="rollback", agent_id="a", graph=GraphFilter(BOB), combine="or", limit=5))
    assert r.plan == "or: parallel legs fused by RRF"
    assert {"rrf", "vector", "graph"} <= set(r.hits[0].scores) and texts(r)[0] == "bob rollback of the database"
    assert [st.name for st in r.steps][-3:] == ["fuse", "graph.relationships", "postgres.hydrate"]
    s.relational.calls.fail["filter"] = StoreError("postgres", "canceling statement due to statement timeout")
    broken = s.engine.run(
        MemoryQuery(text="rollback", agent_id="a", where=[Where.parse("kind = note")], combine="or", limit=5)
    )
    assert any(n.startswith("where leg failed: postgres: canceling") for n in broken.notes)
    assert broken.hits and all("vector" in h.scores for h in broken.hits)


def test_recalls_are_recorded_and_losing_one_fails_nothing(world: World) -> None:
    s = Stack(world)
    r = s.engine.run(MemoryQuery(text="pizza", agent_id="a", limit=2))
    ((query_id, text, hits),) = s.recalls.events
    assert query_id == r.query.query_id and text == "pizza" and [h[1] for h in hits] == [h.id for h in r.hits]
    s.recalls.calls.fail["record_recalls"] = StoreUnavailable("postgres", "gone")
    assert s.engine.run(MemoryQuery(text="pizza", agent_id="a", limit=2)).hits


def test_no_candidates_skips_the_search(world: World) -> None:
    s = Stack(world)
    r = s.engine.run(MemoryQuery(text="rollback", agent_id="a", graph=GraphFilter(EntityRef("User", "Nobody"))))
    assert r.hits == [] and r.plan == "graph → (no candidates)" and s.vectors.calls.log == []


def test_every_plan_stays_in_the_agent(world: World) -> None:
    s = Stack(world)
    queries = [
        MemoryQuery(text="rollback payments finished", agent_id="other"),
        MemoryQuery(agent_id="other", graph=GraphFilter(ALICE)),
        MemoryQuery(text="rollback", agent_id="other", graph=GraphFilter(ALICE), combine="or"),
        MemoryQuery(agent_id="other", since=NOW - timedelta(days=1)),
    ]
    for q in queries:
        assert texts(s.engine.run(q)) == ["alice rollback of payments finished"], q
        assert all(h.memory.agent_id == "other" for h in s.engine.run(_copy(q)).hits)


def _copy(q: MemoryQuery) -> MemoryQuery:
    return MemoryQuery(
        text=q.text, agent_id=q.agent_id, graph=q.graph, since=q.since, combine=q.combine, query_id=uuid.uuid4()
    )


def test_the_dense_leg_embeds_the_question_without_the_names_it_says() -> None:
    """query/dense_question.py: the names of entities the scope's memories carry are left out of what the
    dense leg embeds (the entity and lexical legs match them); other words, and a question that is
    only a name, are embedded as asked; a failed lookup embeds the whole question."""
    world = World()
    bob = EntityRef("Speaker", "Bob")
    world.add(
        memory("thanks bob", who=EntityRef("Speaker", "Fatima")),
        memory("no automated rollback scares me", who=bob, hours=2),
        memory("acme corp renewed", who=EntityRef("Customer", "Acme Corp"), agent="b"),
    )
    s = Stack(world)

    def embedded(text: str, agent: str = "a") -> tuple[str, list[float]]:
        r = s.engine.run(MemoryQuery(text=text, agent_id=agent, retrieval="dense"))
        step = next(st for st in r.steps if st.name == "embed.query")
        (search,) = s.vectors.calls.args("search")
        s.vectors.calls.log.clear()
        return step.detail.get("text", text), search["vector"]

    text, vector = embedded("All the risks Bob raised")
    assert text == "All the risks raised" and vector == EMBEDDER.embed_query(text).tolist()
    # a name of another agent's entity is an ordinary word here; a name alone is kept
    assert embedded("Acme Corp renewal")[0] == "Acme Corp renewal"
    assert embedded("Acme Corp renewal", agent="b")[0] == "renewal"
    assert embedded("Bob?")[0] == "Bob?"
    # off: the whole question, no lookup
    s.engine.options = dataclasses.replace(s.engine.options, dense_without_names=False)
    assert embedded("All the risks Bob raised")[0] == "All the risks Bob raised"
    s.relational.calls.log.clear()
    assert embedded("All the risks Bob raised")[0] == "All the risks Bob raised"
    assert "names_said" not in s.relational.calls.names()
    s.engine.options = dataclasses.replace(s.engine.options, dense_without_names=True)
    s.relational.calls.fail["names_said"] = StoreUnavailable("postgres", "canceling statement due to statement timeout")
    r = s.engine.run(MemoryQuery(text="All the risks Bob raised", agent_id="a", retrieval="dense"))
    assert r.hits and any("whole question" in n for n in r.notes) and r.degraded == []


def test_a_named_time_searches_again_within_it_and_ranks_what_that_search_found() -> None:
    """The text legs rank by words and meaning alone: 130 memories of other days say the question's
    words better than the one written on the day it names, which sits below any fixed depth. The
    same legs asked again within the named time (``dates.scope``: the day and a day either side)
    find it, the question embedded once, and the time preference ranks it into the top 10. An
    undated question asks once."""
    w = World()
    day = datetime(2023, 5, 3, 12, tzinfo=UTC)
    # Fixed ids: the 130 others tie on every score but their ids, and with random ids about one run
    # in ten put the target out (the CI rehearsal of 63f162c; 7 of 60 in a loop): a tie-break the
    # scoped search does not yet make independent of the ids (issue 27's closing note).
    w.add(
        *(
            Memory(
                text=f"the rollback of payments on may {n}",
                agent_id="a",
                created_at=day + timedelta(days=30 + n),
                id=uuid.UUID(int=n + 1),
            )
            for n in range(130)
        )
    )
    target = Memory(text="the rollback of payments", agent_id="a", created_at=day, id=uuid.UUID(int=1000))
    w.add(target)
    s = Stack(w)
    r = s.engine.run(MemoryQuery(text="rollback of payments on May 3, 2023", agent_id="a"))
    found = {h.id: h for h in r.hits}
    assert target.id in found and found[target.id].scores["dated"] == 1.0
    # the 130 tie on the cosine too: the first search asks again past them (``calls.settled_search``)
    first, *again, scoped = s.vectors.calls.args("search")
    assert [a["filter"].created_from for a in again] == [None] * len(again)
    assert first["filter"].created_from is None and first["limit"] == scoped["limit"]
    assert (scoped["filter"].created_from, scoped["filter"].created_to) == (
        datetime(2023, 5, 2, tzinfo=UTC),
        datetime(2023, 5, 5, tzinfo=UTC),
    )
    assert [st.name for st in r.steps].count("embed.query") == 1
    assert len(s.relational.calls.args("lexical")) == 2
    s.vectors.calls = type(s.vectors.calls)()
    s.engine.run(MemoryQuery(text="rollback of payments on may", agent_id="a"))
    assert all(a["filter"].created_from is None for a in s.vectors.calls.args("search"))


class ShuffledTies(FakeVectors):
    """Qdrant Edge's way with equal scores: best first, but a run of equal scores in an order of
    the process's own (here: of the seed), so which of its members fall inside a limit varies."""

    def __init__(self, world: World, seed: int) -> None:
        super().__init__(world)
        self.rng, self.asked = random.Random(seed), list[int]()

    def search(
        self,
        vector: Sequence[float],
        flt: VectorFilter,
        limit: int,
        *,
        model_id: str,
        score_threshold: float | None = None,
        inactive_ok: bool = False,
    ) -> list[VectorHit]:
        self.asked.append(limit)
        every = super().search(
            vector, flt, len(self.world.memories), model_id=model_id, score_threshold=score_threshold
        )
        self.rng.shuffle(every)
        return sorted(every, key=lambda h: -h.score)[:limit]


def test_equal_cosines_at_the_dense_legs_depth_give_the_same_candidates_whatever_the_stores_order() -> None:
    """50 memories of one text have one cosine with any question; the dense leg (30 deep for ten
    hits) keeps the 30 of them first by id, asking past its depth until the run is seen whole, so
    every store order gives the same candidates and the same answer. Without that the store's
    order chose the 30 (the generator benchmark's run-to-run differences, docs/retrieval.md)."""
    w = World()
    w.add(*(memory("the deploy went fine", hours=n + 1) for n in range(50)))
    first_by_id = sorted(w.memories.values(), key=lambda m: m.id)[:30]
    expected = [m.id for m in sorted(first_by_id, key=lambda m: m.created_at, reverse=True)[:10]]
    for seed in range(8):
        vectors = ShuffledTies(w, seed)
        s = Stack(w, vectors=vectors)
        r = s.engine.run(MemoryQuery(text="did the deploy go fine", agent_id="a", retrieval="dense", limit=10))
        assert [h.id for h in r.hits] == expected
        # asked 30 + TIE_MARGIN, the run reached the end, asked again with twice that: all 50
        assert vectors.asked == [40, 80]


def test_settled_orders_runs_of_equal_scores_by_id_and_keeps_the_stores_order_otherwise() -> None:
    ids = [uuid.UUID(int=n) for n in range(6)]

    def hit(i: int, score: float) -> VectorHit:
        return VectorHit(ids[i], score, "a", NOW, "note")

    hits = [hit(5, 0.9), hit(3, 0.5), hit(1, 0.5), hit(4, 0.5), hit(0, 0.2), hit(2, 0.1)]
    assert settled(hits, 3) == [(ids[5], 0.9), (ids[1], 0.5), (ids[3], 0.5)]
    assert [i for i, _ in settled(hits, 10)] == [ids[5], ids[1], ids[3], ids[4], ids[0], ids[2]]
    # a distance (lower is better) keeps its direction: only the runs are reordered
    assert [i for i, _ in settled([hit(2, 0.1), hit(1, 0.3), hit(0, 0.3)], 3)] == [ids[2], ids[0], ids[1]]
    asked: list[int] = []

    def search(limit: int) -> list[VectorHit]:
        asked.append(limit)
        return [hit(n % 6, 0.5) for n in range(limit)]

    settled_search(search, 2)  # a run longer than every re-ask: asked TIE_REASKS more times, then cut
    assert asked == [12, 24, 48, 96]
    assert settled_search(search, 0) == []
