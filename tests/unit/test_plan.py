"""The plan matrix: ``plan(query, facts, options)`` is pure, so every shape is checked without a store.

The same shapes run against the real stores in tests/integration/test_query_engine.py and
test_vector_first.py; here each row of the README's "Query engine" table is pinned by what the
planner decides and why.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memoryctl.errors import InputError
from memoryctl.model import EntityRef
from memoryctl.query.plan import (
    GRAPH_CANDIDATE_CAP,
    Facts,
    Need,
    Plan,
    PlanOptions,
    depth,
    plan,
    vector_first_k,
)
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


def test_text_pushes_everything_the_payload_holds_into_one_search() -> None:
    where = [Where.parse("kind = ticket"), Where.parse("sentiment < 0")]
    p = chosen(q(text="latency", since=SINCE, where=where))
    assert p.kind == "vector" and p.traverse is None and p.filter is None  # PostgreSQL only hydrates
    assert p.search is not None and p.search.with_where and not p.search.among_candidates
    flt = p.search.filter
    assert flt is not None
    assert (flt.agent_id, flt.kinds, flt.created_from) == ("a", ["ticket"], SINCE)
    assert [(m.key, m.op, m.value) for m in flt.meta] == [("sentiment", "<", 0)]
    assert p.describe() == "vector+lexical(pushdown: agent, time, kind =, meta.sentiment <)"
    assert p.search.legs == ("vector", "lexical")  # hybrid by default


def test_where_the_payload_cannot_answer_is_checked_in_postgres_after_the_search() -> None:
    p = chosen(q(text="latency", where=[Where.parse("agent_id != b")]))
    assert p.kind == "vector" and p.filter is not None and p.filter.among == "ranked"


def test_contradicting_where_clauses_match_nothing() -> None:
    p = chosen(q(text="x", where=[Where.parse("kind = a"), Where.parse("kind = b")]))
    assert p.search is not None and p.search.filter is None
    other_agent = chosen(q(text="x", where=[Where.parse("agent_id = b")]))
    assert other_agent.search is not None and other_agent.search.filter is None


def test_created_at_clauses_narrow_the_time_window() -> None:
    late = datetime(2026, 3, 1, tzinfo=UTC)
    p = chosen(q(text="x", since=SINCE, where=[Where.parse(f"created_at >= {late.isoformat()}")]))
    assert p.search is not None and p.search.filter is not None
    assert p.search.filter.created_from == late


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
    assert p.kind == "postgres" and p.filter is not None
    assert (p.filter.among, p.filter.limit, p.filter.with_where, p.filter.tag) == ("all", 7, True, None)
    assert p.describe() == "postgres(filter, newest first)"


def test_graph_only_is_cut_by_the_graph_newest_first() -> None:
    p = chosen(q(graph=ALICE, since=SINCE, limit=3))
    assert p.kind == "graph" and p.search is None and p.traverse is not None
    t = p.traverse.traversal
    assert (t.newest_first, t.created_from, t.limit, t.start_key) == (
        True,
        SINCE,
        depth(q(graph=ALICE, limit=3)),
        "a/User:alice",
    )
    assert p.describe(candidates=5) == "graph(time pushed down, newest first)"
    # When PostgreSQL mentions answered instead of the graph, PostgreSQL orders and cuts.
    assert p.filter is not None and (p.filter.among, p.filter.limit, p.filter.tag) == ("candidates", 3, "graph")
    assert p.describe(candidates=5, fell_back=True) == "graph → postgres(filter, newest first)"
    assert p.describe(candidates=0, fell_back=True) == "graph → (no candidates)"


def test_graph_and_where_without_text_filters_the_candidates() -> None:
    p = chosen(q(graph=ALICE, where=[Where.parse("kind = note")]))
    assert p.kind == "graph-filter" and p.traverse is not None and not p.traverse.traversal.newest_first
    assert p.traverse.traversal.limit == GRAPH_CANDIDATE_CAP
    assert p.filter is not None and (p.filter.among, p.filter.with_where, p.filter.tag) == ("candidates", True, "graph")
    assert p.describe(candidates=4) == "graph → postgres(filter, newest first)"


def test_graph_and_text_is_graph_first_when_the_graph_cannot_check_cheaply() -> None:
    p = chosen(q(text="rollback", graph=ALICE, since=SINCE))
    assert p.kind == "graph-first" and p.traverse is not None and p.search is not None
    assert p.search.among_candidates and p.search.filter is not None and p.search.filter.created_from == SINCE
    assert p.describe(candidates=4) == "graph → vector+lexical(pushdown: agent, 4 ids, time)"
    assert p.describe(candidates=0) == "graph → (no candidates)"


def test_vector_first_asks_for_the_fanout_then_the_scope() -> None:
    query = q(text="rollback", graph=ALICE, limit=3)
    assert plan(query, CHEAP) == Need("fanout")
    assert chosen(query, Facts(True, fanout=1999)).kind == "graph-first"  # cheap traversal: graph-first
    assert plan(query, Facts(True, fanout=2000)) == Need("scope")
    p = chosen(query, Facts(True, fanout=20_000, scope=100_000))
    assert p.kind == "vector-first" and p.vector_first is not None and p.fallback is not None
    want = depth(query)
    assert p.vector_first.depth == want and p.vector_first.k == vector_first_k(want, 100_000, 20_000)
    assert p.vector_first.search.depth == p.vector_first.k and p.vector_first.search.filter is not None
    assert p.vector_first.search.filter.ids is None  # no ids: that is the point
    assert p.fallback.kind == "graph-first"
    assert (
        p.describe(kept=40)
        == f"graph fan-out 20000 → vector-first(vector+lexical, top {p.vector_first.k}, pushdown: agent)"
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
    assert p.kind == "or" and [name for name, _ in p.legs] == ["text", "graph", "where"]
    legs = dict(p.legs)
    want = depth(q(text="x", limit=4))
    vector, graph, where = legs["text"], legs["graph"], legs["where"]
    assert vector.search is not None and not vector.search.with_where and vector.search.filter is not None
    assert vector.search.filter.kinds is None  # each leg answers its own part of the question
    assert graph.filter is not None and (graph.filter.limit, graph.filter.with_where, graph.filter.tag) == (
        want,
        False,
        "graph",
    )
    assert where.filter is not None and (where.filter.limit, where.filter.with_where, where.filter.tag) == (
        want,
        True,
        "where",
    )
    assert p.describe() == "or: parallel legs fused by RRF"


def test_or_with_a_single_leg_is_that_leg() -> None:
    assert chosen(q(text="rollback", combine="or")).kind == "vector"


def test_a_graph_filter_needs_an_agent() -> None:
    with pytest.raises(InputError, match="graph filter needs an agent"):
        MemoryQuery(text="x", graph=ALICE, all_agents=True).validate()


def test_plan_is_a_value() -> None:
    a = chosen(q(text="rollback", graph=ALICE, since=SINCE - timedelta(days=1)))
    b = chosen(q(text="rollback", graph=ALICE, since=SINCE - timedelta(days=1)))
    assert a == b and a is not b
