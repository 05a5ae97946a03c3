"""The query plan as a value: which stores are asked what, in which order, decided in one place.

``plan(query, facts, options)`` is a pure function. It returns a ``Plan`` that the executor
(``memoryctl.query.executor``) runs and ``--explain`` prints, or a ``Need`` when the choice depends
on something only a store can say (the start entity's fan-out, the size of the agent's scope); the
engine asks the store and calls ``plan`` again with the answer in ``Facts``. Nothing here talks
to a store, so every plan shape is unit-tested without one.

A ``Plan`` is a ``shape`` (a tagged union: one class per shape below, each holding exactly the
stages it runs) and the ``ranking`` rule that orders its hydrated candidates (``ByRelevance``,
``ByFusedRank``, ``NewestFirst``, applied by ``memoryctl.query.ranking``). The executor matches on
the shape's class and the ranking on the rule's; neither guesses either from what is empty.

Plan shapes (docs/retrieval.md, "Plan shapes"):

- ``vector`` (``VectorSearch``): text (+ where/time) → one vector search with everything the payload holds pushed
  into its filter, and in parallel the lexical search in PostgreSQL under the same scope; the two
  rankings are fused (hybrid retrieval, ``TextSearch``). PostgreSQL then only hydrates. Where
  clauses the payload cannot answer exactly (``agent_id``/``created_at`` with ``!=``/``in``) are
  checked in PostgreSQL afterwards. Every shape below that has text runs the same two legs.
- ``graph-first`` (``GraphFirst``): text + graph → traverse → candidate ids → one vector search whose filter
  carries the ids (chunked by the adapter), the agent, the time range and every where clause.
- ``vector-first`` (``VectorFirst``): text + graph at one hop when the start entity reaches many memories (the
  graph's degree count says so without traversing): the same vector search without ids for the
  top K, then the graph checks which of those K are connected. Exact as soon as enough of them
  are (every memory outside the top K scores lower than all of them); otherwise the executor runs
  the plan's ``fallback``, graph-first. A high fan-out traversal (20k ids) is the most expensive
  thing a query can do; this plan never runs it.
- ``graph`` (``GraphOnly``): graph only → the graph store applies the time range, orders newest first and cuts.
- ``graph-filter`` (``GraphThenPostgres``): graph + where, no text → traverse → PostgreSQL filters the candidates.
- ``postgres`` (``PostgresOnly``): where and/or time only → PostgreSQL alone, newest first.
- ``or`` (``AnyOf``): every leg (vector, graph, where) is a shape of its own; they run in parallel and their
  rankings are fused with RRF.

A leg that fails falls back where a fallback exists (vector search → PostgreSQL full-text;
traversal → the ``entities`` column, one hop); those are properties of the stages, applied by the
executor, and named in the answer's ``degraded`` list.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import ClassVar, Literal

from memoryctl.model import EntityRef
from memoryctl.query import dates
from memoryctl.query.dates import Window
from memoryctl.query.pushdown import depth, needs_postgres_filter, pushdown, pushed_terms, traversal
from memoryctl.query.spec import MemoryQuery
from memoryctl.query.turns import CONTEXT_TURNS
from memoryctl.stores.protocols import GraphTraversal, VectorFilter

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
Scope = tuple[datetime, datetime]  # [from, to): a time-scoped second text search (``dates.scope``)


def vector_first_k(want: int, scope: int, fanout: int) -> int:
    """Top K for vector-first: enough that ~SAFETY x ``want`` connected memories are expected in it.

    A memory of the agent's ``scope`` is connected with probability about ``fanout / scope``, so
    the top K holds about ``K * fanout / scope`` connected ones; never fewer than 4 x ``want``.
    """
    return max(4 * want, math.ceil(want * max(scope, 1) / fanout * VECTOR_FIRST_SAFETY))


# ---- the stages ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """The planner's settings (``[query]`` in the config)."""

    vector_first_min_fanout: int = VECTOR_FIRST_MIN_FANOUT  # 0 = never vector-first
    vector_first_max_k: int = VECTOR_FIRST_MAX_K
    context_turns: int = CONTEXT_TURNS  # a text ranking's conversational context (0: none)
    dense_without_names: bool = True  # the dense leg embeds the question without the names it says
    dated: bool = True  # prefer the memories written at the times the question names
    sessions: bool = True  # a text ranking's session-level context (query/sessions.py)


@dataclass(frozen=True, slots=True)
class Facts:
    """What the stores said that the choice depends on; None = not asked (yet).

    A store that could not answer is recorded as 0, which the planner treats as "no vector-first":
    graph-first then reports the failure itself and falls back.
    """

    graph_checks_cheaply: bool = False  # a graph store is open and ``connected()`` costs per candidate
    fanout: int | None = None  # memories the start entity reaches at one hop (the graph's degree count)
    scope: int | None = None  # points the vector search ranks for the agent
    now: datetime | None = None  # when the question is asked: "last week" means the week before it


@dataclass(frozen=True, slots=True)
class Need:
    """The planner needs a fact first: ``fanout`` (the graph's degree count of ``traverse``'s start)
    or ``scope`` (the vector store's point count for the agent)."""

    fact: Literal["fanout", "scope"]
    traverse: Traverse | None = None


@dataclass(frozen=True, slots=True)
class Traverse:
    """The graph store: memories reachable from ``start`` (fallback: PostgreSQL mentions of it, one
    hop)."""

    start: EntityRef
    traversal: GraphTraversal


@dataclass(frozen=True, slots=True)
class TextSearch:
    """The memories nearest the query, ranked by its ``legs``: the vector search under the
    pushed-down filter and the lexical search in PostgreSQL under the same scope, run in parallel
    and fused (``memoryctl.query.fusion.relevance``); either alone on request. When the vector
    store fails, the lexical leg answers alone (degraded).

    ``filter`` None: the where clauses contradict each other and nothing can match. With
    ``among_candidates`` the executor puts the ids the graph produced into both legs' scope.
    ``without_names``: the dense leg embeds the question without the entity names it says
    (``query/dense_question.py``). ``within``: the question names a time, and the same legs are
    asked again, to the same depth, within it (``dates.scope``); the ranking reads the candidates
    of both searches (``executor.search``). Vector-first does not ask again (its exactness is
    that of one search): a dated question about a high fan-out entity ranks its first search.
    """

    filter: VectorFilter | None
    depth: int
    with_where: bool
    among_candidates: bool = False
    threshold: float | None = None
    legs: tuple[Leg, ...] = ("vector", "lexical")
    without_names: bool = True
    within: Scope | None = None

    @property
    def label(self) -> str:
        return "+".join(self.legs)


@dataclass(frozen=True, slots=True)
class PostgresFilter:
    """PostgreSQL's scope (+ where) filter, newest first, cut at ``limit``: over every memory in
    scope or over the graph's candidates, as the shape says. ``tag``: the score part each row
    carries into fusion and the hit's sources."""

    limit: int
    with_where: bool = True
    tag: str | None = None


# ---- the shapes: one class per row of docs/retrieval.md's "Plan shapes" table ------------------


@dataclass(frozen=True, slots=True)
class VectorSearch:
    """``vector``: the text search with everything the payload holds pushed into its filter;
    ``recheck``: the where clauses the payload cannot answer exactly are checked in PostgreSQL on
    the ranked hits afterwards (``needs_postgres_filter``)."""

    search: TextSearch
    recheck: bool
    pushed: tuple[str, ...]
    kind: ClassVar[str] = "vector"

    def describe(self, figures: Figures) -> str:
        return f"{self.search.label}(pushdown: {', '.join(self.pushed)})"


@dataclass(frozen=True, slots=True)
class GraphFirst:
    """``graph-first``: traverse, then the text search among the candidates (and ``recheck``)."""

    traverse: Traverse
    search: TextSearch
    recheck: bool
    pushed: tuple[str, ...]
    kind: ClassVar[str] = "graph-first"

    def describe(self, figures: Figures) -> str:
        if not figures.candidates:
            return "graph → (no candidates)"
        terms = (self.pushed[0], f"{figures.candidates} ids", *self.pushed[1:])
        return f"graph → {self.search.label}(pushdown: {', '.join(terms)})"


@dataclass(frozen=True, slots=True)
class VectorFirst:
    """``vector-first``: search the top ``k`` without ids, keep the connected ones; exact when
    ``depth`` of them are, else ``fallback`` (graph-first of the same query) runs instead."""

    traverse: Traverse
    fanout: int
    k: int
    depth: int
    search: TextSearch
    fallback: GraphFirst
    pushed: tuple[str, ...]
    kind: ClassVar[str] = "vector-first"

    def describe(self, figures: Figures) -> str:
        return (
            f"graph fan-out {self.fanout} → vector-first({self.search.label}, top {self.k},"
            f" pushdown: {', '.join(self.pushed)}) → graph.verify → {figures.kept} kept"
        )


@dataclass(frozen=True, slots=True)
class GraphOnly:
    """``graph``: the graph store applies the time range, orders newest first and cuts. When the
    traversal falls back to PostgreSQL mentions, ``fallback`` orders and cuts the candidates."""

    traverse: Traverse
    fallback: PostgresFilter
    kind: ClassVar[str] = "graph"

    def describe(self, figures: Figures) -> str:
        if not figures.fell_back:
            return "graph(time pushed down, newest first)"
        return "graph → postgres(filter, newest first)" if figures.candidates else "graph → (no candidates)"


@dataclass(frozen=True, slots=True)
class GraphThenPostgres:
    """``graph-filter``: traverse, then PostgreSQL filters the candidates, newest first."""

    traverse: Traverse
    filter: PostgresFilter
    kind: ClassVar[str] = "graph-filter"

    def describe(self, figures: Figures) -> str:
        return "graph → postgres(filter, newest first)" if figures.candidates else "graph → (no candidates)"


@dataclass(frozen=True, slots=True)
class PostgresOnly:
    """``postgres``: where and/or time only: PostgreSQL alone, newest first."""

    filter: PostgresFilter
    kind: ClassVar[str] = "postgres"

    def describe(self, figures: Figures) -> str:
        return "postgres(filter, newest first)"


@dataclass(frozen=True, slots=True)
class AnyOf:
    """``or``: every leg is a shape of its own; they run in parallel, fused by RRF."""

    legs: tuple[tuple[str, LegShape], ...]
    kind: ClassVar[str] = "or"

    def describe(self, figures: Figures) -> str:
        return "or: parallel legs fused by RRF"


LegShape = VectorSearch | GraphThenPostgres | PostgresOnly
Shape = VectorSearch | GraphFirst | VectorFirst | GraphOnly | GraphThenPostgres | PostgresOnly | AnyOf


@dataclass(frozen=True, slots=True)
class Figures:
    """What a shape's ``--explain`` line says once it ran: ``candidates``, ids the traversal
    produced; ``kept``, connected hits of vector-first; ``fell_back``, the traversal was answered by
    PostgreSQL mentions instead of the graph."""

    candidates: int | None = None
    kept: int | None = None
    fell_back: bool = False


# ---- the ranking rules: how the hydrated candidates of a shape are ordered ---------------------


@dataclass(frozen=True, slots=True)
class ByRelevance:
    """A text ranking (``memoryctl.query.ranking``): the fused relevance, with the named-entity leg
    when the question has words (``named``), each candidate read with its conversational context
    (``context_turns``, 0: none; ``context_adds``: the turns written just after a candidate may
    join, not under a graph filter or a threshold they were not checked against), and recency
    within a band when ``half_life`` is set; ``dated``: the times the question names
    (``query/dates.py``), a preference for the memories written then; ``sessions``: the support of
    each candidate's session (``query/sessions.py``)."""

    half_life: timedelta | None = None
    named: bool = True
    context_turns: int = 0
    context_adds: bool = True
    dated: tuple[Window, ...] = ()
    sessions: bool = False


@dataclass(frozen=True, slots=True)
class ByFusedRank:
    """``or``: the legs' reciprocal rank fusion, ties newest first."""


@dataclass(frozen=True, slots=True)
class NewestFirst:
    """Shapes without a text ranking: every hit scores 1.0, newest first."""


Ranking = ByRelevance | ByFusedRank | NewestFirst


@dataclass(frozen=True, slots=True)
class Plan:
    """One query's plan: the ``shape`` the executor runs, the ``ranking`` that orders its hydrated
    candidates, the first ``window`` of which are hydrated and ranked for ``limit`` hits."""

    shape: Shape
    ranking: Ranking
    window: int
    limit: int

    @property
    def kind(self) -> str:
        return self.shape.kind

    def describe(self, figures: Figures | None = None) -> str:
        """The plan line of ``--explain``, with the figures known once it ran."""
        return self.shape.describe(figures or Figures())


# ---- the planner -------------------------------------------------------------------------------


def plan(q: MemoryQuery, facts: Facts | None = None, options: PlanOptions | None = None) -> Plan | Need:
    """The plan for a validated query (its half-life resolved), or the fact that must be fetched
    before choosing."""
    facts = facts or Facts()
    options = options or PlanOptions()
    named = _named_times(q, options, facts.now)
    want = depth(q)
    # A time preference reorders what the legs return: the text search looks again within the
    # named time (``dates.scope``) and the ranking reads both searches' candidates; an ``or``
    # query ranks by RRF, which no preference reorders.
    within = dates.scope(named) if named and not _is_or(q) else None
    chosen = _shape(q, facts, options, want, within)
    if isinstance(chosen, Need):
        return chosen
    ranking = _ranking(q, chosen, options, named)
    wide = within is not None or (isinstance(ranking, ByRelevance) and q.text is not None and asks_for_a_list(q.text))
    return Plan(chosen, ranking, want * 2 if wide else want, q.limit)


# What/which followed by a plural noun (or are/were): "What activities has Melanie done?", "Which
# countries ...", "What kinds of books ...", "What are her hobbies?". Words ending in s that are no
# plural nouns are excluded by ending (-ss, -us, -is) or by name (short function words).
_LIST_CUE = re.compile(r"\b(?:what|which)\s+(?:(?:kinds?|types?|sorts?)\s+of\s+)?(\w+)", re.IGNORECASE)
_NOT_PLURAL = frozenset({"does", "has", "his", "this", "its", "yes", "thus"})


def asks_for_a_list(text: str) -> bool:
    """Whether a question asks for several things (a plural after *what*/*which*, or *what are*):
    its answer is spread over several memories, not one, so the ranking reads every candidate the
    two text legs returned (their union, up to twice ``depth``) instead of the first ``depth`` of
    their fusion: the ranking's own legs (the named entity, the session, the context) lift some of
    the answer's parts from below the fusion's cut. Nothing is searched deeper and no store is
    asked again; only the hydration reads more ids.

    General: the cue is the question's grammar, not a benchmark's wording, and a list question
    is the one whose answers compete for the top 10 with each other (what it was measured at, and
    the whole union for every question: docs/retrieval.md, "List questions")."""
    for m in _LIST_CUE.finditer(text):
        word = m.group(1).casefold()
        if word in ("are", "were"):
            return True
        if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")) and word not in _NOT_PLURAL:
            return True
    return False


def _named_times(q: MemoryQuery, options: PlanOptions, now: datetime | None) -> tuple[Window, ...]:
    """The times the question names (``query/dates.py``), when the ranking prefers them."""
    return tuple(dates.windows(q.text, now)) if q.text is not None and options.dated else ()


def _is_or(q: MemoryQuery) -> bool:
    """An ``or`` of more than one leg: the legs run apart and are fused by RRF."""
    return q.combine == "or" and sum([q.has_vector_leg, q.graph is not None, bool(q.where)]) > 1


def _ranking(q: MemoryQuery, shape: Shape, options: PlanOptions, named: tuple[Window, ...]) -> Ranking:
    if isinstance(shape, AnyOf):
        return ByFusedRank()
    if isinstance(shape, VectorSearch | GraphFirst | VectorFirst):
        return ByRelevance(
            half_life=q.half_life if q.decay else None,
            named=q.text is not None,
            context_turns=options.context_turns if q.text is not None else 0,
            context_adds=q.graph is None and q.threshold is None,
            dated=named,
            sessions=options.sessions and q.text is not None,
        )
    return NewestFirst()


def _shape(q: MemoryQuery, facts: Facts, options: PlanOptions, want: int, within: Scope | None = None) -> Shape | Need:
    if _is_or(q):
        return _or(q, want, options)
    recheck = needs_postgres_filter(q)
    if q.graph is None:
        if q.has_vector_leg:
            return VectorSearch(_search(q, want, options, within=within), recheck, pushed_terms(q))
        return PostgresOnly(PostgresFilter(q.limit))
    if not q.has_vector_leg:
        if not q.where:
            return GraphOnly(_traverse(q, newest_first=True), PostgresFilter(q.limit, tag="graph"))
        return GraphThenPostgres(_traverse(q), PostgresFilter(q.limit, tag="graph"))
    search = _search(q, want, options, among_candidates=True, within=within)
    graph_first = GraphFirst(_traverse(q), search, recheck, pushed_terms(q))
    if recheck:
        return graph_first  # vector-first has no ranked post-filter
    return _vector_first(q, facts, options, graph_first)


def _traverse(q: MemoryQuery, *, newest_first: bool = False) -> Traverse:
    assert q.graph is not None
    return Traverse(q.graph.entity, traversal(q, newest_first=newest_first))


def _search(
    q: MemoryQuery,
    want: int,
    options: PlanOptions,
    *,
    with_where: bool = True,
    among_candidates: bool = False,
    within: Scope | None = None,
) -> TextSearch:
    return TextSearch(
        pushdown(q, with_where=with_where),
        want,
        with_where,
        among_candidates,
        q.threshold,
        ranking_legs(q),
        options.dense_without_names,
        within,
    )


def ranking_legs(q: MemoryQuery) -> tuple[Leg, ...]:
    """The legs that rank a text query: a raw vector has no words, so only the vector leg."""
    if q.vector is not None or q.retrieval == "dense":
        return ("vector",)
    if q.retrieval == "lexical":
        return ("lexical",)
    return ("vector", "lexical")


def _or(q: MemoryQuery, want: int, options: PlanOptions) -> AnyOf:
    legs: list[tuple[str, LegShape]] = []
    if q.has_vector_leg:
        legs.append(("text", VectorSearch(_search(q, want, options, with_where=False), False, ())))
    if q.graph is not None:
        legs.append(("graph", GraphThenPostgres(_traverse(q), PostgresFilter(want, with_where=False, tag="graph"))))
    if q.where:
        legs.append(("where", PostgresOnly(PostgresFilter(want, tag="where"))))
    return AnyOf(tuple(legs))


def _vector_first(q: MemoryQuery, facts: Facts, options: PlanOptions, graph_first: GraphFirst) -> Shape | Need:
    assert q.graph is not None
    if not options.vector_first_min_fanout or q.graph.hops != 1 or not facts.graph_checks_cheaply:
        # Beyond one hop, checking a candidate means walking from dense intermediate nodes (an
        # author's other memories): no cheaper than the traversal. The degree count is a one-hop
        # figure too.
        return graph_first
    if facts.fanout is None:
        return Need("fanout", graph_first.traverse)
    if facts.fanout < options.vector_first_min_fanout:
        return graph_first
    if facts.scope is None:
        return Need("scope")
    want = graph_first.search.depth
    k = vector_first_k(want, facts.scope, facts.fanout)
    if facts.scope <= 0 or k > options.vector_first_max_k:
        return graph_first
    return VectorFirst(
        graph_first.traverse, facts.fanout, k, want, _search(q, k, options), graph_first, pushed_terms(q)
    )
