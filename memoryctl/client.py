"""``MemoryClient``: the Python API. The CLI is a thin shell over it.

Writes land in PostgreSQL first (one transaction with their outbox rows) and are then delivered
inline, best effort; whatever could not be delivered stays in the outbox for ``sync``. A result
says what is pending so callers (and the CLI's exit code 3) can tell "stored" from "searchable".
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memoryctl.config import Settings, load_settings
from memoryctl.delivery import Deliverer, DeliveryReport
from memoryctl.errors import InputError, MemoryctlError, NotFoundError, StoreUnavailable
from memoryctl.importer import BadLine, read_jsonl
from memoryctl.model import Memory, dedupe_entities, validate_agent_id, validate_kind, validate_meta_key
from memoryctl.ops.runs import recorded_run
from memoryctl.query.engine import QueryEngine
from memoryctl.query.guard import Guard
from memoryctl.query.plan import PlanOptions
from memoryctl.query.relational import RelationalQueries
from memoryctl.query.results import QueryResult
from memoryctl.query.spec import MemoryQuery
from memoryctl.stack import Stack
from memoryctl.stores.records import UpsertResult
from memoryctl.stores.schema import apply_schema, schema_state
from memoryctl.vocabulary import Vocabulary
from memoryctl.write_delivery import WriteDelivery

if TYPE_CHECKING:  # the operations are imported when called: `import memoryctl` stays light
    from memoryctl.backup.status import BackupReport
    from memoryctl.health import HealthReport
    from memoryctl.ops.model_migration import MigrationReport
    from memoryctl.ops.nightly import NightlyReport
    from memoryctl.ops.reconcile import ReconcileReport
    from memoryctl.ops.reembed import ReembedReport
    from memoryctl.query.rerank import CrossEncoder, RerankSettings

IMPORT_BATCH = 500
# Batches of other pending deliveries a single add or forget takes along (an import takes them all):
# enough to drain what a killed process left within a few writes, bounded so one add stays quick.
BACKLOG_PER_WRITE = 1
# A commit takes 0.1-0.3 s on the cluster; one still running after this is waiting out a failover
# (or a lost standby): the service then asks the delivery stores whether they answer.
PROBE_AFTER_S = 1.0
MAX_HEALTH_DEADLINE_S = 60.0
# How long a write waits for its own outbox rows when another delivery holds them (a concurrent
# write's backlog batch, a `sync`): that delivery is moving them right now, so waiting tells the
# caller the truth ("searchable") instead of "pending"; longer than this, it says what holds them.
OWN_ROWS_WAIT_S = 15.0


@dataclass(slots=True)
class WriteOutcome:
    ids: list[uuid.UUID] = field(default_factory=list)
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    invalid: list[BadLine] = field(default_factory=list)
    delivery: DeliveryReport = field(default_factory=DeliveryReport)
    pending: dict[str, int] = field(default_factory=dict)  # store -> memories awaiting delivery

    def add(self, result: UpsertResult) -> None:
        self.inserted += len(result.inserted)
        self.updated += len(result.updated)
        self.unchanged += len(result.unchanged)

    @property
    def degraded(self) -> list[str]:
        return sorted(store for store, n in self.pending.items() if n)

    def as_dict(self) -> dict[str, Any]:
        return {
            "inserted": self.inserted,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "invalid": [{"line": b.line, "error": b.error} for b in self.invalid],
            "pending": self.pending,
            "delivery": self.delivery.as_dict(),
        }


def _conflict_line(n: int, m: Memory) -> BadLine:
    return BadLine(n, f"id {m.id} already belongs to another agent: an id names one memory of one agent")


class MemoryClient:
    """One handle on the whole stack. Use as a context manager, or call ``close()``."""

    def __init__(self, settings: Settings | None = None, *, stack: Stack | None = None) -> None:
        self.settings = settings or load_settings()
        self.stack = stack or Stack(self.settings)
        # How long a write waits for its delivery after the commit (None: as long as it takes);
        # `memoryctl serve` sets [write] delivery_budget_s on the cluster profile.
        self.write_budget_s: float | None = None

    def __enter__(self) -> MemoryClient:
        return self

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
    def _enrich(self, m: Memory) -> Memory:
        """Add what the configured extractor finds to what the caller gave explicitly."""
        found = self.stack.extractor.extract(m.text, m.id)
        if found.entities:
            m.entities = dedupe_entities([*m.entities, *found.entities], m.agent_id)
        if found.relations:
            m.relations = [*m.relations, *found.relations]
        return m

    @cached_property
    def vocabulary(self) -> Vocabulary:
        return Vocabulary.from_settings(self.settings.graph)

    def add(self, memories: Sequence[Memory], *, deliver: bool = True, extract: bool = True) -> WriteOutcome:
        out = WriteOutcome()
        batch = [self.vocabulary.check_memory(self._enrich(m) if extract else m) for m in memories]
        with self._probe_if_slow(deliver):
            result = self.stack.records.upsert(batch)
        out.ids = [m.id for m in batch]
        out.add(result)
        self._settle(out, result.changed if deliver else [], pending_ids=out.ids)
        return out

    def _settle(
        self, out: WriteOutcome, changed: Sequence[uuid.UUID], *, pending_ids: Sequence[uuid.UUID] | None
    ) -> None:
        """Deliver what a committed write changed and count what is still pending.

        The write has committed by now, so losing PostgreSQL here (a failover's broken connection, a
        switchover's shutdown) must not report it as failed: the caller would take a stored memory
        for a lost one. Its outbox rows are committed with it, so the next write or ``sync``
        delivers them; the outcome says "stored, delivery pending" (exit 3) with the reason, and
        counts the changed memories as pending wherever their delivery was not confirmed (the
        drill found a switchover turning a committed add into exit 1, issue 26).
        """
        try:
            if changed:
                out.delivery = self._deliver_write(changed)
            out.pending = self._pending(pending_ids)
        except StoreUnavailable as exc:
            if exc.store != "postgres":
                raise
            reason = f"{exc.message}, after the write committed: its outbox entries deliver it later"
            behind = [
                t for t in ("vector", "graph") if t in out.delivery.failed or out.delivery.delivered[t] < len(changed)
            ]
            for target in behind:
                out.delivery.failed.setdefault(target, reason)
            out.pending = {self.stack.store_names[t]: len(changed) if t in behind else 0 for t in ("vector", "graph")}

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
        default_agent = validate_agent_id(agent_id) if agent_id is not None else self.settings.default_agent
        out = WriteOutcome()
        try:
            stream = path.open("rb")
        except OSError as exc:
            raise InputError(f"cannot read {path}: {exc.strerror}") from None
        with stream:
            if strict:
                parsed = list(
                    self.vocabulary.screen(read_jsonl(stream, default_agent=default_agent, forced_agent=agent_id))
                )
                bad = [p for _, p in parsed if isinstance(p, BadLine)] + self._conflicting_lines(parsed)
                if bad:
                    out.invalid = sorted(bad, key=lambda b: b.line)
                    return out
                source: Iterable[tuple[int, Memory | BadLine]] = parsed
            else:
                source = self.vocabulary.screen(read_jsonl(stream, default_agent=default_agent, forced_agent=agent_id))
            batch: list[tuple[int, Memory]] = []
            for n, item in source:
                if isinstance(item, BadLine):
                    out.invalid.append(item)
                    if progress:
                        progress(1)
                    continue
                batch.append((n, item))
                if len(batch) >= IMPORT_BATCH:
                    self._import_batch(batch, out, deliver, progress)
                    batch = []
            if batch:
                self._import_batch(batch, out, deliver, progress)
        working = [t for t in ("vector", "graph") if t not in out.delivery.failed]
        if deliver and working:
            # What is still pending for a store that took this import: e.g. what a killed run of
            # the same import left behind (its lines are unchanged now, so nothing above sent them).
            out.delivery.merge(self._deliver([], targets=working, backlog=-1))
        out.invalid.sort(key=lambda b: b.line)
        out.pending = self._pending(None)
        return out

    def _conflicting_lines(self, parsed: Sequence[tuple[int, Memory | BadLine]]) -> list[BadLine]:
        """``--strict`` refuses a file before writing anything: the lines whose id is another agent's."""
        lines = [(n, m) for n, m in parsed if isinstance(m, Memory)]
        owners = self.stack.records.owners([m.id for _, m in lines])
        for _, m in lines:
            owners.setdefault(m.id, m.agent_id)  # the first line of a new id owns it within the file
        return [_conflict_line(n, m) for n, m in lines if owners[m.id] != m.agent_id]

    def _import_batch(
        self,
        batch: list[tuple[int, Memory]],
        out: WriteOutcome,
        deliver: bool,
        progress: Callable[[int], None] | None,
    ) -> None:
        result = self.stack.records.upsert([self._enrich(m) for _, m in batch], skip_conflicts=True)
        out.add(result)
        conflicts = set(result.conflicts)
        out.ids.extend(m.id for i, (_, m) in enumerate(batch) if i not in conflicts)
        out.invalid.extend(_conflict_line(*batch[i]) for i in result.conflicts)
        if deliver and result.changed:
            # A store that failed once in this import is not retried per batch: sync will.
            targets = [t for t in ("vector", "graph") if t not in out.delivery.failed]
            out.delivery.merge(self._deliver(result.changed, targets=targets))
        if progress:
            progress(len(batch))

    def forget(self, ids: Sequence[uuid.UUID], *, agent_id: str | None = None) -> WriteOutcome:
        """Soft delete: hidden from every query path at once; purged later by reconcile.

        All or nothing: an id that names no memory (of ``agent_id``, when given) is an error
        before anything is forgotten (the harness found ``forget KNOWN UNKNOWN`` exiting 1 "no
        memory" with KNOWN forgotten all the same). Forgetting a forgotten memory changes nothing.
        """
        owners = self.stack.records.owners(ids)
        missing = [i for i in ids if i not in owners or (agent_id is not None and owners[i] != agent_id)]
        if missing:
            raise NotFoundError(
                f"no memory {', '.join(map(str, missing))}" + (f" for agent {agent_id!r}" if agent_id else ""),
                hint="check the id with `memoryctl get ID`; nothing was forgotten",
            )
        done = self.stack.records.soft_delete(ids, agent_id=agent_id)
        out = WriteOutcome(ids=list(done), updated=len(done))
        self._settle(out, done, pending_ids=done)
        return out

    def sync(
        self, *, batch: int = 256, trigger: str | None = None, actor: str | None = None
    ) -> tuple[DeliveryReport, dict[str, int]]:
        """Drain the outbox (everything due, retrying deferred rows now); recorded as a ``sync`` run
        (``trigger``/``actor``: the caller's, when the service runs it for someone else)."""
        with recorded_run(self.stack.runs, "sync", trigger=trigger, actor=actor) as rec:
            self.stack.records.retry_now()
            report = self._deliver(None, batch=batch)
            pending = self._pending(None)
            rec.counts = {**report.delivered, "pending": pending}
            if any(pending.values()):
                rec.status = "partial"
                rec.error = "; ".join(f"{t}: {e}" for t, e in report.failed.items()) or None
        return report, pending

    def _deliver(
        self,
        ids: Sequence[uuid.UUID] | None,
        *,
        batch: int = 256,
        targets: Sequence[str] = ("vector", "graph"),
        backlog: int = 0,
    ) -> DeliveryReport:
        """Deliver ``ids`` (None: everything due); then, to each store that just took them, up to
        ``backlog`` batches of what else is due (-1: all of it, deferred rows made due first).

        The backlog is work a killed import or an earlier outage left behind: a store that works
        again gets it from the next write, nobody has to know to run ``sync`` (issue 22, item 3).
        """
        vectors = self.stack.vectors() if "vector" in targets else None
        graph = self.stack.graph() if "graph" in targets else None
        usable = [t for t, store in (("vector", vectors), ("graph", graph)) if t in targets and store is not None]
        deliverer = Deliverer(self.stack.records, vectors, graph, self.stack.embedder if vectors else None)
        report = deliverer.deliver(
            memory_ids=ids, batch=batch, targets=usable, wait_held_s=OWN_ROWS_WAIT_S if ids else None
        )
        working = [t for t in usable if t not in report.failed]
        if ids is not None and backlog and working:
            if backlog < 0:
                self.stack.records.retry_now(working)
            report.merge(deliverer.deliver(batch=batch, targets=working, max_batches=None if backlog < 0 else backlog))
        for target in targets:
            if target not in usable:
                report.failed[target] = self.stack.unavailable.get(self.stack.store_names[target], "unavailable")
        return report

    @contextmanager
    def _probe_if_slow(self, deliver: bool) -> Iterator[None]:
        """In the budgeted path: a commit still running after ``PROBE_AFTER_S`` has the delivery
        stores asked whether they answer (memoryctl/write_delivery.py says why)."""
        if self.write_budget_s is None or not deliver:
            yield
            return
        budget = self.write_budget_s
        timer = threading.Timer(
            PROBE_AFTER_S, lambda: self._write_delivery.probe(("vector", "graph"), self._ping, budget)
        )
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _ping(self, target: str) -> None:
        store = self.stack.vectors() if target == "vector" else self.stack.graph()
        if store is not None:
            store.ping()

    @cached_property
    def _write_delivery(self) -> WriteDelivery:
        return WriteDelivery(reset_s=self.settings.write.breaker_reset_s)

    def _deliver_write(self, ids: Sequence[uuid.UUID]) -> DeliveryReport:
        """A committed write's own delivery: in the service on the cluster profile both stores at
        once within ``[write] delivery_budget_s`` (memoryctl/write_delivery.py says why), then a
        batch of backlog each; elsewhere one store after the other, as long as it takes."""
        if self.write_budget_s is None:
            # One store after the other, each connection held only for its own delivery: with both
            # at once a write holds two of the pool's connections, and the embedded service under 8
            # clients starved its queries of connections ("postgres: no answer within 2.0s",
            # tests/e2e/test_serve_load.py in the fresh-clone rehearsal).
            return self._deliver(ids, backlog=BACKLOG_PER_WRITE)
        # The budget is for a store that stopped answering, not for opening one: a store not open
        # yet (the service's first write) opens here, bounded by its own timeouts.
        self.stack.vectors()
        self.stack.graph()
        return self._write_delivery.run(
            ("vector", "graph"),
            own=lambda target: self._deliver(ids, targets=[target]),
            backlog=lambda target: self._backlog(target, BACKLOG_PER_WRITE),
            store_name=lambda target: self.stack.store_names[target],
            budget_s=self.write_budget_s,
        )

    def _backlog(self, target: str, batches: int) -> DeliveryReport:
        """Up to ``batches`` of what else is due to ``target``, which just took a write."""
        vectors = self.stack.vectors() if target == "vector" else None
        graph = self.stack.graph() if target == "graph" else None
        deliverer = Deliverer(self.stack.records, vectors, graph, self.stack.embedder if vectors else None)
        return deliverer.deliver(targets=[target], max_batches=batches)

    def set_aside(self, *, limit: int = 1000) -> list[dict[str, Any]]:
        """Outbox rows delivery set aside after they failed alone, oldest first, with their error."""
        return self.stack.records.set_aside_rows(limit=limit)

    def retry_set_aside(self, rows: Sequence[int] | None = None) -> int:
        """Put rows set aside (all, or these outbox row ids) back in the queue; how many."""
        return self.stack.records.retry_set_aside(rows)

    def drop_set_aside(self, rows: Sequence[int] | None = None) -> int:
        """Delete rows set aside (all, or these outbox row ids); how many."""
        return self.stack.records.drop_set_aside(rows)

    def _pending(self, ids: Sequence[uuid.UUID] | None) -> dict[str, int]:
        counts = self.stack.records.pending_count(ids)
        return {self.stack.store_names[t]: counts.get(t, 0) for t in ("vector", "graph")}

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
            rerank=(qs.rerank, self._rerank_settings, lambda: self._cross_encoder),
        )

    @property
    def _rerank_settings(self) -> RerankSettings:
        from memoryctl.query.rerank import RerankSettings

        qs = self.settings.query
        return RerankSettings(qs.rerank_depth, qs.rerank_blend, qs.rerank_budget_ms / 1000)

    @cached_property
    def _cross_encoder(self) -> CrossEncoder:
        """The rerank model, loaded on the first query that reranks (checked by content then)."""
        from memoryctl.query.rerank import CrossEncoder

        return CrossEncoder()

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
        from memoryctl.ops.pgstate import OpsState

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
        from memoryctl.health import check

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
        from memoryctl.ops.reconcile import reconcile

        return reconcile(self.stack, agent_id=agent_id, repair=repair, progress=progress, stores=stores)

    def migrate_model(self, action: str, **options: Any) -> MigrationReport:
        """``migrate`` (``target=EmbedderSettings``), ``rollback``, ``cleanup`` (``grace=``) or
        ``abandon``: moving the vectors to another embedding model (not the schema: see ``init``)."""
        from memoryctl.ops.model_migration import run_model_migration

        return run_model_migration(self.stack, action, **options)

    def reembed_changed(
        self, *, agent_id: str | None = None, batch: int = 512, progress: Callable[[int], None] | None = None
    ) -> ReembedReport:
        """Re-embed in place the memories whose text changed since they were embedded."""
        from memoryctl.ops.reembed import reembed_changed

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
        from memoryctl.ops.nightly import Nightly

        return Nightly(self.stack).run()

    def get(self, mid: uuid.UUID, *, agent_id: str | None = None) -> Memory:
        m = self.stack.records.get(mid)
        if m is None or (agent_id is not None and m.agent_id != agent_id):
            raise NotFoundError(f"no memory {mid}", hint="ids are UUIDs printed by `memoryctl add`")
        return m
