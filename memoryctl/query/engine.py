"""Planner and executor: one ``MemoryQuery`` → the fewest store calls that answer it.

Plan shapes (see the README's "Query engine" section):

- ``and`` + text + graph, chosen by cost: **graph-first** (traverse → candidate ids → one vector
  search whose filter carries the ids, the agent, the time range and every ``where`` the payload
  holds) when the start entity reaches few memories; **vector-first** when it reaches many (the
  graph's degree count says so without traversing): the vector search with the same pushdown and
  no ids returns the top K, the graph checks which of those K are connected, and the answer is
  exact as soon as enough of them are (every memory outside the top K scores lower than all of
  them); otherwise the engine falls back to graph-first. A high fan-out traversal (20k ids) is the
  most expensive thing a query can do; this plan never runs it.
- ``and`` + text without graph: one vector search with that pushdown → hydrate from PostgreSQL.
  Nothing is pulled up to be filtered in Python; PostgreSQL is asked only for what the payload
  does not hold (nothing, today: kind, agent_id, created_at and scalar metadata are all replicated).
- ``and`` without text: graph only → the graph store applies the time range, orders newest first
  and cuts (PostgreSQL hydrates); with where clauses graph → ids → PostgreSQL filter; without a
  graph, PostgreSQL alone. Newest first.
- ``or``: every leg (vector, graph, where) runs in parallel, results fused with RRF.
- Time decay multiplies the final score; ``threshold`` is a floor on cosine similarity in the
  vector leg (the only score with an absolute meaning).

Every store call goes through ``Guard`` (timeout + breaker). When Qdrant fails, text falls back to
PostgreSQL full-text search; when Neo4j fails, the graph filter falls back to the ``entities``
column (one hop, mentions only). Either way the result names the degraded store.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from memoryctl.errors import MemoryctlError
from memoryctl.model import Memory
from memoryctl.query.fusion import decay, rrf
from memoryctl.query.guard import Guard, Pending
from memoryctl.query.relational import RelationalQueries
from memoryctl.query.spec import MemoryQuery, Where
from memoryctl.stores.protocols import GraphStore, GraphTraversal, MetaCondition, VectorFilter, VectorStore
from memoryctl.stores.records import RecordStore

if TYPE_CHECKING:
    from memoryctl.embed import Embedder

T = TypeVar("T")
OVERFETCH = 2  # vector hits fetched per requested hit: PostgreSQL may veto a few (deleted since)
GRAPH_CANDIDATE_CAP = 100_000
# Vector-first plan for graph + vector queries (see ``QueryEngine._probe``). Below PROBE_MIN_FANOUT
# reachable memories the traversal is cheap and graph-first wins; the probe asks the vector store
# for PROBE_SAFETY times the hits it expects to need and gives up beyond PROBE_MAX_K. Measured with
# benchmarks/query.py (100k memories, top author 20k): graph-first 860-1660 ms, vector-first with
# ~420 candidates 119 ms end to end; a 2,000-id traversal costs about what a 2,000-candidate check
# does, hence both bounds. Exact relative to the vector search (HNSW beyond 100k points is
# approximate either way).
PROBE_MIN_FANOUT = 2_000
PROBE_MAX_K = 2_000
PROBE_SAFETY = 3.0
SCOPE_TTL_S = 60.0


@dataclass(slots=True)
class Hit:
    id: uuid.UUID
    score: float
    scores: dict[str, float]
    memory: Memory
    sources: list[str]
    relationships: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        m = self.memory
        return {
            "id": str(self.id),
            "score": round(self.score, 6),
            "scores": {k: round(v, 6) for k, v in self.scores.items()},
            "text": m.text,
            "created_at": m.created_at.isoformat(),
            "kind": m.kind,
            "agent_id": m.agent_id,
            "entities": [e.as_dict() for e in m.entities],
            "metadata": m.metadata,
            "relationships": self.relationships,
            "sources": self.sources,
        }


@dataclass(slots=True)
class Step:
    name: str
    store: str
    detail: dict[str, Any]
    ms: float = 0.0
    rows_in: int | None = None
    rows_out: int | None = None
    status: str = "ok"
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k) for k in ("name", "store", "detail", "ms", "rows_in", "rows_out", "status", "error")
        }


@dataclass(slots=True)
class _Prefetch:
    """A store call started early (see ``QueryEngine._hydrate``) and the explain step it reports to."""

    step: Step
    t0: float
    pending: Pending[dict[uuid.UUID, list[dict[str, Any]]]]


@dataclass(slots=True)
class QueryResult:
    hits: list[Hit]
    degraded: list[str]
    plan: str
    steps: list[Step]
    query: MemoryQuery
    ms: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def explain(self) -> dict[str, Any]:
        return {
            "plan": self.plan,
            "query": self.query.as_dict(),
            "steps": [s.as_dict() for s in self.steps],
            "total_ms": round(self.ms, 2),
            "notes": self.notes,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "query_id": str(self.query.query_id),
            "hits": [h.as_dict() for h in self.hits],
            "degraded": self.degraded,
            "explain": self.explain,
        }


def _pushdown(q: MemoryQuery, *, with_where: bool, ids: Sequence[uuid.UUID] | None = None) -> VectorFilter | None:
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
            created_from, created_to = _narrow_time(w, created_from, created_to)
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


def _narrow_time(w: Where, lo: datetime | None, hi: datetime | None) -> tuple[datetime | None, datetime | None]:
    if w.op in (">", ">="):
        lo = w.value if lo is None else max(lo, w.value)
    elif w.op in ("<", "<="):
        hi = w.value if hi is None else min(hi, w.value)
    elif w.op == "=":
        lo = hi = w.value
    return lo, hi


def _needs_postgres_filter(q: MemoryQuery) -> bool:
    """Where clauses the vector payload cannot answer exactly (checked again in PostgreSQL)."""
    return any(
        (w.field == "agent_id" and w.op in ("!=", "in")) or (w.field == "created_at" and w.op in ("!=", "in"))
        for w in q.where
    )


class QueryEngine:
    def __init__(
        self,
        records: RecordStore,
        *,
        vectors: Callable[[], VectorStore | None],
        graph: Callable[[], GraphStore | None],
        embedder: Callable[[], Embedder],
        guard: Guard,
        unavailable: dict[str, str],
        default_half_life: Callable[[str | None], Any] = lambda agent: None,
        record_events: bool = True,
        graph_name: str = "neo4j",
        probe_min_fanout: int = PROBE_MIN_FANOUT,
        probe_max_k: int = PROBE_MAX_K,
    ) -> None:
        self.graph_name = graph_name
        self.probe_min_fanout = probe_min_fanout
        self.probe_max_k = probe_max_k
        self.records = records
        self.rel = RelationalQueries(records.pool)
        self._vectors = vectors
        self._graph = graph
        self._embedder = embedder
        self.guard = guard
        self.unavailable = unavailable
        self.default_half_life = default_half_life
        self.record_events = record_events
        self._scope: dict[str | None, tuple[float, int]] = {}  # agent -> (monotonic time, points)

    # ---- plumbing -----------------------------------------------------------------------------
    def _step(self, steps: list[Step], name: str, store: str, detail: dict[str, Any], fn: Callable[[], T]) -> T:
        step = Step(name, store, detail)
        steps.append(step)
        t0 = time.perf_counter()
        try:
            return self.guard.call(store, fn)
        except MemoryctlError as exc:
            step.status, step.error = "failed", exc.message
            raise
        finally:
            step.ms = round((time.perf_counter() - t0) * 1000, 2)

    # ---- entry --------------------------------------------------------------------------------
    def run(self, q: MemoryQuery) -> QueryResult:
        q.validate()
        if not q.decay:
            q.half_life = None
        elif q.half_life is None:
            q.half_life = self.default_half_life(q.agent_id)
        t0 = time.perf_counter()
        steps: list[Step] = []
        degraded: list[str] = []
        notes: list[str] = []
        if q.combine == "or" and sum([q.has_vector_leg, q.graph is not None, bool(q.where)]) > 1:
            plan, ranked = "or: parallel legs fused by RRF", self._run_or(q, steps, degraded, notes)
        else:
            plan, ranked = self._run_and(q, steps, degraded, notes)
        hits = self._hydrate(q, ranked, steps, degraded)
        result = QueryResult(hits, sorted(set(degraded)), plan, steps, q, notes=notes)
        result.ms = (time.perf_counter() - t0) * 1000
        if self.record_events and hits:
            self._record(q, hits)
        return result

    # ---- AND ----------------------------------------------------------------------------------
    def _run_and(
        self, q: MemoryQuery, steps: list[Step], degraded: list[str], notes: list[str]
    ) -> tuple[str, list[tuple[uuid.UUID, dict[str, float]]]]:
        ids: list[uuid.UUID] | None = None
        shape = []
        if q.graph is not None and q.has_vector_leg and not _needs_postgres_filter(q):
            probed = self._probe(q, steps, degraded, notes)
            if probed is not None:
                return probed
        if q.graph is not None and not q.has_vector_leg and not q.where:
            # Graph only: the graph filters by time, orders newest first and cuts; PostgreSQL only
            # hydrates. (Its fallback, mentions in PostgreSQL, still goes through the filter below.)
            ids = self._graph_ids(q, steps, degraded, notes, newest_first=True)
            if self.graph_name not in degraded:
                return "graph(time pushed down, newest first)", [(i, {"graph": 1.0}) for i in ids]
            shape.append("graph")
        elif q.graph is not None:
            shape.append("graph")
            ids = self._graph_ids(q, steps, degraded, notes)
        if q.graph is not None and not ids:
            return "graph → (no candidates)", []
        if q.has_vector_leg:
            shape.append("vector(pushdown: " + ", ".join(self._pushed(q, ids)) + ")")
            ranked = self._vector_or_fulltext(q, steps, degraded, notes, ids=ids, with_where=True)
            if ids is not None:  # every hit also satisfied the graph filter: say so in its sources
                ranked = [(i, {**s, "graph": 1.0}) for i, s in ranked]
            if _needs_postgres_filter(q) and ranked:
                keep = {i for i, _ in self._pg_filter(q, steps, ids=[i for i, _ in ranked], limit=len(ranked))}
                ranked = [(i, s) for i, s in ranked if i in keep]
            return " → ".join(shape), ranked
        shape.append("postgres(filter, newest first)")
        rows = self._pg_filter(q, steps, ids=ids, limit=q.limit)
        return " → ".join(shape), [(i, {"graph": 1.0} if ids is not None else {}) for i, _ in rows]

    def _pushed(self, q: MemoryQuery, ids: Sequence[uuid.UUID] | None) -> list[str]:
        pushed = ["agent" if q.agent_id else "all agents"]
        if ids is not None:
            pushed.append(f"{len(ids)} ids")
        if q.since or q.until:
            pushed.append("time")
        pushed += [f"{w.field} {w.op}" for w in q.where]
        return pushed

    # ---- OR -----------------------------------------------------------------------------------
    def _run_or(
        self, q: MemoryQuery, steps: list[Step], degraded: list[str], notes: list[str]
    ) -> list[tuple[uuid.UUID, dict[str, float]]]:
        import threading

        legs: dict[str, list[tuple[uuid.UUID, dict[str, float]]]] = {}
        lock = threading.Lock()
        leg_steps: dict[str, list[Step]] = {}

        def leg(name: str, fn: Callable[[list[Step]], list[tuple[uuid.UUID, dict[str, float]]]]) -> None:
            own: list[Step] = []
            leg_steps[name] = own
            try:
                res = fn(own)
            except MemoryctlError as exc:
                res = []
                notes.append(f"{name} leg failed: {exc.message}")
            with lock:
                legs[name] = res

        fns: dict[str, Callable[[list[Step]], list[tuple[uuid.UUID, dict[str, float]]]]] = {}
        depth = q.limit * OVERFETCH + 10
        if q.has_vector_leg:
            fns["vector"] = lambda s: self._vector_or_fulltext(q, s, degraded, notes, ids=None, with_where=False)
        if q.graph is not None:

            def graph_leg(s: list[Step]) -> list[tuple[uuid.UUID, dict[str, float]]]:
                ids = self._graph_ids(q, s, degraded, notes)
                rows = self._pg_filter(q, s, ids=ids, limit=depth, with_where=False) if ids else []
                return [(i, {"graph": 1.0}) for i, _ in rows]

            fns["graph"] = graph_leg
        if q.where:
            fns["where"] = lambda s: [(i, {"where": 1.0}) for i, _ in self._pg_filter(q, s, limit=depth)]
        threads = [threading.Thread(target=leg, args=(n, f), daemon=True) for n, f in fns.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for name in fns:
            steps.extend(leg_steps.get(name, []))
        fused = rrf({name: [i for i, _ in res] for name, res in legs.items()})
        raw = {name: dict(res) for name, res in legs.items()}
        ranked: list[tuple[uuid.UUID, dict[str, float]]] = []
        for mid, parts in fused.items():
            scores: dict[str, float] = {}
            for name in parts:
                scores.update(raw[name][mid])
            scores["rrf"] = sum(parts.values())
            ranked.append((mid, scores))
        ranked.sort(key=lambda p: -p[1]["rrf"])
        steps.append(
            Step(
                "fuse",
                "engine",
                {"method": "rrf", "k": 60, "legs": {n: len(r) for n, r in legs.items()}},
                rows_in=sum(len(r) for r in legs.values()),
                rows_out=len(ranked),
            )
        )
        return ranked

    # ---- vector-first ---------------------------------------------------------------------------
    def _probe(
        self, q: MemoryQuery, steps: list[Step], degraded: list[str], notes: list[str]
    ) -> tuple[str, list[tuple[uuid.UUID, dict[str, float]]]] | None:
        """The vector-first plan, or None when graph-first is the better (or the only safe) plan.

        Exactness: the vector search returns the top K of the scope by score (same pushdown as
        graph-first). If at least ``depth`` of them are connected, those are the top ``depth``
        connected memories overall, because every memory outside the top K scores lower than all
        of them; if the search returned fewer than K, it saw the whole scope. Only otherwise is
        the answer unknown, and the engine falls back to graph-first (said in the notes).
        """
        if not self.probe_min_fanout:
            return None
        assert q.graph is not None
        if q.graph.hops != 1 or q.agent_id is None:
            # Beyond one hop, checking a candidate means walking from dense intermediate nodes
            # (an author's other memories): no cheaper than the traversal. The degree estimate is a
            # one-hop figure too.
            return None
        store = self._graph()
        if store is None or not getattr(store, "cheap_membership", False):
            return None
        traversal = self._traversal(q)
        detail = self._graph_detail(q)
        try:
            fan = self._step(steps, "graph.fanout", store.name, detail, lambda: store.fanout(traversal))
        except MemoryctlError:
            return None  # graph-first reports the failure and falls back
        steps[-1].rows_out = fan
        if fan < self.probe_min_fanout:
            return None
        depth = q.limit * OVERFETCH + 10
        scope = self._scope_size(q.agent_id, steps)
        k = max(4 * depth, math.ceil(depth * max(scope, 1) / fan * PROBE_SAFETY))
        if scope <= 0 or k > self.probe_max_k:
            return None
        # The start's one-hop entity neighbours do not depend on the candidates: fetched while the
        # vector search runs, so the verification below is one round trip over the candidates.
        near_step = Step("graph.near_entities", store.name, {**detail, "parallel_with": "vector.search"})
        steps.append(near_step)
        t_near = time.perf_counter()
        near_pending = self.guard.start(store.name, lambda: store.near_entities(traversal))
        ranked = self._vector_or_fulltext(q, steps, degraded, notes, ids=None, with_where=True, depth=k)
        candidates = [i for i, _ in ranked]
        try:
            try:
                near = near_pending.wait()
            except MemoryctlError as exc:
                near_step.status, near_step.error = "failed", exc.message
                raise
            finally:
                near_step.ms = round((time.perf_counter() - t_near) * 1000, 2)
            near_step.rows_out = None if near is None else len(near)
            connected = self._step(
                steps,
                "graph.verify",
                store.name,
                {**detail, "candidates": len(candidates)},
                lambda: store.connected(traversal, candidates, near=near),
            )
        except MemoryctlError as exc:
            notes.append(f"vector-first: verification failed ({exc.message}); graph-first instead")
            return None
        steps[-1].rows_in, steps[-1].rows_out = len(candidates), len(connected)
        kept = [(i, {**s, "graph": 1.0}) for i, s in ranked if i in connected]
        if len(kept) < depth and len(ranked) >= k:
            notes.append(
                f"vector-first: {len(kept)} of the top {k} are connected, fewer than the {depth} needed;"
                " graph-first instead"
            )
            return None
        pushed = ", ".join(self._pushed(q, None))
        plan = f"graph fan-out {fan} → vector-first(top {k}, pushdown: {pushed}) → graph.verify → {len(kept)} kept"
        return plan, kept[:depth]

    def _scope_size(self, agent_id: str | None, steps: list[Step]) -> int:
        """Points the vector search ranks for this agent (cached briefly: an estimate for ``_probe``)."""
        now = time.monotonic()
        cached = self._scope.get(agent_id)
        if cached is not None and now - cached[0] < SCOPE_TTL_S:
            return cached[1]
        store = self._vectors()
        if store is None:
            return 0
        try:
            n = self._step(
                steps, "vector.count", store.name, {"agent": agent_id}, lambda: store.count(agent_id=agent_id)
            )
        except MemoryctlError:
            return 0
        steps[-1].rows_out = n
        self._scope[agent_id] = (now, n)
        return n

    # ---- legs ---------------------------------------------------------------------------------
    @staticmethod
    def _traversal(q: MemoryQuery, *, newest_first: bool = False) -> GraphTraversal:
        """Nearest first with the candidate cap, or (graph only) the query's window newest first."""
        assert q.graph is not None
        g = q.graph
        return GraphTraversal(
            agent_id=q.agent_id,
            start_key=g.entity.key(q.agent_id) if q.agent_id else "",
            relation_types=g.via,
            hops=g.hops,
            direction=g.direction,
            limit=q.limit * OVERFETCH + 10 if newest_first else GRAPH_CANDIDATE_CAP,
            created_from=q.since if newest_first else None,
            created_to=q.until if newest_first else None,
            newest_first=newest_first,
        )

    @staticmethod
    def _graph_detail(q: MemoryQuery) -> dict[str, Any]:
        assert q.graph is not None
        g = q.graph
        return {"start": g.entity.as_dict(), "via": list(g.via), "hops": g.hops, "direction": g.direction}

    def _graph_ids(
        self, q: MemoryQuery, steps: list[Step], degraded: list[str], notes: list[str], *, newest_first: bool = False
    ) -> list[uuid.UUID]:
        assert q.graph is not None
        g = q.graph
        traversal = self._traversal(q, newest_first=newest_first)
        detail = self._graph_detail(q)
        if newest_first:
            detail.update(order="newest first", limit=traversal.limit, time_pushed=bool(q.since or q.until))
        try:
            if q.agent_id is None:
                raise MemoryctlError("graph filters need an agent (entity keys are per agent)")
            store = self._graph()
            if store is None:
                from memoryctl.errors import StoreUnavailable

                raise StoreUnavailable(self.graph_name, self.unavailable.get(self.graph_name, "unavailable"))
            ids = self._step(steps, "graph.traverse", store.name, detail, lambda: store.traverse(traversal))
            steps[-1].rows_out = len(ids)
            return ids
        except MemoryctlError as exc:
            if "agent" in exc.message and q.agent_id is None:
                raise
            degraded.append(self.graph_name)
            notes.append(
                f"{self.graph_name} unavailable ({exc.message}); graph filter fell back to PostgreSQL mentions (1 hop)"
            )
            ids = self._step(
                steps,
                "fallback.mentions",
                "postgres",
                detail,
                lambda: self.rel.mentions(q, g.entity.type, g.entity.name, limit=GRAPH_CANDIDATE_CAP),
            )
            steps[-1].rows_out = len(ids)
            return ids

    def _vector_or_fulltext(
        self,
        q: MemoryQuery,
        steps: list[Step],
        degraded: list[str],
        notes: list[str],
        *,
        ids: Sequence[uuid.UUID] | None,
        with_where: bool,
        depth: int | None = None,
    ) -> list[tuple[uuid.UUID, dict[str, float]]]:
        depth = depth or q.limit * OVERFETCH + 10
        flt = _pushdown(q, with_where=with_where, ids=ids)
        if flt is None:
            notes.append("the where clauses contradict each other: nothing can match")
            return []
        try:
            store = self._vectors()
            if store is None:
                from memoryctl.errors import StoreUnavailable

                raise StoreUnavailable("qdrant", self.unavailable.get("qdrant", "unavailable"))
            embedder = self._embedder()
            if q.vector is not None:
                vector = list(q.vector)
            else:
                assert q.text is not None
                vector = self._embed(q.text, embedder, steps)
            detail = {
                "model": embedder.info.model_id,
                "limit": depth,
                "filter": {
                    "agent": flt.agent_id,
                    "ids": len(flt.ids) if flt.ids is not None else None,
                    "kinds": flt.kinds,
                    "exclude_kinds": flt.exclude_kinds,
                    "time": [t.isoformat() if t else None for t in (flt.created_from, flt.created_to)],
                    "meta": [f"{m.key} {m.op} {m.value!r}" for m in flt.meta],
                },
                "threshold": q.threshold,
            }
            hits = self._step(
                steps,
                "vector.search",
                store.name,
                detail,
                lambda: store.search(vector, flt, depth, model_id=embedder.info.model_id, score_threshold=q.threshold),
            )
            steps[-1].rows_in = len(ids) if ids is not None else None
            steps[-1].rows_out = len(hits)
            return [(h.id, {"vector": h.score}) for h in hits]
        except MemoryctlError as exc:
            if q.text is None:
                degraded.append("qdrant")
                notes.append(f"qdrant unavailable ({exc.message}); a raw vector cannot fall back to full-text")
                return []
            degraded.append("qdrant")
            notes.append(f"qdrant unavailable ({exc.message}); text fell back to PostgreSQL full-text search")
            rows = self._step(
                steps,
                "fallback.fulltext",
                "postgres",
                {"text": q.text, "ids": len(ids) if ids is not None else None},
                lambda: self._fulltext(q, ids, depth, with_where),
            )
            steps[-1].rows_out = len(rows)
            return [(i, {"fulltext": r}) for i, r in rows]

    def _embed(self, text: str, embedder: Embedder, steps: list[Step]) -> list[float]:
        """Not under the store timeout: a local model's first call loads it (seconds, once per
        process), and the http embedder enforces its own timeout and retries."""
        step = Step("embed.query", "embedder", {"model": embedder.info.model_id})
        steps.append(step)
        t0 = time.perf_counter()
        try:
            vector: list[float] = embedder.embed_query(text).tolist()
            return vector
        except MemoryctlError as exc:
            step.status, step.error = "failed", exc.message
            raise
        finally:
            step.ms = round((time.perf_counter() - t0) * 1000, 2)

    def _fulltext(
        self, q: MemoryQuery, ids: Sequence[uuid.UUID] | None, depth: int, with_where: bool
    ) -> list[tuple[uuid.UUID, float]]:
        assert q.text is not None
        return self.rel.lexical(q, q.text, limit=depth, ids=ids, with_where=with_where)

    def _pg_filter(
        self,
        q: MemoryQuery,
        steps: list[Step],
        *,
        ids: Sequence[uuid.UUID] | None = None,
        limit: int,
        with_where: bool = True,
    ) -> list[tuple[uuid.UUID, datetime]]:
        detail = {
            "where": [f"{w.field} {w.op}" for w in q.where] if with_where else [],
            "time": bool(q.since or q.until),
            "ids": len(ids) if ids is not None else None,
            "limit": limit,
        }
        rows = self._step(
            steps,
            "postgres.filter",
            "postgres",
            detail,
            lambda: self.rel.filter(q, ids=ids, limit=limit, with_where=with_where),
        )
        steps[-1].rows_in = len(ids) if ids is not None else None
        steps[-1].rows_out = len(rows)
        return rows

    # ---- hydrate, score, relationships --------------------------------------------------------
    def _hydrate(
        self, q: MemoryQuery, ranked: list[tuple[uuid.UUID, dict[str, float]]], steps: list[Step], degraded: list[str]
    ) -> list[Hit]:
        if not ranked:
            return []
        window = ranked[: max(q.limit * OVERFETCH + 10, q.limit)]
        ids = [i for i, _ in window]
        # Relationships need only ids: ask the graph for the likely hits (the first ``limit``)
        # while PostgreSQL hydrates, instead of after it. Both are single round trips of similar
        # cost, so this takes one of them off the critical path; a hit the guess missed (a vetoed
        # row moved another one up) is fetched afterwards.
        early = self._start_relationships(ids[: q.limit], steps, degraded)
        rows = self._step(
            steps,
            "postgres.hydrate",
            "postgres",
            {"ids": len(ids)},
            lambda: self.records.get_many(ids, include_deleted=False),
        )
        steps[-1].rows_in, steps[-1].rows_out = len(ids), len(rows)
        now = datetime.now(UTC)
        hits: list[Hit] = []
        for mid, scores in window:
            m = rows.get(mid)
            # PostgreSQL is the truth: deleted or out-of-scope rows never leave the engine,
            # whatever a lagging secondary store still holds.
            if m is None or (q.agent_id is not None and m.agent_id != q.agent_id):
                continue
            if (q.since and m.created_at < q.since) or (q.until and m.created_at >= q.until):
                continue
            d = decay(m.created_at, now, q.half_life)
            base = scores.get("rrf", scores.get("vector", scores.get("fulltext", 1.0)))
            parts = {**scores, "decay": d}
            sources = ["postgres"]
            if "vector" in scores:
                sources.append("qdrant")
            if "graph" in scores:
                sources.append(self.graph_name if self.graph_name not in degraded else "postgres-mentions")
            hits.append(Hit(mid, base * d, parts, m, sources))
        hits.sort(key=lambda h: (-h.score, -h.memory.created_at.timestamp()))
        hits = hits[: q.limit]
        self._relationships(hits, steps, degraded, early)
        return hits

    def _start_relationships(self, ids: list[uuid.UUID], steps: list[Step], degraded: list[str]) -> _Prefetch | None:
        if not ids or self.graph_name in degraded:
            return None
        store = self._graph()
        if store is None:
            return None
        step = Step("graph.relationships", store.name, {"ids": len(ids), "parallel_with": "postgres.hydrate"})
        steps.append(step)
        return _Prefetch(step, time.perf_counter(), self.guard.start(store.name, lambda: store.relationships(ids)))

    def _relationships(
        self, hits: list[Hit], steps: list[Step], degraded: list[str], early: _Prefetch | None = None
    ) -> None:
        if not hits or self.graph_name in degraded:
            return
        rels: dict[uuid.UUID, list[dict[str, Any]]] = {}
        if early is not None:
            try:
                rels = early.pending.wait()
            except MemoryctlError as exc:
                early.step.status, early.step.error = "failed", exc.message
                degraded.append(self.graph_name)
                return
            finally:
                early.step.ms = round((time.perf_counter() - early.t0) * 1000, 2)
        missing = [h.id for h in hits if h.id not in rels]
        store = self._graph() if missing else None
        if store is not None:
            try:
                rels = {
                    **rels,
                    **self._step(
                        steps,
                        "graph.relationships",
                        store.name,
                        {"ids": len(missing)},
                        lambda: store.relationships(missing),
                    ),
                }
            except MemoryctlError:
                degraded.append(self.graph_name)
                return
        for h in hits:
            h.relationships = rels.get(h.id, [])

    def _record(self, q: MemoryQuery, hits: list[Hit]) -> None:
        """Recall events feed the nightly datasets; losing one is not worth failing a query."""
        from psycopg.types.json import Jsonb

        try:
            with self.records.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO memory_events (agent_id, memory_id, query_id, event, payload)"
                    " VALUES (%s, %s, %s, 'recall', %s)",
                    [
                        (h.memory.agent_id, h.id, q.query_id, Jsonb({"rank": r, "score": h.score, "text": q.text}))
                        for r, h in enumerate(hits, start=1)
                    ],
                )
        except Exception:
            pass
