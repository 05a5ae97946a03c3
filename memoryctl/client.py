"""``MemoryClient``: the Python API, a facade over the stack. The CLI is a thin shell over it.

Writes are ``memoryctl/write/``'s (``Writes``): they land in PostgreSQL first (one transaction with
their outbox rows) and are then delivered inline, best effort; whatever could not be delivered
stays in the outbox for ``sync``. Queries are ``memoryctl/query/``'s (``QueryEngine``); the
maintenance operations are imported when called.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memoryctl.config import Settings, load_settings, revealed
from memoryctl.errors import InputError, MemoryctlError, NotFoundError
from memoryctl.maintenance.runs import recorded_run
from memoryctl.model import Memory, validate_kind, validate_meta_key
from memoryctl.query.engine import QueryEngine
from memoryctl.query.guard import Guard
from memoryctl.query.plan import PlanOptions
from memoryctl.query.relational import RelationalQueries
from memoryctl.query.results import QueryResult
from memoryctl.query.spec import MemoryQuery
from memoryctl.stack import Stack
from memoryctl.stores.schema import apply_schema, schema_state
from memoryctl.vocabulary import Vocabulary
from memoryctl.write.outbox import DeliveryReport
from memoryctl.write.pipeline import WriteOutcome, Writes

if TYPE_CHECKING:  # the operations are imported when called: `import memoryctl` stays light
    from memoryctl.backup.status import BackupReport
    from memoryctl.health.probes import HealthReport
    from memoryctl.maintenance.model_migration import MigrationReport
    from memoryctl.maintenance.nightly import NightlyReport
    from memoryctl.maintenance.reconcile import ReconcileReport
    from memoryctl.maintenance.reembed import ReembedReport
    from memoryctl.query.rerank import PairScorer, RerankSettings

MAX_HEALTH_DEADLINE_S = 60.0


class MemoryClient(AbstractContextManager["MemoryClient"]):
    """One handle on the whole stack. Use as a context manager, or call ``close()``."""

    def __init__(self, settings: Settings | None = None, *, stack: Stack | None = None) -> None:
        self.settings = settings or load_settings()
        self.stack = stack or Stack(self.settings)

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stack.close()

    # ---- setup --------------------------------------------------------------------------------
    def init(self) -> dict[str, Any]:
        """Apply schema migrations and create the vector collection and graph constraints."""
        applied = apply_schema(self.stack.pool)
        vectors = self.stack.vectors()
        graph = self.stack.graph()
        return {
            "migrations_applied": applied,
            "schema": [{"version": r["version"], "variant": r["variant"]} for r in schema_state(self.stack.pool)],
            "vector_model": self.stack.embedder.info.model_id if vectors else None,
            "degraded": dict(self.stack.unavailable),
            "graph": graph is not None,
        }

    # ---- writes -------------------------------------------------------------------------------
    @cached_property
    def vocabulary(self) -> Vocabulary:
        return Vocabulary.from_settings(self.settings.graph)

    @cached_property
    def writes(self) -> Writes:
        """The write path (``memoryctl/write/pipeline.py``)."""
        return Writes(
            self.stack,
            self.vocabulary,
            default_agent=self.settings.default_agent,
            breaker_reset_s=self.settings.write.breaker_reset_s,
        )

    @property
    def write_budget_s(self) -> float | None:
        """How long a write waits for its delivery after the commit (None: as long as it takes);
        `memoryctl serve` sets [write] delivery_budget_s on the cluster profile."""
        return self.writes.budget_s

    @write_budget_s.setter
    def write_budget_s(self, seconds: float | None) -> None:
        self.writes.budget_s = seconds

    def add(self, memories: Sequence[Memory], *, deliver: bool = True, extract: bool = True) -> WriteOutcome:
        """Store ``memories`` (with what the extractor finds in them) and deliver them."""
        return self.writes.add(memories, deliver=deliver, extract=extract)

    def import_jsonl(
        self,
        path: Path,
        *,
        agent_id: str | None = None,
        strict: bool = False,
        deliver: bool = True,
        progress: Callable[[int], None] | None = None,
    ) -> WriteOutcome:
        """Import a JSONL file in batches. Bad lines are skipped and reported (or, strict, refused)."""
        return self.writes.import_jsonl(path, agent_id=agent_id, strict=strict, deliver=deliver, progress=progress)

    def forget(self, ids: Sequence[uuid.UUID], *, agent_id: str | None = None) -> WriteOutcome:
        """Soft delete, all or nothing: hidden from every query path at once; purged later by reconcile."""
        return self.writes.forget(ids, agent_id=agent_id)

    def sync(
        self, *, batch: int = 256, trigger: str | None = None, actor: str | None = None
    ) -> tuple[DeliveryReport, dict[str, int]]:
        """Drain the outbox (everything due, retrying deferred rows now); recorded as a ``sync`` run
        (``trigger``/``actor``: the caller's, when the service runs it for someone else)."""
        with recorded_run(self.stack.runs, "sync", trigger=trigger, actor=actor) as rec:
            self.stack.records.retry_now()
            report = self.writes.deliver(None, batch=batch)
            pending = self.writes.pending(None)
            rec.counts = {**report.delivered, "pending": pending}
            if any(pending.values()):
                rec.status = "partial"
                rec.error = "; ".join(f"{t}: {e}" for t, e in report.failed.items()) or None
        return report, pending

    def set_aside(self, *, limit: int = 1000) -> list[dict[str, Any]]:
        """Outbox rows delivery set aside after they failed alone, oldest first, with their error."""
        return self.stack.records.set_aside_rows(limit=limit)

    def retry_set_aside(self, rows: Sequence[int] | None = None) -> int:
        """Put rows set aside (all, or these outbox row ids) back in the queue; how many."""
        return self.stack.records.retry_set_aside(rows)

    def drop_set_aside(self, rows: Sequence[int] | None = None) -> int:
        """Delete rows set aside (all, or these outbox row ids); how many."""
        return self.stack.records.drop_set_aside(rows)

    # ---- reads --------------------------------------------------------------------------------
    @cached_property
    def engine(self) -> QueryEngine:
        qs = self.settings.query
        return QueryEngine(
            self.stack.records,
            RelationalQueries(self.stack.pool, lexical_timeout_s=qs.lexical_timeout_s or qs.store_timeout_s),
            vectors=self.stack.vectors,
            graph=self.stack.graph,
            embedder=lambda: self.stack.embedder,
            guard=Guard(timeout_s=qs.store_timeout_s, failures=qs.breaker_failures, reset_s=qs.breaker_reset_s),
            unavailable=self.stack.unavailable,
            default_half_life=qs.half_life_for,
            recalls=self.stack.events,
            graph_name=self.stack.store_names["graph"],
            options=PlanOptions(
                qs.vector_first_min_fanout,
                qs.vector_first_max_k,
                qs.context_turns,
                qs.dense_without_names,
                qs.dates_named,
                qs.session_context,
            ),
            rerank=(qs.rerank, self._rerank_settings, lambda: self._rerank_scorers),
        )

    @property
    def _rerank_settings(self) -> RerankSettings:
        from memoryctl.query.rerank import RerankSettings

        qs = self.settings.query
        return RerankSettings(qs.rerank_depth, qs.rerank_blend, qs.rerank_budget_ms / 1000)

    @cached_property
    def _rerank_scorers(self) -> tuple[PairScorer, PairScorer | None]:
        """The rerank model and its fallback, made on the first query that reranks: the served
        cross-encoder with the CPU model behind it when ``[query] rerank_url`` is set, else the CPU
        model alone (loaded then, checked by content)."""
        from memoryctl.query.rerank import CrossEncoder, ServedScorer
        from memoryctl.vllm import VLLMClient

        qs = self.settings.query
        cpu = CrossEncoder(qs.rerank_model_dir)
        if not qs.rerank_url:
            return cpu, None
        key = self.settings.vllm.api_key
        client = VLLMClient(
            qs.rerank_url,
            api_key=revealed(key),
            timeout_s=qs.rerank_timeout_s,
            store="rerank",
            settings="query.rerank",
        )
        return ServedScorer(client, qs.rerank_model, timeout_s=qs.rerank_timeout_s), cpu

    def query(self, q: MemoryQuery | None = None, /, **fields: Any) -> QueryResult:
        """Run one unified query: ``client.query(MemoryQuery(...))`` or ``client.query(text=..., ...)``."""
        if q is None:
            fields.setdefault("agent_id", None if fields.get("all_agents") else self.settings.default_agent)
            q = MemoryQuery(**fields)
        q = self.vocabulary.check_query(q)
        result = self.engine.run(q)
        if self.stack.store_names["vector"] in result.degraded and self._active_model_swapped():
            # `migrate` in another process swapped the active model after this (long-lived) client
            # built its embedder, e.g. memoryctl serve: embed with the model now active, ask again.
            self.stack.reload_embedder()
            result = self.engine.run(q)
        return result

    def _active_model_swapped(self) -> bool:
        from memoryctl.maintenance.pgstate import OpsState

        try:
            row = OpsState(self.stack.pool).active_embedding()
        except MemoryctlError:
            return False
        return row is not None and row["model_id"] != self.stack.embedder.info.model_id

    def feedback(self, query_id: uuid.UUID, memory_id: uuid.UUID, *, useful: bool) -> None:
        """Say whether a recalled memory was useful: the embedding adapter learns from these pairs."""
        self.stack.events.record_feedback(query_id, memory_id, useful=useful)

    def count(self, *, agent_id: str | None = None, include_deleted: bool = False) -> int:
        """Memories in PostgreSQL (soft-deleted ones too with ``include_deleted``)."""
        return self.stack.records.count(agent_id=agent_id, include_deleted=include_deleted)

    def stats(
        self,
        *,
        agent_id: str | None,
        since: datetime,
        until: datetime,
        width: timedelta,
        metric: str | None = None,
        kind: str | None = None,
    ) -> list[dict[str, Any]]:
        """Count (and avg/min/max of the numeric metadata ``metric``) per time bucket, empty buckets too."""
        from memoryctl.query.stats import stats

        return stats(
            self.stack.pool,
            agent_id=agent_id,
            since=since,
            until=until,
            width_s=width.total_seconds(),
            metric=validate_meta_key(metric) if metric else None,
            kind=validate_kind(kind) if kind else None,
        )

    def cypher(self, statement: str, params: dict[str, Any], *, agent_id: str) -> list[dict[str, Any]]:
        """Raw Cypher in a READ transaction (write clauses refused); ``$agent_id`` is bound."""
        reader = self.stack.cypher()
        if reader is None:
            raise InputError(
                f"raw Cypher needs Neo4j; the {self.settings.profile} profile's graph is "
                f"{self.stack.require_graph().engine}",
                hint="use `memoryctl query --entity … --via …` (structured graph filters work on every profile)",
            )
        return reader.run_read(statement, params, agent_id)

    # ---- operations -----------------------------------------------------------------------------
    def health(self, *, deadline_s: float = 1.8) -> HealthReport:
        """Every component probed in parallel, each under the deadline (0-60 s)."""
        from memoryctl.health.probes import check

        if not (isinstance(deadline_s, int | float) and 0 < deadline_s <= MAX_HEALTH_DEADLINE_S):
            raise InputError(
                f"health deadline {deadline_s!r} is out of range",
                hint=f"seconds, more than 0 and at most {MAX_HEALTH_DEADLINE_S:g}",
            )

        return check(self.stack, deadline_s=deadline_s)

    def runs(self, *, command: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """Recent maintenance runs, newest first."""
        return self.stack.runs.recent(command=command, limit=limit)

    def reconcile(
        self,
        *,
        agent_id: str | None = None,
        repair: bool = False,
        progress: Callable[[int], None] | None = None,
        stores: Sequence[str] = ("vector", "graph"),
    ) -> ReconcileReport:
        """Compare PostgreSQL with the vector store and/or the graph; repair what is found with ``repair``."""
        from memoryctl.maintenance.reconcile import reconcile

        return reconcile(self.stack, agent_id=agent_id, repair=repair, progress=progress, stores=stores)

    def migrate_model(self, action: str, **options: Any) -> MigrationReport:
        """``migrate`` (``target=EmbedderSettings``), ``rollback``, ``cleanup`` (``grace=``) or
        ``abandon``: moving the vectors to another embedding model (not the schema: see ``init``)."""
        from memoryctl.maintenance.model_migration import run_model_migration

        return run_model_migration(self.stack, action, **options)

    def reembed_changed(
        self, *, agent_id: str | None = None, batch: int = 512, progress: Callable[[int], None] | None = None
    ) -> ReembedReport:
        """Re-embed in place the memories whose text changed since they were embedded."""
        from memoryctl.maintenance.reembed import reembed_changed

        vectors = self.stack.require_vectors()
        with recorded_run(self.stack.runs, "reembed") as rec:
            report = reembed_changed(
                self.stack.records, vectors, self.stack.embedder, agent_id=agent_id, batch=batch, progress=progress
            )
            rec.counts = {"scanned": report.scanned, "changed": report.changed}
            rec.details = report.as_dict()
        return report

    def backup_status(self) -> BackupReport:
        """When each store was last backed up, and whether it can be restored."""
        from memoryctl.backup.status import backup_status

        return backup_status(self.stack)

    def backup_vectors(self) -> dict[str, Any]:
        """Snapshot every vector collection and ship the set to the backup target; a recorded run."""
        from memoryctl.backup.snapshots import backup_qdrant

        return backup_qdrant(self.stack)

    def restore_vectors(self, *, name: str | None = None) -> dict[str, Any]:
        """Restore a snapshot set (the newest complete one by default); a recorded run."""
        from memoryctl.backup.snapshots import restore_qdrant

        return restore_qdrant(self.stack, name=name)

    def rebuild_graph(self, *, batch: int = 1000, prune: bool = True) -> dict[str, Any]:
        """Rebuild the graph from PostgreSQL, the source of truth; a recorded run."""
        from memoryctl.backup.rebuild import rebuild_graph

        return rebuild_graph(self.stack, batch=batch, prune=prune)

    def nightly(self) -> NightlyReport:
        """Train, gate and promote LoRA adapters, re-embed changed texts, reconcile; one recorded run."""
        from memoryctl.maintenance.nightly import Nightly

        return Nightly(self.stack).run()

    def get(self, mid: uuid.UUID, *, agent_id: str | None = None) -> Memory:
        m = self.stack.records.get(mid)
        if m is None or (agent_id is not None and m.agent_id != agent_id):
            raise NotFoundError(f"no memory {mid}", hint="ids are UUIDs printed by `memoryctl add`")
        return m
