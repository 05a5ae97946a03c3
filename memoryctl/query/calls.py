"""The store calls of one query, each a step of its ``--explain``.

One method per call the executor and the hydration make: it names the step, builds what the
step's detail shows (once, here, from the plan's stage), and runs the call under the store's
timeout and breaker through the query's ``QueryContext``. The callers speak in the plan's terms (a
stage, a list of ids) and never build a detail or pick a store name themselves; a store the stack
could not open raises ``StoreUnavailable`` with the reason it gave.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memoryctl.embed.base import STORE as EMBEDDER
from memoryctl.embed.base import InProcessModel
from memoryctl.errors import MemoryctlError, StoreUnavailable
from memoryctl.query import dense_question
from memoryctl.query.context import QueryContext, Running
from memoryctl.query.plan import TextSearch, Traverse
from memoryctl.query.ports import MemoryRows, RelationalReads
from memoryctl.query.pushdown import GRAPH_CANDIDATE_CAP
from memoryctl.query.spec import MemoryQuery
from memoryctl.query.turns import CONTEXT_WITHIN
from memoryctl.stores import names
from memoryctl.stores.protocols import GraphStore, VectorFilter, VectorHit, VectorStore

if TYPE_CHECKING:
    from memoryctl.embed import Embedder
    from memoryctl.model import Memory

Relationships = dict[uuid.UUID, list[dict[str, Any]]]
Leg = list[tuple[uuid.UUID, float]]  # one text leg's (id, raw score), best first

# The dense leg asks the vector store for this many hits past its depth, so that a run of equal
# scores at the cut is seen whole and cut by id (``settled``); a run longer than that is asked for
# again with twice the limit, at most TIE_REASKS times.
TIE_MARGIN = 10
TIE_REASKS = 3


@dataclasses.dataclass(frozen=True, slots=True)
class QueryStores:
    """What a query reads from: PostgreSQL's rows and relational reads, and the secondary stores
    and the embedder as the stack opens them (None: not open; ``unavailable`` says why)."""

    rows: MemoryRows
    relational: RelationalReads
    vectors: Callable[[], VectorStore | None]
    graph: Callable[[], GraphStore | None]
    embedder: Callable[[], Embedder]
    unavailable: Mapping[str, str]
    graph_name: str = names.NEO4J


class StoreCalls:
    """The calls of one query (or of one ``or`` leg: ``leg()``) to ``stores``, as steps of ``ctx``."""

    def __init__(
        self,
        stores: QueryStores,
        q: MemoryQuery,
        ctx: QueryContext,
        embedded: dict[bool, list[float] | None] | None = None,
    ) -> None:
        self.stores, self.q, self.ctx = stores, q, ctx
        # The question's vector per ``without_names``: embedded once however many searches use it.
        self._embedded = {} if embedded is None else embedded

    def leg(self) -> StoreCalls:
        """The calls of one parallel leg: its own steps, the query's degraded stores and notes."""
        return StoreCalls(self.stores, self.q, self.ctx.leg())

    def within(self, start: datetime, end: datetime) -> StoreCalls:
        """The calls of a time-scoped second search (``dates.scope``): the query's scope narrowed to
        ``[start, end)``, its steps and embedded question shared."""
        lo = start if self.q.since is None else max(start, self.q.since)
        hi = end if self.q.until is None else min(end, self.q.until)
        return StoreCalls(self.stores, dataclasses.replace(self.q, since=lo, until=hi), self.ctx, self._embedded)

    def _vectors(self) -> VectorStore:
        store = self.stores.vectors()
        if store is None:
            raise StoreUnavailable(names.QDRANT, self.stores.unavailable.get(names.QDRANT, "unavailable"))
        return store

    def _graph(self) -> GraphStore:
        store = self.stores.graph()
        if store is None:
            name = self.stores.graph_name
            raise StoreUnavailable(name, self.stores.unavailable.get(name, "unavailable"))
        return store

    # ---- facts the planner asks for --------------------------------------------------------------
    def fanout(self, stage: Traverse) -> int:
        """The start entity's one-hop fan-out; 0 when the graph cannot say (graph-first then reports it)."""
        store = self.stores.graph()
        if store is None:
            return 0
        try:
            with self.ctx.step("graph.fanout", store.name, _graph_detail(stage)) as step:
                step.rows_out = self.ctx.guard.call(store.name, lambda: store.fanout(stage.traversal))
        except MemoryctlError:
            return 0
        return step.rows_out

    def scope_size(self, agent_id: str | None) -> int | None:
        """Points the vector search ranks for this agent; None when the vector store cannot say."""
        store = self.stores.vectors()
        if store is None:
            return None
        try:
            with self.ctx.step("vector.count", store.name, {"agent": agent_id}) as step:
                step.rows_out = self.ctx.guard.call(store.name, lambda: store.count(agent_id=agent_id))
        except MemoryctlError:
            return None
        return step.rows_out

    # ---- the graph -----------------------------------------------------------------------------
    def traverse(self, stage: Traverse) -> tuple[list[uuid.UUID], bool]:
        """The memory ids the graph reaches, and whether PostgreSQL mentions answered instead
        (the graph degraded: one hop, mentions only)."""
        t = stage.traversal
        detail = _graph_detail(stage)
        if t.newest_first:
            detail.update(order="newest first", limit=t.limit, time_pushed=bool(self.q.since or self.q.until))
        graph_name = self.stores.graph_name
        try:
            store = self._graph()
            return self.ctx.call("graph.traverse", store.name, detail, lambda: store.traverse(t)), False
        except MemoryctlError as exc:
            self.ctx.degrade(
                graph_name,
                f"{graph_name} unavailable ({exc.message}); graph filter fell back to PostgreSQL mentions (1 hop)",
            )
        entity = stage.start
        ids = self.ctx.call(
            "fallback.mentions",
            names.POSTGRES,
            detail,
            lambda: self.stores.relational.mentions(self.q, entity.type, entity.name, limit=GRAPH_CANDIDATE_CAP),
        )
        return ids, True

    def start_near_entities(self, stage: Traverse) -> Running[frozenset[str] | None]:
        """The start's one-hop entity neighbours, fetched while the vector search runs."""
        store = self._graph()
        detail = {**_graph_detail(stage), "parallel_with": "vector.search"}
        return self.ctx.start("graph.near_entities", store.name, detail, lambda: store.near_entities(stage.traversal))

    def connected(
        self, stage: Traverse, candidates: Sequence[uuid.UUID], near: frozenset[str] | None
    ) -> set[uuid.UUID]:
        """Which of ``candidates`` the traversal reaches (vector-first's verification)."""
        store = self._graph()
        return self.ctx.call(
            "graph.verify",
            store.name,
            {**_graph_detail(stage), "candidates": len(candidates)},
            lambda: store.connected(stage.traversal, candidates, near=near),
            rows_in=len(candidates),
        )

    def start_relationships(self, ids: list[uuid.UUID]) -> Running[Relationships] | None:
        """The hits' relationships, asked for while PostgreSQL hydrates; None without a graph."""
        if not ids or self.ctx.is_degraded(self.stores.graph_name):
            return None
        store = self.stores.graph()
        if store is None:
            return None
        detail = {"ids": len(ids), "parallel_with": "postgres.hydrate"}
        return self.ctx.start("graph.relationships", store.name, detail, lambda: store.relationships(ids))

    def relationships(self, ids: list[uuid.UUID]) -> Relationships:
        store = self.stores.graph()
        if store is None:
            return {}
        return self.ctx.call("graph.relationships", store.name, {"ids": len(ids)}, lambda: store.relationships(ids))

    # ---- the text legs -------------------------------------------------------------------------
    def start_lexical(
        self, stage: TextSearch, ids: Sequence[uuid.UUID] | None, *, fallback: bool = False
    ) -> Running[Leg]:
        """The lexical leg in PostgreSQL, started (it runs while the query is embedded and the
        vector store searched); ``fallback``: asked for because the dense leg failed."""
        text = self.q.text
        assert text is not None  # the planner gives a raw vector no lexical leg
        detail: dict[str, Any] = {"text": text, "limit": stage.depth, "ids": len(ids) if ids is not None else None}
        if "vector" in stage.legs and not fallback:
            detail["parallel_with"] = "vector.search"
        relational = self.stores.relational
        return self.ctx.start(
            "fallback.lexical" if fallback else "lexical.search",
            names.POSTGRES,
            detail,
            lambda: relational.lexical(self.q, text, limit=stage.depth, ids=ids, with_where=stage.with_where),
        )

    def dense(self, stage: TextSearch, ids: Sequence[uuid.UUID] | None, *, fallback: bool = False) -> Leg:
        """The vector search under the stage's filter (with ``ids`` when the stage ranks the
        graph's candidates); ``fallback``: asked for because the lexical leg failed."""
        assert stage.filter is not None
        flt = dataclasses.replace(stage.filter, ids=ids) if stage.among_candidates else stage.filter
        store = self._vectors()
        embedder = self.stores.embedder()
        model_id = embedder.info.model_id
        vector = list(self.q.vector) if self.q.vector is not None else self._embed(stage, embedder)
        if vector is None:
            return []
        detail = {
            "model": model_id,
            "limit": stage.depth,
            "asked": stage.depth + TIE_MARGIN,
            "filter": _filter_detail(flt),
            "threshold": stage.threshold,
        }

        def search(limit: int) -> list[VectorHit]:
            return store.search(vector, flt, limit, model_id=model_id, score_threshold=stage.threshold)

        return self.ctx.call(
            "fallback.vector" if fallback else "vector.search",
            store.name,
            detail,
            lambda: settled_search(search, stage.depth),
            rows_in=len(ids) if ids is not None else None,
        )

    def _embed(self, stage: TextSearch, embedder: Embedder) -> list[float] | None:
        """The question, without the names of entities it says when the stage says so
        (``query/dense_question.py``); None when the model sees nothing in it (only emoji or
        characters it has no token for: every such text is the same vector, which would score
        cosine 1.0 against any memory of only such characters), and the dense leg then has nothing
        to rank by."""
        if stage.without_names not in self._embedded:
            self._embedded[stage.without_names] = self._embed_now(stage, embedder)
        return self._embedded[stage.without_names]

    def _embed_now(self, stage: TextSearch, embedder: Embedder) -> list[float] | None:
        asked = self.q.text
        assert asked is not None
        text = self._without_names(asked) if stage.without_names else asked
        detail: dict[str, Any] = {"model": embedder.info.model_id}
        if text != asked:
            detail["text"] = text
        if not embedder.informative(text):
            self.ctx.note(
                "the question holds nothing the embedding model has a token for (emoji, unknown"
                " characters): the dense leg did not rank"
            )
            return None
        if isinstance(embedder, InProcessModel):
            embedder.load()  # the first query of a process loads the model: not charged to the timeout
        with self.ctx.step("embed.query", EMBEDDER, detail):
            # Under the timeout and breaker a store has: an embedder that does not answer (a lost
            # GPU node: the http embedder's own timeout and retries add up to minutes) costs the
            # query its timeout, and the dense leg degrades to the lexical one.
            vector: list[float] = self.ctx.guard.call(EMBEDDER, lambda: embedder.embed_query(text).tolist())
            return vector

    def _without_names(self, text: str) -> str:
        """``text`` without the entity names it says, when anything else is left. A failed lookup
        costs the answer nothing but this: the whole question is embedded."""
        relational = self.stores.relational
        try:
            detail = {"agent": self.q.agent_id}
            said = self.ctx.call("postgres.names", names.POSTGRES, detail, lambda: relational.names_said(self.q, text))
        except MemoryctlError as exc:
            self.ctx.note(f"entity names not looked up ({exc.message}): the dense leg embedded the whole question")
            return text
        return dense_question.without(text, said) or text

    # ---- PostgreSQL ----------------------------------------------------------------------------
    def filter(
        self, ids: Sequence[uuid.UUID] | None, *, limit: int, with_where: bool = True
    ) -> list[tuple[uuid.UUID, datetime]]:
        """PostgreSQL's scope (+ where) filter, newest first, among ``ids`` when given."""
        detail = {
            "where": [f"{w.field} {w.op}" for w in self.q.where] if with_where else [],
            "time": bool(self.q.since or self.q.until),
            "ids": len(ids) if ids is not None else None,
            "limit": limit,
        }
        relational = self.stores.relational
        return self.ctx.call(
            "postgres.filter",
            names.POSTGRES,
            detail,
            lambda: relational.filter(self.q, ids=ids, limit=limit, with_where=with_where),
            rows_in=len(ids) if ids is not None else None,
        )

    def following(self, ids: list[uuid.UUID], turns: int) -> dict[uuid.UUID, list[uuid.UUID]]:
        """Per memory of ``ids``: the memories written just after it (``query/turns.py``)."""
        detail = {"ids": len(ids), "turns": turns, "within_s": CONTEXT_WITHIN.total_seconds()}
        relational = self.stores.relational
        return self.ctx.call(
            "postgres.context",
            names.POSTGRES,
            detail,
            lambda: relational.following(self.q, ids, turns=turns, within=CONTEXT_WITHIN),
            rows_in=len(ids),
        )

    def hydrate(self, ids: list[uuid.UUID]) -> dict[uuid.UUID, Memory]:
        """The live rows, PostgreSQL being the truth."""
        rows = self.stores.rows
        return self.ctx.call(
            "postgres.hydrate",
            names.POSTGRES,
            {"ids": len(ids)},
            lambda: rows.get_many(ids, include_deleted=False),
            rows_in=len(ids),
        )


def settled(hits: Sequence[VectorHit], depth: int) -> Leg:
    """The store's hits, best first, with every run of equal scores ordered by id, cut at ``depth``.

    The vector store returns equal scores (the same text said twice has the same vector, so the same
    cosine) in an order of its own, which for Qdrant Edge differs between processes; where such a
    run straddles the depth, which of its members are candidates, and with them the standardisation
    of the whole window (``fusion.relevance``), changed from one run to the next. By id, as the
    lexical statement breaks its ties (after the time), the same store contents give the same leg.
    """
    out: Leg = []
    run: list[VectorHit] = []
    for h in hits:
        if run and h.score != run[0].score:
            out.extend((r.id, r.score) for r in sorted(run, key=lambda r: r.id))
            run = []
        run.append(h)
    out.extend((r.id, r.score) for r in sorted(run, key=lambda r: r.id))
    return out[:depth]


def settled_search(search: Callable[[int], list[VectorHit]], depth: int) -> Leg:
    """``search(limit)`` asked for ``depth + TIE_MARGIN`` hits, and again with twice the limit while
    the run of scores equal to the one at the cut reaches the end of what came back (more of it
    may lie past the limit), at most ``TIE_REASKS`` times; then ``settled``. Of a longer run, the
    members the store returned last are cut by id: which those are is still the store's choice."""
    if depth <= 0:
        return []
    limit = depth + TIE_MARGIN
    hits = search(limit)
    for _ in range(TIE_REASKS):
        if len(hits) < limit or hits[depth - 1].score != hits[-1].score:
            break
        limit *= 2
        hits = search(limit)
    return settled(hits, depth)


def _graph_detail(stage: Traverse) -> dict[str, Any]:
    t = stage.traversal
    return {"start": stage.start.as_dict(), "via": list(t.relation_types), "hops": t.hops, "direction": t.direction}


def _filter_detail(flt: VectorFilter) -> dict[str, Any]:
    return {
        "agent": flt.agent_id,
        "ids": len(flt.ids) if flt.ids is not None else None,
        "kinds": flt.kinds,
        "exclude_kinds": flt.exclude_kinds,
        "time": [t.isoformat() if t else None for t in (flt.created_from, flt.created_to)],
        "meta": [f"{m.key} {m.op} {m.value!r}" for m in flt.meta],
    }
