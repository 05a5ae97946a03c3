"""The query plan as a value: which stores are asked what, in which order, decided in one place.

``plan(query, facts, options)`` is a pure function. It returns a ``Plan`` that the executor
(``memoryctl.query.engine``) runs and ``--explain`` prints, or a ``Need`` when the choice depends
on something only a store can say (the start entity's fan-out, the size of the agent's scope); the
executor asks the store and calls ``plan`` again with the answer in ``Facts``. Nothing here talks
to a store, so every plan shape is unit-tested without one.

Plan shapes (the README's "Query engine" table):

- ``vector``: text (+ where/time) → one vector search with everything the payload holds pushed
  into its filter, and in parallel the lexical search in PostgreSQL under the same scope; the two
  rankings are fused (hybrid retrieval, ``TextSearch``). PostgreSQL then only hydrates. Where
  clauses the payload cannot answer exactly (``agent_id``/``created_at`` with ``!=``/``in``) are
  checked in PostgreSQL afterwards. Every shape below that has text runs the same two legs.
- ``graph-first``: text + graph → traverse → candidate ids → one vector search whose filter
  carries the ids (chunked by the adapter), the agent, the time range and every where clause.
- ``vector-first``: text + graph at one hop when the start entity reaches many memories (the
  graph's degree count says so without traversing): the same vector search without ids for the
  top K, then the graph checks which of those K are connected. Exact as soon as enough of them
  are (every memory outside the top K scores lower than all of them); otherwise the executor runs
  the plan's ``fallback``, graph-first. A high fan-out traversal (20k ids) is the most expensive
  thing a query can do; this plan never runs it.
- ``graph``: graph only → the graph store applies the time range, orders newest first and cuts.
- ``graph-filter``: graph + where, no text → traverse → PostgreSQL filters the candidates.
- ``postgres``: where and/or time only → PostgreSQL alone, newest first.
- ``or``: every leg (vector, graph, where) is a plan of its own; they run in parallel and their
  rankings are fused with RRF.

A leg that fails falls back where a fallback exists (vector search → PostgreSQL full-text;
traversal → the ``entities`` column, one hop); those are properties of the stages, applied by the
executor, and named in the answer's ``degraded`` list.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from memoryctl.query.spec import MemoryQuery, Where
from memoryctl.stores.protocols import GraphTraversal, MetaCondition, VectorFilter

OVERFETCH = 2  # hits fetched per requested hit: PostgreSQL may veto a few (deleted since)
GRAPH_CANDIDATE_CAP = 100_000
# Vector-first sizing. Below VECTOR_FIRST_MIN_FANOUT reachable memories the traversal is cheap and
# graph-first wins; vector-first asks the vector store for VECTOR_FIRST_SAFETY times the hits it
# expects to need and gives up beyond VECTOR_FIRST_MAX_K. Measured with benchmarks/query.py (100k
# memories, top author 20k): graph-first 860-1660 ms, vector-first with ~420 candidates 119 ms end
# to end; a 2,000-id traversal costs about what a 2,000-candidate check does, hence both bounds.
# Exact relative to the vector search (HNSW beyond 100k points is approximate either way).
VECTOR_FIRST_MIN_FANOUT = 2_000
VECTOR_FIRST_MAX_K = 2_000
VECTOR_FIRST_SAFETY = 3.0

Leg = Literal["vector", "lexical"]
PlanKind = Literal["or", "vector", "graph-first", "vector-first", "graph", "graph-filter", "postgres"]


def depth(q: MemoryQuery) -> int:
    """How many ranked candidates a leg produces for ``q.limit`` hits."""
    return q.limit * OVERFETCH + 10


# ---- what the vector search can answer ---------------------------------------------------------


def pushdown(q: MemoryQuery, *, with_where: bool, ids: Sequence[uuid.UUID] | None = None) -> VectorFilter | None:
    """The vector filter: agent scope, time range, and every ``where`` the payload can answer.

    None when the conditions contradict each other (nothing can match).
    """
    kinds: list[str] | None = None
    exclude: list[str] = []
    agent = q.agent_id
    created_from, created_to = q.since, q.until
    meta: list[MetaCondition] = []
    for w in q.where if with_where else []:
        if w.field == "kind":
            if w.op == "!=":
                exclude.append(w.value)
            else:
                wanted = set(w.value if w.op == "in" else [w.value])
                kinds = sorted(wanted if kinds is None else wanted & set(kinds))
                if not kinds:
                    return None
        elif w.field == "agent_id":
            # Only '=' narrows the scope here; '!=' and 'in' are checked in PostgreSQL afterwards.
            if w.op == "=":
                if agent is not None and agent != w.value:
                    return None  # contradiction: nothing can match
                agent = w.value
        elif w.field == "created_at":
            created_from, created_to = narrow_time(w, created_from, created_to)
        else:
            meta.append(MetaCondition(w.field[5:], w.op, w.value))
    return VectorFilter(
        agent_id=agent,
        ids=ids,
        kinds=kinds,
        exclude_kinds=exclude or None,
        created_from=created_from,
        created_to=created_to,
        meta=tuple(meta),
    )


def narrow_time(w: Where, lo: datetime | None, hi: datetime | None) -> tuple[datetime | None, datetime | None]:
    """The time window ``[lo, hi)`` narrowed by one ``created_at`` clause (``!=``/``in`` leave it)."""
    if w.op in (">", ">="):
        lo = w.value if lo is None else max(lo, w.value)
    elif w.op in ("<", "<="):
        hi = w.value if hi is None else min(hi, w.value)
    elif w.op == "=":
        lo = hi = w.value
    return lo, hi


def needs_postgres_filter(q: MemoryQuery) -> bool:
    """Where clauses the vector payload cannot answer exactly (checked again in PostgreSQL)."""
    return any(w.field in ("agent_id", "created_at") and w.op in ("!=", "in") for w in q.where)


def pushed_terms(q: MemoryQuery) -> tuple[str, ...]:
    """What the vector search's filter carries, in words, for the plan line."""
    terms = ["agent" if q.agent_id else "all agents"]
    if q.since or q.until:
        terms.append("time")
    return (*terms, *(f"{w.field} {w.op}" for w in q.where))


def traversal(q: MemoryQuery, *, newest_first: bool = False) -> GraphTraversal:
    """Nearest first with the candidate cap, or (graph only) the query's window newest first."""
    assert q.graph is not None and q.agent_id is not None  # MemoryQuery.validate refuses otherwise
    g = q.graph
    return GraphTraversal(
        agent_id=q.agent_id,
        start_key=g.entity.key(q.agent_id),
        relation_types=g.via,
        hops=g.hops,
        direction=g.direction,
        limit=depth(q) if newest_first else GRAPH_CANDIDATE_CAP,
        created_from=q.since if newest_first else None,
        created_to=q.until if newest_first else None,
        newest_first=newest_first,
    )


def vector_first_k(want: int, scope: int, fanout: int) -> int:
    """Top K for vector-first: enough that ~SAFETY x ``want`` connected memories are expected in it.

    A memory of the agent's ``scope`` is connected with probability about ``fanout / scope``, so
    the top K holds about ``K * fanout / scope`` connected ones; never fewer than 4 x ``want``.
    """
    return max(4 * want, math.ceil(want * max(scope, 1) / fanout * VECTOR_FIRST_SAFETY))


# ---- the plan value ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """The planner's settings (``[query]`` in the config)."""

    vector_first_min_fanout: int = VECTOR_FIRST_MIN_FANOUT  # 0 = never vector-first
    vector_first_max_k: int = VECTOR_FIRST_MAX_K


@dataclass(frozen=True, slots=True)
class Facts:
    """What the stores said that the choice depends on; None = not asked (yet).

    A store that could not answer is recorded as 0, which the planner treats as "no vector-first":
    graph-first then reports the failure itself and falls back.
    """

    graph_checks_cheaply: bool = False  # a graph store is open and ``connected()`` costs per candidate
    fanout: int | None = None  # memories the start entity reaches at one hop (the graph's degree count)
    scope: int | None = None  # points the vector search ranks for the agent


@dataclass(frozen=True, slots=True)
class Need:
    """The planner needs a fact first: ``fanout`` (graph) or ``scope`` (vector store)."""

    fact: Literal["fanout", "scope"]


@dataclass(frozen=True, slots=True)
class Traverse:
    """The graph store: memories reachable from the start entity (fallback: PostgreSQL mentions)."""

    traversal: GraphTraversal


@dataclass(frozen=True, slots=True)
class TextSearch:
    """The memories nearest the query, ranked by its ``legs``: the vector search under the
    pushed-down filter and the lexical search in PostgreSQL under the same scope, run in parallel
    and fused (``memoryctl.query.fusion.relevance``); either alone on request. When the vector
    store fails, the lexical leg answers alone (degraded).

    ``filter`` None: the where clauses contradict each other and nothing can match. With
    ``among_candidates`` the executor puts the ids the graph produced into both legs' scope.
    """

    filter: VectorFilter | None
    depth: int
    with_where: bool
    among_candidates: bool = False
    threshold: float | None = None
    legs: tuple[Leg, ...] = ("vector", "lexical")

    @property
    def label(self) -> str:
        return "+".join(self.legs)


@dataclass(frozen=True, slots=True)
class PostgresFilter:
    """PostgreSQL's scope + where filter, newest first.

    ``among``: every memory in scope (``all``), the graph's candidates (``candidates``), or the
    ranked hits of an earlier stage (``ranked``: a post-filter that keeps their order).
    ``tag``: the score part each row carries into fusion and the hit's sources.
    """

    among: Literal["all", "candidates", "ranked"]
    limit: int | None  # None: as many as come in (the ranked post-filter)
    with_where: bool = True
    tag: str | None = None


@dataclass(frozen=True, slots=True)
class VectorFirst:
    """Search the top ``k`` without ids, keep the connected ones; exact when ``depth`` of them are."""

    traversal: GraphTraversal
    fanout: int
    k: int
    depth: int
    search: TextSearch


@dataclass(frozen=True, slots=True)
class Plan:
    """One plan shape and its stages. Stages not used by a shape are None.

    - ``graph``: ``filter`` runs only when the traversal fell back to PostgreSQL mentions, which
      the graph store's own newest-first cut then no longer applies to.
    - ``vector`` / ``graph-first``: ``filter`` is the ranked post-filter, when the where clauses
      need one (``needs_postgres_filter``).
    - ``vector-first``: ``fallback`` is the graph-first plan of the same query.
    - ``or``: ``legs`` are (name, plan) pairs fused by RRF.
    """

    kind: PlanKind
    traverse: Traverse | None = None
    search: TextSearch | None = None
    filter: PostgresFilter | None = None
    vector_first: VectorFirst | None = None
    legs: tuple[tuple[str, Plan], ...] = ()
    fallback: Plan | None = None
    pushed: tuple[str, ...] = ()

    def describe(self, *, candidates: int | None = None, kept: int | None = None, fell_back: bool = False) -> str:
        """The plan line of ``--explain``, with the figures known once it ran.

        ``candidates``: ids the traversal produced; ``kept``: connected hits of vector-first;
        ``fell_back``: the traversal was answered by PostgreSQL mentions instead of the graph.
        """
        if self.kind == "or":
            return "or: parallel legs fused by RRF"
        if self.kind == "postgres":
            return "postgres(filter, newest first)"
        if self.kind == "vector":
            assert self.search is not None
            return f"{self.search.label}(pushdown: {', '.join(self.pushed)})"
        if self.kind == "vector-first":
            vf = self.vector_first
            assert vf is not None
            return (
                f"graph fan-out {vf.fanout} → vector-first({vf.search.label}, top {vf.k},"
                f" pushdown: {', '.join(self.pushed)}) → graph.verify → {kept} kept"
            )
        if self.kind == "graph" and not fell_back:
            return "graph(time pushed down, newest first)"
        if not candidates:
            return "graph → (no candidates)"
        if self.kind == "graph-first":
            assert self.search is not None
            terms = (self.pushed[0], f"{candidates} ids", *self.pushed[1:])
            return f"graph → {self.search.label}(pushdown: {', '.join(terms)})"
        return "graph → postgres(filter, newest first)"


def plan(q: MemoryQuery, facts: Facts | None = None, options: PlanOptions | None = None) -> Plan | Need:
    """The plan for a validated query, or the fact that must be fetched before choosing."""
    facts = facts or Facts()
    options = options or PlanOptions()
    want = depth(q)
    if q.combine == "or" and sum([q.has_vector_leg, q.graph is not None, bool(q.where)]) > 1:
        return _or(q, want)
    post = PostgresFilter("ranked", None) if needs_postgres_filter(q) else None
    if q.graph is None:
        if q.has_vector_leg:
            return Plan("vector", search=_search(q, want), filter=post, pushed=pushed_terms(q))
        return Plan("postgres", filter=PostgresFilter("all", q.limit))
    if not q.has_vector_leg:
        if not q.where:
            fallback_filter = PostgresFilter("candidates", q.limit, tag="graph")
            return Plan("graph", traverse=Traverse(traversal(q, newest_first=True)), filter=fallback_filter)
        return Plan(
            "graph-filter", traverse=Traverse(traversal(q)), filter=PostgresFilter("candidates", q.limit, tag="graph")
        )
    graph_first = Plan(
        "graph-first",
        traverse=Traverse(traversal(q)),
        search=_search(q, want, among_candidates=True),
        filter=post,
        pushed=pushed_terms(q),
    )
    if post is not None:
        return graph_first  # vector-first has no ranked post-filter
    return _vector_first(q, facts, options, graph_first)


def _search(q: MemoryQuery, want: int, *, with_where: bool = True, among_candidates: bool = False) -> TextSearch:
    return TextSearch(
        pushdown(q, with_where=with_where), want, with_where, among_candidates, q.threshold, ranking_legs(q)
    )


def ranking_legs(q: MemoryQuery) -> tuple[Leg, ...]:
    """The legs that rank a text query: a raw vector has no words, so only the vector leg."""
    if q.vector is not None or q.retrieval == "dense":
        return ("vector",)
    if q.retrieval == "lexical":
        return ("lexical",)
    return ("vector", "lexical")


def _or(q: MemoryQuery, want: int) -> Plan:
    legs: list[tuple[str, Plan]] = []
    if q.has_vector_leg:
        legs.append(("text", Plan("vector", search=_search(q, want, with_where=False))))
    if q.graph is not None:
        graph_leg = Plan(
            "graph-filter",
            traverse=Traverse(traversal(q)),
            filter=PostgresFilter("candidates", want, with_where=False, tag="graph"),
        )
        legs.append(("graph", graph_leg))
    if q.where:
        legs.append(("where", Plan("postgres", filter=PostgresFilter("all", want, tag="where"))))
    return Plan("or", legs=tuple(legs))


def _vector_first(q: MemoryQuery, facts: Facts, options: PlanOptions, graph_first: Plan) -> Plan | Need:
    assert q.graph is not None
    if not options.vector_first_min_fanout or q.graph.hops != 1 or not facts.graph_checks_cheaply:
        # Beyond one hop, checking a candidate means walking from dense intermediate nodes (an
        # author's other memories): no cheaper than the traversal. The degree count is a one-hop
        # figure too.
        return graph_first
    if facts.fanout is None:
        return Need("fanout")
    if facts.fanout < options.vector_first_min_fanout:
        return graph_first
    if facts.scope is None:
        return Need("scope")
    want = depth(q)
    k = vector_first_k(want, facts.scope, facts.fanout)
    if facts.scope <= 0 or k > options.vector_first_max_k:
        return graph_first
    search = _search(q, k)
    return Plan(
        "vector-first",
        vector_first=VectorFirst(traversal(q), facts.fanout, k, want, search),
        fallback=graph_first,
        pushed=pushed_terms(q),
    )
