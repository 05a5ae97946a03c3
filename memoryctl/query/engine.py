"""The query engine: one ``MemoryQuery`` in, one ``QueryResult`` out, in the order of the diagram.

    validate → plan (asking the stores for the facts the choice needs) → execute the shape
    (``executor``) → hydrate and rank (``hydrate``, ``ranking``) → record the recalls

Every store call of a query is a step of its ``QueryContext`` (timeout + breaker, timed) made
through ``StoreCalls``. The caller's query is never changed: the engine runs a normalised copy
with the agent's configured half-life resolved, and the answer carries that copy.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from memoryctl.errors import MemoryctlError
from memoryctl.query import hydrate
from memoryctl.query.calls import QueryStores, StoreCalls
from memoryctl.query.context import QueryContext
from memoryctl.query.executor import execute
from memoryctl.query.guard import Guard
from memoryctl.query.plan import Facts, Need, Plan, PlanOptions, plan
from memoryctl.query.ports import MemoryRows, RecallLog, RelationalReads
from memoryctl.query.results import Hit, QueryResult
from memoryctl.query.spec import MemoryQuery
from memoryctl.stores import names
from memoryctl.stores.protocols import GraphStore, VectorStore

if TYPE_CHECKING:
    from memoryctl.embed import Embedder
    from memoryctl.query.rerank import PairScorer, RerankSettings

SCOPE_TTL_S = 60.0  # how long an agent's point count is trusted for vector-first sizing


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
        rerank: tuple[bool, RerankSettings, Callable[[], tuple[PairScorer, PairScorer | None]]] | None = None,
    ) -> None:
        self.stores = QueryStores(rows, relational, vectors, graph, embedder, unavailable, graph_name)
        self.guard = guard
        self.default_half_life = default_half_life
        self.recalls = recalls
        self.options = options or PlanOptions()
        # (on by default, settings, the scorer and its fallback: made on first use)
        self.rerank = rerank
        self._scope: dict[str | None, tuple[float, int]] = {}  # agent -> (monotonic time, points)

    @property
    def relational(self) -> RelationalReads:
        return self.stores.relational

    def run(self, query: MemoryQuery) -> QueryResult:
        q = self.resolved(query)
        t0 = time.perf_counter()
        ctx = QueryContext(self.guard)
        reranking = self._reranking(q)
        first = dataclasses.replace(q, limit=max(q.limit, reranking.depth)) if reranking else q
        calls = StoreCalls(self.stores, first, ctx)
        chosen = self.choose(first, calls)
        ran = execute(chosen.shape, calls)
        hits = hydrate.hits(chosen, ran.ranked, calls)
        if reranking is not None and q.text:
            hits = self._reranked(q.text, hits, reranking, ctx)[: q.limit]
        result = QueryResult(hits, sorted(set(ctx.degraded)), ran.describe(), ctx.steps, q, notes=ctx.notes)
        result.ms = (time.perf_counter() - t0) * 1000
        if self.recalls is not None and hits:
            self._record(q, hits)
        return result

    def resolved(self, query: MemoryQuery) -> MemoryQuery:
        """The validated query with its half-life as it ranks: none when decay is off, else the
        one asked for, else the agent's configured one (None: none)."""
        q = query.validate()
        if not q.decay:
            half_life = None
        else:
            half_life = q.half_life if q.half_life is not None else self.default_half_life(q.agent_id)
        return q if half_life == q.half_life else dataclasses.replace(q, half_life=half_life)

    def _reranking(self, q: MemoryQuery) -> RerankSettings | None:
        """The rerank stage's settings when this query reranks: a text query, asked for or on by default."""
        if self.rerank is None or not q.text:
            return None
        on, settings, _ = self.rerank
        return settings if (q.rerank if q.rerank is not None else on) else None

    def _reranked(self, text: str, hits: list[Hit], settings: RerankSettings, ctx: QueryContext) -> list[Hit]:
        """``hits`` through the cross-encoder, timed as a step of the query; the note says when the
        budget cut it short."""
        from memoryctl.query.rerank import rerank
        from memoryctl.query.results import Step

        assert self.rerank is not None
        t0 = time.perf_counter()
        scorer, fallback = self.rerank[2]()
        scorer.ready()  # the first query of a process loads the model: not charged to the budget
        load_ms = (time.perf_counter() - t0) * 1000
        done = rerank(hits, text, scorer, settings, fallback=fallback)
        detail: dict[str, object] = {"depth": settings.depth, "blend": settings.blend}
        detail |= {"budget_ms": settings.budget_s * 1000, "load_ms": round(load_ms, 1)}
        detail["scorer"] = getattr(fallback if done.fallback else scorer, "where", "cpu")
        ctx.steps.append(
            Step("rerank", "cross-encoder", detail, (time.perf_counter() - t0) * 1000, done.offered, done.read)
        )
        ctx.notes += [n for n in (done.fallback, done.note) if n]
        return done.hits

    def choose(self, q: MemoryQuery, calls: StoreCalls) -> Plan:
        """Ask ``plan`` until it stops needing facts; fetch each fact it asks for (a store call)."""
        store = self.stores.graph() if q.graph is not None else None
        facts = Facts(graph_checks_cheaply=bool(store is not None and store.cheap_membership), now=datetime.now(UTC))
        while isinstance(chosen := plan(q, facts, self.options), Need):
            if chosen.fact == "fanout":
                assert chosen.traverse is not None
                facts = dataclasses.replace(facts, fanout=calls.fanout(chosen.traverse))
            else:
                facts = dataclasses.replace(facts, scope=self._scope_size(q.agent_id, calls))
        return chosen

    def _scope_size(self, agent_id: str | None, calls: StoreCalls) -> int:
        """Points the vector search ranks for this agent (cached briefly: a sizing estimate); 0
        when the vector store cannot say."""
        now = time.monotonic()
        cached = self._scope.get(agent_id)
        if cached is not None and now - cached[0] < SCOPE_TTL_S:
            return cached[1]
        size = calls.scope_size(agent_id)
        if size is None:
            return 0
        self._scope[agent_id] = (now, size)
        return size

    def _record(self, q: MemoryQuery, hits: list[Hit]) -> None:
        """Recall events feed the nightly datasets; losing one is not worth failing a query."""
        assert self.recalls is not None
        try:
            self.recalls.record_recalls(q.query_id, q.text, [(h.memory.agent_id, h.id, h.score) for h in hits])
        except MemoryctlError:
            pass
