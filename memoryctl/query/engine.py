"""The executor: runs the ``Plan`` that ``memoryctl.query.plan`` chose, then hydrates and ranks.

Every store call goes through the query's ``QueryContext`` (timeout + breaker, one timed step).
Text is searched by two legs in parallel under one scope, the vector search and the lexical
search in PostgreSQL, fused into one relevance (``memoryctl.query.fusion``); when one leg fails
(the vector store, or the lexical statement times out) the other ranks alone, and when the graph
fails the graph filter falls back to the ``entities`` column (one hop, mentions only). Either way
the result names what was degraded. PostgreSQL is the truth: hydration drops whatever a lagging
secondary store still returns for a deleted or out-of-scope memory. Recency, when a half-life is
set, is a bounded preference among comparably relevant hits (``fusion.rank_score``); without one
(the default) relevance alone ranks. ``threshold`` is a floor on cosine similarity inside the
vector search.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from memoryctl.errors import MemoryctlError, StoreUnavailable
from memoryctl.query import named
from memoryctl.query.context import QueryContext, Running
from memoryctl.query.fusion import (
    RRF_K,
    names_any,
    rank_score,
    recency,
    relevance,
    rrf,
    spread,
    text_scales,
    with_named,
)
from memoryctl.query.guard import Guard
from memoryctl.query.plan import (
    GRAPH_CANDIDATE_CAP,
    Facts,
    Need,
    Plan,
    PlanOptions,
    PostgresFilter,
    TextSearch,
    Traverse,
    VectorFirst,
    depth,
    plan,
    traversal,
)
from memoryctl.query.ports import MemoryRows, RecallLog, RelationalReads
from memoryctl.query.results import Hit, QueryResult
from memoryctl.query.spec import MemoryQuery
from memoryctl.query.turns import CONTEXT_TURNS, CONTEXT_WITHIN, in_context
from memoryctl.stores import names
from memoryctl.stores.protocols import GraphStore, VectorStore

if TYPE_CHECKING:
    from memoryctl.embed import Embedder
    from memoryctl.model import Memory

Ranked = list[tuple[uuid.UUID, dict[str, float]]]
Relationships = dict[uuid.UUID, list[dict[str, Any]]]
Legs = dict[str, list[tuple[uuid.UUID, float]]]  # per text leg: (id, raw score), best first
Scored = list[tuple["Memory", dict[str, float]]]  # hydrated candidates and their scores
SCOPE_TTL_S = 60.0  # how long an agent's point count is trusted for vector-first sizing


@dataclasses.dataclass(slots=True)
class _Ran:
    """The runtime figures of a plan's run that its description needs."""

    plan: Plan  # the plan that ran: the chosen one, or its fallback
    ranked: Ranked
    candidates: int | None = None
    kept: int | None = None
    fell_back: bool = False

    def describe(self) -> str:
        return self.plan.describe(candidates=self.candidates, kept=self.kept, fell_back=self.fell_back)


@dataclasses.dataclass(slots=True)
class _Turns:
    """The candidates' conversational context: per memory, the candidates written just before it;
    and the memories that joined the candidates as a candidate's following turns."""

    before: dict[uuid.UUID, list[uuid.UUID]] = dataclasses.field(default_factory=dict)
    added: set[uuid.UUID] = dataclasses.field(default_factory=set)


class QueryEngine:
    def __init__(
        self,
        rows: MemoryRows,
        relational: RelationalReads,
        *,
        vectors: Callable[[], VectorStore | None],
        graph: Callable[[], GraphStore | None],
        embedder: Callable[[], Embedder],
        guard: Guard,
        unavailable: dict[str, str],
        default_half_life: Callable[[str | None], timedelta | None] = lambda agent: None,
        recalls: RecallLog | None = None,
        graph_name: str = names.NEO4J,
        options: PlanOptions | None = None,
        context_turns: int = CONTEXT_TURNS,
        names_out_of_dense: bool = True,
    ) -> None:
        self.rows = rows
        self.relational = relational
        self._vectors = vectors
        self._graph = graph
        self._embedder = embedder
        self.guard = guard
        self.unavailable = unavailable
        self.default_half_life = default_half_life
        self.recalls = recalls
        self.graph_name = graph_name
        self.options = options or PlanOptions()
        self.context_turns = context_turns
        self.names_out_of_dense = names_out_of_dense
        self._scope: dict[str | None, tuple[float, int]] = {}  # agent -> (monotonic time, points)

    # ---- entry --------------------------------------------------------------------------------
    def run(self, q: MemoryQuery) -> QueryResult:
        q.validate()
        if not q.decay:
            q.half_life = None
        elif q.half_life is None:
            q.half_life = self.default_half_life(q.agent_id)
        t0 = time.perf_counter()
        ctx = QueryContext(self.guard)
        chosen = self.choose(q, ctx)
        ran = self._run(chosen, q, ctx)
        hits = self._hydrate(q, ran.ranked, ctx)
        result = QueryResult(hits, sorted(set(ctx.degraded)), ran.describe(), ctx.steps, q, notes=ctx.notes)
        result.ms = (time.perf_counter() - t0) * 1000
        if self.recalls is not None and hits:
            self._record(q, hits)
        return result

    def choose(self, q: MemoryQuery, ctx: QueryContext) -> Plan:
        """Ask ``plan`` until it stops needing facts; fetch each fact it asks for (a store call)."""
        store = self._graph() if q.graph is not None else None
        facts = Facts(graph_checks_cheaply=bool(store is not None and store.cheap_membership))
        while isinstance(chosen := plan(q, facts, self.options), Need):
            if chosen.fact == "fanout":
                facts = dataclasses.replace(facts, fanout=self._fanout(q, ctx))
            else:
                facts = dataclasses.replace(facts, scope=self._scope_size(q.agent_id, ctx))
        return chosen

    # ---- plans --------------------------------------------------------------------------------
    def _run(self, p: Plan, q: MemoryQuery, ctx: QueryContext) -> _Ran:
        if p.kind == "or":
            return _Ran(p, self._or(p, q, ctx))
        if p.kind == "vector-first":
            assert p.vector_first is not None and p.fallback is not None
            found = self._vector_first(p.vector_first, q, ctx)
            if found is None:
                return self._run(p.fallback, q, ctx)
            connected, kept = found
            return _Ran(p, kept, kept=connected)
        if p.traverse is None:
            ranked = self._search(p.search, q, ctx) if p.search is not None else []
            return _Ran(p, self._filtered(p.filter, q, ctx, ranked))
        ids, fell_back = self._traverse(p.traverse, q, ctx)
        if p.kind == "graph" and not fell_back:
            return _Ran(p, [(i, {"graph": 1.0}) for i in ids], candidates=len(ids))
        ran = _Ran(p, [], candidates=len(ids), fell_back=fell_back)
        if ids and p.search is not None:
            ranked = [(i, {**s, "graph": 1.0}) for i, s in self._search(p.search, q, ctx, ids)]
            ran.ranked = self._filtered(p.filter, q, ctx, ranked)
        elif ids:
            assert p.filter is not None
            ran.ranked = self._filtered(p.filter, q, ctx, [], ids)
        return ran

    def _filtered(
        self,
        stage: PostgresFilter | None,
        q: MemoryQuery,
        ctx: QueryContext,
        ranked: Ranked,
        candidates: list[uuid.UUID] | None = None,
    ) -> Ranked:
        """Run a PostgreSQL filter stage: a post-filter of ``ranked`` or the stage's own ranking."""
        if stage is None:
            return ranked
        if stage.among == "ranked":
            if not ranked:
                return ranked
            keep = {i for i, _ in self._pg_filter(stage, q, ctx, [i for i, _ in ranked], len(ranked))}
            return [(i, s) for i, s in ranked if i in keep]
        rows = self._pg_filter(stage, q, ctx, candidates if stage.among == "candidates" else None, stage.limit)
        tag = {stage.tag: 1.0} if stage.tag else {}
        return [(i, dict(tag)) for i, _ in rows]

    def _or(self, p: Plan, q: MemoryQuery, ctx: QueryContext) -> Ranked:
        legs: dict[str, Ranked] = {}
        contexts = {name: ctx.leg() for name, _ in p.legs}

        def run_leg(name: str, leg: Plan) -> None:
            try:
                legs[name] = self._run(leg, q, contexts[name]).ranked
            except MemoryctlError as exc:
                legs[name] = []
                ctx.note(f"{name} leg failed: {exc.message}")

        threads = [threading.Thread(target=run_leg, args=leg, daemon=True) for leg in p.legs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for name, _ in p.legs:
            ctx.steps.extend(contexts[name].steps)
        # The graph and where legs are sets (their newest-first order is not relevance): only the
        # text leg ranks; membership in more legs lifts a memory (fusion.rrf).
        fused = rrf({name: [i for i, _ in res] for name, res in legs.items()}, membership=frozenset({"graph", "where"}))
        raw = {name: dict(res) for name, res in legs.items()}
        ranked: Ranked = []
        for mid, parts in fused.items():
            scores: dict[str, float] = {}
            for name in parts:
                scores.update(raw[name][mid])
            scores["rrf"] = sum(parts.values())
            ranked.append((mid, scores))
        ranked.sort(key=lambda pair: -pair[1]["rrf"])
        with ctx.step(
            "fuse", "engine", {"method": "rrf", "k": RRF_K, "legs": {n: len(r) for n, r in legs.items()}}
        ) as s:
            s.rows_in, s.rows_out = sum(len(r) for r in legs.values()), len(ranked)
        return ranked

    # ---- vector-first -------------------------------------------------------------------------
    def _fanout(self, q: MemoryQuery, ctx: QueryContext) -> int:
        """The start entity's one-hop fan-out; 0 when the graph cannot say (graph-first then reports it)."""
        store = self._graph()
        if store is None:
            return 0
        detail = _graph_detail(q)
        try:
            with ctx.step("graph.fanout", store.name, detail) as step:
                step.rows_out = self.guard.call(store.name, lambda: store.fanout(traversal(q)))
        except MemoryctlError:
            return 0
        return step.rows_out

    def _scope_size(self, agent_id: str | None, ctx: QueryContext) -> int:
        """Points the vector search ranks for this agent (cached briefly: a sizing estimate)."""
        now = time.monotonic()
        cached = self._scope.get(agent_id)
        if cached is not None and now - cached[0] < SCOPE_TTL_S:
            return cached[1]
        store = self._vectors()
        if store is None:
            return 0
        try:
            with ctx.step("vector.count", store.name, {"agent": agent_id}) as step:
                step.rows_out = self.guard.call(store.name, lambda: store.count(agent_id=agent_id))
        except MemoryctlError:
            return 0
        self._scope[agent_id] = (now, step.rows_out)
        return step.rows_out

    def _vector_first(self, vf: VectorFirst, q: MemoryQuery, ctx: QueryContext) -> tuple[int, Ranked] | None:
        """How many of the top K are connected and the best of them, or None when that cannot be
        the exact answer.

        Exact when at least ``depth`` of the top K are connected: every memory outside the top K
        scores lower than all of them. If the search returned fewer than K, it saw the whole scope.
        """
        store = self._graph()
        assert store is not None  # the planner chose vector-first because a graph store is open
        detail = _graph_detail(q)
        # The start's one-hop entity neighbours do not depend on the candidates: fetched while the
        # vector search runs, so the verification below is one round trip over the candidates.
        near_call = ctx.start(
            "graph.near_entities",
            store.name,
            {**detail, "parallel_with": "vector.search"},
            lambda: store.near_entities(vf.traversal),
        )
        legs = self._legs(vf.search, q, ctx)
        candidates = list(dict.fromkeys(i for hits in legs.values() for i, _ in hits))
        try:
            near = near_call.wait()
            near_call.step.rows_out = None if near is None else len(near)
            connected = ctx.call(
                "graph.verify",
                store.name,
                {**detail, "candidates": len(candidates)},
                lambda: store.connected(vf.traversal, candidates, near=near),
                rows_in=len(candidates),
            )
        except MemoryctlError as exc:
            ctx.note(f"vector-first: verification failed ({exc.message}); graph-first instead")
            return None
        # Each leg's connected hits in its own order, cut where graph-first's leg would cut: the
        # same lists graph-first fuses, hence the same relevance, whenever each leg either has
        # ``depth`` connected hits in its top K or returned fewer than K (it saw its whole scope).
        kept = {name: [(i, v) for i, v in hits if i in connected][: vf.depth] for name, hits in legs.items()}
        short = [n for n, hits in legs.items() if len(kept[n]) < vf.depth and len(hits) >= vf.k]
        if short:
            ctx.note(
                f"vector-first: fewer than the {vf.depth} needed of the top {vf.k} are connected"
                f" ({', '.join(f'{n} {len(kept[n])}' for n in short)}); graph-first instead"
            )
            return None
        ranked = [(i, {**parts, "graph": 1.0}) for i, parts in self._fuse(kept, vf.depth, ctx)]
        return len(connected), ranked[: vf.depth]

    # ---- stages -------------------------------------------------------------------------------
    def _traverse(self, stage: Traverse, q: MemoryQuery, ctx: QueryContext) -> tuple[list[uuid.UUID], bool]:
        """The memory ids the graph reaches, and whether PostgreSQL mentions answered instead."""
        assert q.graph is not None
        t = stage.traversal
        detail = _graph_detail(q)
        if t.newest_first:
            detail.update(order="newest first", limit=t.limit, time_pushed=bool(q.since or q.until))
        try:
            store = self._graph()
            if store is None:
                raise StoreUnavailable(self.graph_name, self.unavailable.get(self.graph_name, "unavailable"))
            return ctx.call("graph.traverse", store.name, detail, lambda: store.traverse(t)), False
        except MemoryctlError as exc:
            ctx.degrade(
                self.graph_name,
                f"{self.graph_name} unavailable ({exc.message}); graph filter fell back to PostgreSQL mentions (1 hop)",
            )
        entity = q.graph.entity
        ids = ctx.call(
            "fallback.mentions",
            names.POSTGRES,
            detail,
            lambda: self.relational.mentions(q, entity.type, entity.name, limit=GRAPH_CANDIDATE_CAP),
        )
        return ids, True

    def _search(
        self, stage: TextSearch, q: MemoryQuery, ctx: QueryContext, ids: Sequence[uuid.UUID] | None = None
    ) -> Ranked:
        """The text search: its legs in parallel under one scope (``ids``: the graph's candidates),
        fused into one relevance."""
        return self._fuse(self._legs(stage, q, ctx, ids), stage.depth, ctx)

    def _legs(
        self, stage: TextSearch, q: MemoryQuery, ctx: QueryContext, ids: Sequence[uuid.UUID] | None = None
    ) -> Legs:
        """Each leg's ranked (id, raw score) list. A failed leg degrades the answer instead of
        failing it: the other leg answers alone (asked for now if the query wanted only the failed
        one). Only when neither can answer does the query fail."""
        if stage.filter is None:
            ctx.note("the where clauses contradict each other: nothing can match")
            return {}
        among = ids if stage.among_candidates else None
        lexical_call = self._start_lexical(stage, q, ctx, among) if "lexical" in stage.legs else None
        legs: Legs = {}
        if "vector" in stage.legs:
            try:
                legs["vector"] = self._dense(stage, q, ctx, among)
            except MemoryctlError as exc:
                if q.text is None:
                    ctx.degrade(
                        names.VECTORS,
                        f"qdrant unavailable ({exc.message}); a raw vector has no lexical leg to fall back to",
                    )
                    return {}
                ctx.degrade(names.VECTORS, f"qdrant unavailable ({exc.message}); text ranked by the lexical leg alone")
                if lexical_call is None:
                    lexical_call = self._start_lexical(stage, q, ctx, among, name="fallback.lexical")
        if lexical_call is not None:
            try:
                legs["lexical"] = lexical_call.wait()
            except MemoryctlError as exc:
                if "vector" in stage.legs and "vector" not in legs:
                    raise  # the dense leg failed too: nothing to rank by
                ctx.degrade(names.LEXICAL, f"lexical leg failed ({exc.message}); text ranked by the dense leg alone")
                if "vector" not in legs:
                    legs["vector"] = self._dense(stage, q, ctx, among, name="fallback.vector")
        if stage.threshold is not None and "lexical" in legs and "vector" in legs:
            # The threshold is a floor on cosine similarity: only the vector leg's hits pass it.
            passed = {i for i, _ in legs["vector"]}
            legs["lexical"] = [(i, v) for i, v in legs["lexical"] if i in passed]
        return legs

    def _start_lexical(
        self,
        stage: TextSearch,
        q: MemoryQuery,
        ctx: QueryContext,
        ids: Sequence[uuid.UUID] | None,
        *,
        name: str = "lexical.search",
    ) -> Running[list[tuple[uuid.UUID, float]]]:
        text = q.text
        assert text is not None  # the planner gives a raw vector no lexical leg
        detail = {"text": text, "limit": stage.depth, "ids": len(ids) if ids is not None else None}
        if "vector" in stage.legs and name == "lexical.search":
            detail["parallel_with"] = "vector.search"
        return ctx.start(
            name,
            names.POSTGRES,
            detail,
            lambda: self.relational.lexical(q, text, limit=stage.depth, ids=ids, with_where=stage.with_where),
        )

    def _dense(
        self,
        stage: TextSearch,
        q: MemoryQuery,
        ctx: QueryContext,
        ids: Sequence[uuid.UUID] | None,
        *,
        name: str = "vector.search",
    ) -> list[tuple[uuid.UUID, float]]:
        assert stage.filter is not None
        flt = dataclasses.replace(stage.filter, ids=ids) if stage.among_candidates else stage.filter
        store = self._vectors()
        if store is None:
            raise StoreUnavailable(names.VECTORS, self.unavailable.get(names.VECTORS, "unavailable"))
        embedder = self._embedder()
        model_id = embedder.info.model_id
        vector = list(q.vector) if q.vector is not None else self._embed(q, embedder, ctx)
        detail = {
            "model": model_id,
            "limit": stage.depth,
            "filter": {
                "agent": flt.agent_id,
                "ids": len(flt.ids) if flt.ids is not None else None,
                "kinds": flt.kinds,
                "exclude_kinds": flt.exclude_kinds,
                "time": [t.isoformat() if t else None for t in (flt.created_from, flt.created_to)],
                "meta": [f"{m.key} {m.op} {m.value!r}" for m in flt.meta],
            },
            "threshold": stage.threshold,
        }
        hits = ctx.call(
            name,
            store.name,
            detail,
            lambda: store.search(vector, flt, stage.depth, model_id=model_id, score_threshold=stage.threshold),
            rows_in=len(ids) if ids is not None else None,
        )
        return [(h.id, h.score) for h in hits]

    @staticmethod
    def _fuse(legs: Legs, depth: int, ctx: QueryContext) -> Ranked:
        """One relevance per candidate (z-scores over the union, see ``fusion.relevance``), best first."""
        with ctx.step("fuse", "engine", {"method": "z-score mean", "legs": {n: len(r) for n, r in legs.items()}}) as s:
            parts = relevance(legs, text_scales(legs, depth))
            # Stable: equal relevance keeps the legs' own order (the vector leg's first).
            ranked = sorted(parts.items(), key=lambda kv: -kv[1]["relevance"])
            s.rows_in, s.rows_out = sum(len(r) for r in legs.values()), len(ranked)
        return ranked

    def _embed(self, q: MemoryQuery, embedder: Embedder, ctx: QueryContext) -> list[float]:
        """The question without the names of entities it says (``query/named.py``). Not under the
        store timeout: a local model's first call loads it (seconds, once per process), and the
        http embedder enforces its own timeout and retries."""
        assert q.text is not None
        text = self._dense_text(q, q.text, ctx)
        detail: dict[str, Any] = {"model": embedder.info.model_id}
        if text != q.text:
            detail["text"] = text
        with ctx.step("embed.query", "embedder", detail):
            vector: list[float] = embedder.embed_query(text).tolist()
            return vector

    def _dense_text(self, q: MemoryQuery, text: str, ctx: QueryContext) -> str:
        """What the dense leg embeds: ``text`` without the entity names it says, when anything else
        is left. A failed lookup costs the answer nothing but this: the whole question is embedded."""
        if not self.names_out_of_dense:
            return text
        try:
            said = ctx.call(
                "postgres.names", names.POSTGRES, {"agent": q.agent_id}, lambda: self.relational.names_said(q, text)
            )
        except MemoryctlError as exc:
            ctx.note(f"entity names not looked up ({exc.message}): the dense leg embedded the whole question")
            return text
        return named.without(text, said) or text

    def _pg_filter(
        self,
        stage: PostgresFilter,
        q: MemoryQuery,
        ctx: QueryContext,
        ids: Sequence[uuid.UUID] | None,
        limit: int | None,
    ) -> list[tuple[uuid.UUID, datetime]]:
        assert limit is not None
        detail = {
            "where": [f"{w.field} {w.op}" for w in q.where] if stage.with_where else [],
            "time": bool(q.since or q.until),
            "ids": len(ids) if ids is not None else None,
            "limit": limit,
        }
        return ctx.call(
            "postgres.filter",
            names.POSTGRES,
            detail,
            lambda: self.relational.filter(q, ids=ids, limit=limit, with_where=stage.with_where),
            rows_in=len(ids) if ids is not None else None,
        )

    # ---- hydrate, score, relationships --------------------------------------------------------
    def _hydrate(self, q: MemoryQuery, ranked: Ranked, ctx: QueryContext) -> list[Hit]:
        if not ranked:
            return []
        window, turns = self._context(q, ranked[: max(depth(q), q.limit)], ctx)
        ids = [i for i, _ in window]
        # Relationships need only ids: ask the graph for the likely hits (the first ``limit``)
        # while PostgreSQL hydrates, instead of after it. Both are single round trips of similar
        # cost, so this takes one of them off the critical path; a hit the guess missed (a vetoed
        # row moved another one up) is fetched afterwards.
        early = self._start_relationships(ids[: q.limit], ctx)
        rows = ctx.call(
            "postgres.hydrate",
            names.POSTGRES,
            {"ids": len(ids)},
            lambda: self.rows.get_many(ids, include_deleted=False),
            rows_in=len(ids),
        )
        graph_source = self.graph_name if not ctx.is_degraded(self.graph_name) else "postgres-mentions"
        live = [
            (m, scores)
            for m, scores in ((rows.get(mid), scores) for mid, scores in window)
            # PostgreSQL is the truth: deleted or out-of-scope rows never leave the engine,
            # whatever a lagging secondary store still holds.
            if m is not None
            and (q.agent_id is None or m.agent_id == q.agent_id)
            and not (q.since and m.created_at < q.since)
            and not (q.until and m.created_at >= q.until)
        ]
        live = self._in_context(self._entities_named(q, live), turns)
        newest = max((m.created_at for m, _ in live), default=None)
        band = spread([s["relevance"] for _, s in live if "relevance" in s])
        hits: list[Hit] = []
        for m, scores in live:
            parts = dict(scores)
            if "rrf" in scores:  # or: fused ranks (ties newest first, below)
                score = scores["rrf"]
            elif "relevance" in scores:  # a text ranking: relevance first, recency (if asked) within a band
                score = scores["relevance"]
                if q.half_life is not None:
                    assert newest is not None
                    parts["recency"] = recency(m.created_at, newest, q.half_life)
                    score = rank_score(score, parts["recency"], band)
            else:  # a shape that orders newest first: score 1.0, ties by time below
                score = 1.0
            sources = [names.POSTGRES]
            if "vector" in scores:
                sources.append(names.VECTORS)
            if "graph" in scores:
                sources.append(graph_source)
            hits.append(Hit(m.id, score, parts, m, sources))
        hits.sort(key=_order)
        hits = hits[: q.limit]
        self._relationships(hits, ctx, early)
        return hits

    def _context(self, q: MemoryQuery, window: Ranked, ctx: QueryContext) -> tuple[Ranked, _Turns]:
        """For a text ranking: the candidates, with the memories written just after one of them
        added at the floor of their relevance, and per memory the candidates written just before
        it, its context (``query/turns.py``). The context's other memories are no candidates and
        would score the floor anyway. No memory is added under a graph filter or a threshold,
        which the neighbours were not checked against: there the context only reorders."""
        ranking = all("relevance" in s and "rrf" not in s for _, s in window)  # not ``or``'s ranks
        if self.context_turns == 0 or q.text is None or not window or not ranking:
            return window, _Turns()
        ids = [i for i, _ in window]
        following = ctx.call(
            "postgres.context",
            names.POSTGRES,
            {"ids": len(ids), "turns": self.context_turns, "within_s": CONTEXT_WITHIN.total_seconds()},
            lambda: self.relational.following(q, ids, turns=self.context_turns, within=CONTEXT_WITHIN),
            rows_in=len(ids),
        )
        turns = _Turns()
        for mid, after in following.items():
            for n in after:
                turns.before.setdefault(n, []).append(mid)
        if q.graph is not None or q.threshold is not None:
            return window, turns
        turns.added = turns.before.keys() - set(ids)
        floor = min(s["relevance"] for _, s in window)
        return [*window, *((n, {"relevance": floor}) for n in sorted(turns.added))], turns

    @staticmethod
    def _in_context(live: Scored, turns: _Turns) -> Scored:
        """The candidates that their context lifts get the passage's relevance (``turns.in_context``)
        and ``context``, the same figure, in their scores; an added memory that its context did
        not lift is dropped (neither leg returned it)."""
        if not turns.before:
            return live
        lifted = in_context({m.id: s["relevance"] for m, s in live}, turns.before)
        return [
            (m, {**s, "relevance": lifted[m.id], "context": lifted[m.id]} if m.id in lifted else s)
            for m, s in live
            if m.id in lifted or m.id not in turns.added
        ]

    @staticmethod
    def _entities_named(q: MemoryQuery, live: Scored) -> Scored:
        """A text ranking with the named-entity leg averaged in (``fusion.with_named``); the
        candidates that mention an entity the question names get ``entity`` 1.0 in their scores."""
        if q.text is None or not live or not all("relevance" in s for _, s in live):
            return live
        named = [names_any(q.text, (e.name for e in m.entities)) for m, _ in live]
        fused = with_named([s["relevance"] for _, s in live], named)
        return [
            (m, {**s, "relevance": r, **({"entity": 1.0} if n else {})})
            for (m, s), r, n in zip(live, fused, named, strict=True)
        ]

    def _start_relationships(self, ids: list[uuid.UUID], ctx: QueryContext) -> Running[Relationships] | None:
        if not ids or ctx.is_degraded(self.graph_name):
            return None
        store = self._graph()
        if store is None:
            return None
        detail = {"ids": len(ids), "parallel_with": "postgres.hydrate"}
        return ctx.start("graph.relationships", store.name, detail, lambda: store.relationships(ids))

    def _relationships(self, hits: list[Hit], ctx: QueryContext, early: Running[Relationships] | None) -> None:
        if not hits or ctx.is_degraded(self.graph_name):
            return
        rels: Relationships = {}
        try:
            if early is not None:
                rels = early.wait()
            missing = [h.id for h in hits if h.id not in rels]
            store = self._graph() if missing else None
            if store is not None:
                more = ctx.call(
                    "graph.relationships", store.name, {"ids": len(missing)}, lambda: store.relationships(missing)
                )
                rels = {**rels, **more}
        except MemoryctlError:
            ctx.degrade(self.graph_name)
            return
        for h in hits:
            h.relationships = rels.get(h.id, [])

    def _record(self, q: MemoryQuery, hits: list[Hit]) -> None:
        """Recall events feed the nightly datasets; losing one is not worth failing a query."""
        assert self.recalls is not None
        try:
            self.recalls.record_recalls(q.query_id, q.text, [(h.memory.agent_id, h.id, h.score) for h in hits])
        except MemoryctlError:
            pass


def _order(hit: Hit) -> tuple[float, float, uuid.UUID]:
    """Score first; an exactly equal score goes to the newer memory, then to the lower id. One rule
    with and without a half-life (recency only ever adds to the newer one's score), so a tie never
    depends on the order in which the stores listed it."""
    return (-hit.score, -hit.memory.created_at.timestamp(), hit.id)


def _graph_detail(q: MemoryQuery) -> dict[str, Any]:
    assert q.graph is not None
    g = q.graph
    return {"start": g.entity.as_dict(), "via": list(g.via), "hops": g.hops, "direction": g.direction}
