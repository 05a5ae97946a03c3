"""The plan matrix: ``plan(query, facts, options)`` is pure, so every shape is checked without a store.

The same shapes run against the real stores in tests/integration/test_query_engine.py and
test_vector_first.py; here each row of docs/retrieval.md's "Plan shapes" table is pinned by what the
planner decides and why.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from memoryctl.errors import InputError
from memoryctl.model import EntityRef
from memoryctl.query.plan import (
    AnyOf,
    ByFusedRank,
    ByRelevance,
    Facts,
    Figures,
    GraphFirst,
    GraphOnly,
    GraphThenPostgres,
    Need,
    NewestFirst,
    Plan,
    PlanOptions,
    PostgresOnly,
    VectorFirst,
    VectorSearch,
    asks_for_a_list,
    plan,
    vector_first_k,
)
from memoryctl.query.pushdown import GRAPH_CANDIDATE_CAP, depth
from memoryctl.query.spec import GraphFilter, MemoryQuery, Where

ALICE = GraphFilter(EntityRef("User", "Alice"), ("AUTHORED",))
SINCE = datetime(2026, 1, 1, tzinfo=UTC)
CHEAP = Facts(graph_checks_cheaply=True)


def q(**kw: object) -> MemoryQuery:
    kw.setdefault("agent_id", "a")
    return MemoryQuery(**kw).validate()  # type: ignore[arg-type]


def chosen(query: MemoryQuery, facts: Facts | None = None, **options: int) -> Plan:
    p = plan(query, facts, PlanOptions(**options))
    assert isinstance(p, Plan), p
    return p


def described(p: Plan, **figures: object) -> str:
    return p.describe(Figures(**figures))  # type: ignore[arg-type]


def test_text_pushes_everything_the_payload_holds_into_one_search() -> None:
    where = [Where.parse("kind = ticket"), Where.parse("sentiment < 0")]
    p = chosen(q(text="latency", since=SINCE, where=where))
    shape = p.shape
    assert isinstance(shape, VectorSearch) and not shape.recheck  # PostgreSQL only hydrates
    assert shape.search.with_where and not shape.search.among_candidates
    flt = shape.search.filter
    assert flt is not None
    assert (flt.agent_id, flt.kinds, flt.created_from) == ("a", ["ticket"], SINCE)
    assert [(m.key, m.op, m.value) for m in flt.meta] == [("sentiment", "<", 0)]
    assert p.describe() == "vector+lexical(pushdown: agent, time, kind =, meta.sentiment <)"
    assert shape.search.legs == ("vector", "lexical")  # hybrid by default
    # a text ranking: relevance, the names the question says, the context; no recency unless asked
    assert p.ranking == ByRelevance(half_life=None, named=True, context_turns=2, context_adds=True, sessions=True)
    assert (p.window, p.limit) == (depth(q(text="x")), 10)


@pytest.mark.parametrize(
    ("text", "listed"),
    [
        ("What activities has Melanie done with her family?", True),
        ("Which countries has Maria been to?", True),
        ("what kinds of books does Tim read", True),
        ("What are Caroline's hobbies?", True),
        ("What was the name of her dog?", False),  # the wh-word's next word: no plural noun
        ("What does John do to relax?", False),
        ("What is his job?", False),
        ("Which bus did he take?", False),
        ("Which class did she join?", False),
        ("Where did they go?", False),
    ],
)
def test_a_list_question_is_a_plural_after_what_or_which(text: str, listed: bool) -> None:
    assert asks_for_a_list(text) is listed


def test_a_list_question_ranks_the_whole_union_of_the_two_legs_without_searching_deeper() -> None:
    """Its answer is spread over several memories: the ranking reads both legs' candidates (up to
    twice the depth), the legs search exactly as deep as for any question."""
    base = depth(q(text="x"))
    listed = chosen(q(text="What activities has Melanie done?"))
    single = chosen(q(text="What is Melanie's job?"))
    for p in (listed, single):
        assert isinstance(p.shape, VectorSearch) and p.shape.search.depth == base
    assert (listed.window, single.window) == (2 * base, base)
    either = chosen(q(text="What activities has Melanie done?", where=[Where.parse("kind = note")], combine="or"))
    assert isinstance(either.ranking, ByFusedRank) and either.window == base  # RRF reads its own legs' cut


def test_where_the_payload_cannot_answer_is_checked_in_postgres_after_the_search() -> None:
    p = chosen(q(text="latency", where=[Where.parse("agent_id != b")]))
    assert isinstance(p.shape, VectorSearch) and p.shape.recheck


def test_contradicting_where_clauses_match_nothing() -> None:
    p = chosen(q(text="x", where=[Where.parse("kind = a"), Where.parse("kind = b")]))
    assert isinstance(p.shape, VectorSearch) and p.shape.search.filter is None
    other_agent = chosen(q(text="x", where=[Where.parse("agent_id = b")]))
    assert isinstance(other_agent.shape, VectorSearch) and other_agent.shape.search.filter is None


def test_created_at_clauses_narrow_the_time_window() -> None:
    late = datetime(2026, 3, 1, tzinfo=UTC)
    p = chosen(q(text="x", since=SINCE, where=[Where.parse(f"created_at >= {late.isoformat()}")]))
    assert isinstance(p.shape, VectorSearch) and p.shape.search.filter is not None
    assert p.shape.search.filter.created_from == late


@pytest.mark.parametrize(
    "query",
    [
        {"where": [Where.parse("kind = note")]},
        {"since": SINCE},
        {"since": SINCE, "where": [Where.parse("sentiment > 0")]},
    ],
)
def test_no_text_no_graph_is_postgres_alone(query: dict[str, object]) -> None:
    p = chosen(q(limit=7, **query))
    assert isinstance(p.shape, PostgresOnly) and p.ranking == NewestFirst()
    assert (p.shape.filter.limit, p.shape.filter.with_where, p.shape.filter.tag) == (7, True, None)
    assert p.describe() == "postgres(filter, newest first)"


def test_graph_only_is_cut_by_the_graph_newest_first() -> None:
    p = chosen(q(graph=ALICE, since=SINCE, limit=3))
    assert isinstance(p.shape, GraphOnly) and p.ranking == NewestFirst()
    t = p.shape.traverse.traversal
    assert (t.newest_first, t.created_from, t.limit, t.start_key) == (
        True,
        SINCE,
        depth(q(graph=ALICE, limit=3)),
        "a/User:alice",
    )
    assert described(p, candidates=5) == "graph(time pushed down, newest first)"
    # When PostgreSQL mentions answered instead of the graph, PostgreSQL orders and cuts.
    assert (p.shape.fallback.limit, p.shape.fallback.tag) == (3, "graph")
    assert described(p, candidates=5, fell_back=True) == "graph → postgres(filter, newest first)"
    assert described(p, candidates=0, fell_back=True) == "graph → (no candidates)"


def test_graph_and_where_without_text_filters_the_candidates() -> None:
    p = chosen(q(graph=ALICE, where=[Where.parse("kind = note")]))
    assert isinstance(p.shape, GraphThenPostgres) and not p.shape.traverse.traversal.newest_first
    assert p.shape.traverse.traversal.limit == GRAPH_CANDIDATE_CAP
    assert (p.shape.filter.with_where, p.shape.filter.tag) == (True, "graph")
    assert described(p, candidates=4) == "graph → postgres(filter, newest first)"


def test_graph_and_text_is_graph_first_when_the_graph_cannot_check_cheaply() -> None:
    p = chosen(q(text="rollback", graph=ALICE, since=SINCE))
    shape = p.shape
    assert isinstance(shape, GraphFirst) and shape.traverse.start == ALICE.entity
    assert shape.search.among_candidates and shape.search.filter is not None
    assert shape.search.filter.created_from == SINCE
    assert described(p, candidates=4) == "graph → vector+lexical(pushdown: agent, 4 ids, time)"
    assert described(p, candidates=0) == "graph → (no candidates)"
    # under a graph filter the context reorders the candidates but adds none
    assert isinstance(p.ranking, ByRelevance) and not p.ranking.context_adds


def test_vector_first_asks_for_the_fanout_then_the_scope() -> None:
    query = q(text="rollback", graph=ALICE, limit=3)
    need = plan(query, CHEAP)
    assert isinstance(need, Need) and need.fact == "fanout" and need.traverse is not None
    assert need.traverse.traversal.start_key == "a/User:alice"  # the degree count of the start entity
    assert chosen(query, Facts(True, fanout=1999)).kind == "graph-first"  # cheap traversal: graph-first
    assert plan(query, Facts(True, fanout=2000)) == Need("scope")
    p = chosen(query, Facts(True, fanout=20_000, scope=100_000))
    vf = p.shape
    assert isinstance(vf, VectorFirst) and isinstance(vf.fallback, GraphFirst)
    want = depth(query)
    assert vf.depth == want and vf.k == vector_first_k(want, 100_000, 20_000)
    assert vf.search.depth == vf.k and vf.search.filter is not None
    assert vf.search.filter.ids is None  # no ids: that is the point
    assert (
        described(p, kept=40) == f"graph fan-out 20000 → vector-first(vector+lexical, top {vf.k}, pushdown: agent)"
        " → graph.verify → 40 kept"
    )


def test_vector_first_k_expects_three_times_the_needed_connected_hits() -> None:
    assert vector_first_k(16, 100_000, 20_000) == 240  # 16 x 5 x 3
    assert vector_first_k(16, 1_000, 20_000) == 64  # never fewer than 4 x want
    assert vector_first_k(16, 0, 20_000) == 64


@pytest.mark.parametrize(
    ("query", "facts", "options"),
    [
        ({"graph": GraphFilter(EntityRef("User", "Alice"), hops=2)}, Facts(True, 50_000, 100_000), {}),
        ({}, Facts(True, 50_000, 100_000), {"vector_first_min_fanout": 0}),
        ({}, Facts(False, 50_000, 100_000), {}),  # no graph store, or connected() walks everything
        ({}, Facts(True, 2_000, 10_000_000), {}),  # K beyond vector_first_max_k
        ({}, Facts(True, 50_000, 0), {}),  # the vector store could not say how big the scope is
        ({"where": [Where.parse("created_at != 2026-01-01T00:00:00Z")]}, Facts(True, 50_000, 100_000), {}),
    ],
)
def test_when_vector_first_is_not_chosen(query: dict[str, object], facts: Facts, options: dict[str, int]) -> None:
    query = {"text": "rollback", "graph": ALICE, **query}
    assert chosen(q(**query), facts, **options).kind == "graph-first"


def test_or_runs_each_leg_as_its_own_plan() -> None:
    p = chosen(q(text="rollback", graph=ALICE, where=[Where.parse("kind = note")], combine="or", limit=4))
    assert isinstance(p.shape, AnyOf) and [name for name, _ in p.shape.legs] == ["text", "graph", "where"]
    assert p.ranking == ByFusedRank()
    legs = dict(p.shape.legs)
    want = depth(q(text="x", limit=4))
    vector, graph, where = legs["text"], legs["graph"], legs["where"]
    assert isinstance(vector, VectorSearch) and not vector.search.with_where and vector.search.filter is not None
    assert vector.search.filter.kinds is None  # each leg answers its own part of the question
    assert isinstance(graph, GraphThenPostgres)
    assert (graph.filter.limit, graph.filter.with_where, graph.filter.tag) == (want, False, "graph")
    assert isinstance(where, PostgresOnly)
    assert (where.filter.limit, where.filter.with_where, where.filter.tag) == (want, True, "where")
    assert p.describe() == "or: parallel legs fused by RRF"


@pytest.mark.parametrize(
    "leg",
    [
        {"text": "rollback"},
        {"where": [Where.parse("kind = note")]},
        {"graph": ALICE},
        {"text": "rollback", "since": SINCE},  # a time window is a scope of the one leg, not a leg
    ],
)
def test_or_with_a_single_leg_is_that_leg(leg: dict[str, object]) -> None:
    """Exactly the plan of the same query with ``and``: no fusion of one leg, no other leg run."""
    single = chosen(q(combine="or", limit=4, **leg))
    assert single == chosen(q(limit=4, **leg))
    assert not isinstance(single.shape, AnyOf) and single.ranking != ByFusedRank()


def test_a_graph_filter_needs_an_agent() -> None:
    with pytest.raises(InputError, match="graph filter needs an agent"):
        MemoryQuery(text="x", graph=ALICE, all_agents=True).validate()


def test_plan_is_a_value() -> None:
    a = chosen(q(text="rollback", graph=ALICE, since=SINCE - timedelta(days=1)))
    b = chosen(q(text="rollback", graph=ALICE, since=SINCE - timedelta(days=1)))
    assert a == b and a is not b


def test_the_ranking_rule_comes_with_the_plan() -> None:
    """What the ranking does is decided with the shape, from the query and the options; the
    executor never reads it back from the scores a candidate carries."""
    month = timedelta(days=30)
    text = ByRelevance(context_turns=2, sessions=True)
    assert chosen(q(text="x", half_life=month)).ranking == replace(text, half_life=month)
    assert chosen(q(text="x", half_life=month, decay=False)).ranking == text
    # a raw vector has no words: no names to match, no context to read, no session to weigh
    raw = chosen(q(vector=[0.1, 0.2]))
    assert raw.ranking == ByRelevance(named=False, context_turns=0)
    assert chosen(q(text="x", threshold=0.5)).ranking == replace(text, context_adds=False)
    off = plan(q(text="x"), None, PlanOptions(context_turns=0, dense_without_names=False, sessions=False))
    assert isinstance(off, Plan) and off.ranking == ByRelevance(context_turns=0)
    assert isinstance(off.shape, VectorSearch) and not off.shape.search.without_names
    assert chosen(q(graph=ALICE, where=[Where.parse("kind = note")])).ranking == NewestFirst()


def test_a_query_is_a_value() -> None:
    """Validation returns the normalised query; the one asked stays as it was."""
    asked = MemoryQuery(text="  ", vector=[0.1], agent_id="a", all_agents=True, where=[Where.parse("kind = note")])
    ran = asked.validate()
    assert (asked.text, asked.agent_id) == ("  ", "a") and (ran.text, ran.agent_id) == (None, None)
    assert isinstance(ran.where, tuple)
    with pytest.raises(AttributeError):
        asked.limit = 3  # type: ignore[misc]
