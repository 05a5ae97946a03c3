"""``memoryctl reconcile``: find and (with ``--repair``) fix drift between PostgreSQL and the stores.

PostgreSQL is the source of truth; the vector store and the graph are projections of it. Drift
happens when a delivery was lost outside the outbox (a store restored from an old snapshot, a
manual delete, a bug), or when a purge reached one store and not the other. Categories, per store:

- **orphan**: the store has the id, PostgreSQL does not (and no purge is pending for it).
- **missing**: PostgreSQL has a live memory the store lacks, with no delivery pending in the outbox.
  A soft-deleted memory missing from a store is not drift: absence is its final state anyway.
- **stale**: both have it but they disagree: content hash (vector store), deleted flag, agent.
- **purge-due**: soft-deleted in PostgreSQL longer than ``delete_grace`` (counted once, not per store).
- **model**: the active collection was built by another model than the configured embedder; every
  vector is then stale, which only ``memoryctl migrate`` can fix, so it is reported, not repaired.

How: one merge-join over the id-ordered keyset pages of the three stores (``maintenance.streams``); memory
is bounded by the page size and the candidate buffer, never by the number of memories. Candidates
are confirmed in chunks before they count: an outbox entry for that target means "delivery
pending", not drift; an orphan that PostgreSQL has by now (written after its page was read) is a
race, not an orphan. ``--repair`` acts on confirmed findings only, so running it twice, or while
writes continue, is harmless: orphans are deleted from their store, missing/stale memories are
enqueued and delivered through the normal outbox path, purge-due rows are purged (the purge
reaches the stores through the outbox as well).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from memoryctl.maintenance.needs import MaintenanceStack
from memoryctl.maintenance.pgstate import OpsState
from memoryctl.maintenance.runs import recorded_run
from memoryctl.maintenance.streams import paged_join, record_key, row_key
from memoryctl.model import parse_duration
from memoryctl.stores import names
from memoryctl.stores.protocols import GraphRecord, GraphStore, VectorRecord, VectorStore
from memoryctl.stores.records import RecordStore
from memoryctl.write.outbox import Deliverer, DeliveryReport

if TYPE_CHECKING:
    from memoryctl.embed import Embedder

CATEGORIES = ("orphan", "missing", "stale")
#: A store's counts in its report, in this order.
COUNTS = ("scanned", *CATEGORIES, "pending", "raced", "repaired")
TARGET_OF = {"vector": "vector", "graph": "graph"}
SAMPLES = 10
# How long a repair waits for outbox rows another delivery holds (cron's `sync` or reconcile
# delivering the same ids) before it reports them as not repaired.
HELD_WAIT_S = 120.0


@dataclass(slots=True)
class StoreDrift:
    name: str
    scanned: int = 0
    orphan: int = 0
    missing: int = 0
    stale: int = 0
    pending: int = 0  # looked like drift, but an outbox entry will deliver it: not drift
    raced: int = 0  # changed while we scanned (re-checked): not drift
    repaired: int = 0
    samples: dict[str, list[str]] = field(default_factory=lambda: {c: [] for c in CATEGORIES})

    @property
    def drift(self) -> int:
        return self.orphan + self.missing + self.stale

    def note(self, category: str, mid: uuid.UUID) -> None:
        setattr(self, category, getattr(self, category) + 1)
        if len(self.samples[category]) < SAMPLES:
            self.samples[category].append(str(mid))

    def as_dict(self) -> dict[str, Any]:
        counts = {c: getattr(self, c) for c in COUNTS}
        return {**counts, "samples": {k: v for k, v in self.samples.items() if v}}


@dataclass(slots=True)
class ReconcileReport:
    agent_id: str | None
    repair: bool
    postgres_scanned: int = 0
    stores: dict[str, StoreDrift] = field(default_factory=dict)
    purge_due: int = 0
    purged: int = 0
    purge_samples: list[str] = field(default_factory=list)
    model: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # store -> why it was not compared
    delivery: DeliveryReport = field(default_factory=DeliveryReport)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def drift(self) -> int:
        """Findings that need action (before repair); a model mismatch counts as one."""
        return sum(s.drift for s in self.stores.values()) + self.purge_due + (0 if self.model.get("match", True) else 1)

    @property
    def unrepaired(self) -> int:
        if not self.repair:
            return self.drift
        left = sum(max(0, s.drift - s.repaired) for s in self.stores.values()) + (self.purge_due - self.purged)
        return left + (0 if self.model.get("match", True) else 1)

    @property
    def ids_per_s(self) -> float:
        total = self.postgres_scanned + sum(s.scanned for s in self.stores.values())
        return total / self.seconds if self.seconds else 0.0

    def counts(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "postgres": self.postgres_scanned,
            "drift": self.drift,
            "purge_due": self.purge_due,
            "purged": self.purged,
        }
        for s in self.stores.values():
            out[f"{s.name}_scanned"] = s.scanned
            for c in CATEGORIES:
                out[f"{s.name}_{c}"] = getattr(s, c)
            out[f"{s.name}_repaired"] = s.repaired
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "agent_id": self.agent_id,
            "repair": self.repair,
            "drift": self.drift,
            "unrepaired": self.unrepaired,
            "postgres": {"scanned": self.postgres_scanned},
            "stores": {k: v.as_dict() for k, v in self.stores.items()},
            "purge_due": self.purge_due,
            "purged": self.purged,
            "purge_samples": self.purge_samples,
            "model": self.model,
            "skipped": self.skipped,
            "delivery": self.delivery.as_dict(),
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "ids_per_s": round(self.ids_per_s, 1),
        }


@dataclass(slots=True)
class _Candidate:
    store: str
    category: str
    id: uuid.UUID


@dataclass
class Reconciler:
    """One reconciliation pass. ``vectors``/``graph`` may be None (store down): reported as skipped."""

    records: RecordStore
    vectors: VectorStore | None
    graph: GraphStore | None
    embedder: Embedder | None
    _: KW_ONLY
    delete_grace: timedelta
    page: int = 2000
    chunk: int = 2000
    vector_model_id: str | None = None  # None = the active collection
    state: OpsState = field(init=False)

    def __post_init__(self) -> None:
        self.state = OpsState(self.records.pool)

    def run(
        self,
        *,
        agent_id: str | None = None,
        repair: bool = False,
        progress: Callable[[int], None] | None = None,
        skipped: dict[str, str] | None = None,
    ) -> ReconcileReport:
        started = time.perf_counter()
        report = ReconcileReport(agent_id=agent_id, repair=repair, skipped=dict(skipped or {}))
        cutoff = self.state.now() - self.delete_grace
        vector_ok = self._check_model(report)
        others: list[tuple[Any, Any, str]] = []
        slots: list[str] = []
        if self.vectors is not None:
            report.stores["vector"] = StoreDrift(self.vectors.name)
            vpages = self.vectors.scroll(agent_id=agent_id, model_id=self.vector_model_id, batch=self.page)
            others.append((vpages, record_key, self.vectors.name))
            slots.append("vector")
        if self.graph is not None:
            report.stores["graph"] = StoreDrift(self.graph.name)
            others.append((self.graph.scroll(agent_id=agent_id, batch=self.page), record_key, self.graph.name))
            slots.append("graph")
        pg_pages = self.records.scroll(agent_id=agent_id, batch=self.page)

        candidates: list[_Candidate] = []
        purge_due: list[uuid.UUID] = []
        for chunk in paged_join(pg_pages, row_key, others, max_unmatched=self.chunk):
            for i, slot in enumerate(slots):
                drift = report.stores[slot]
                matched, unmatched = chunk.matched[i], chunk.unmatched[i]
                drift.scanned += len(matched) + len(unmatched)
                candidates.extend(_Candidate(slot, "orphan", row.id) for row in unmatched)
                for pg in chunk.rows:
                    category = _classify(slot, pg, matched.get(pg["id"]))
                    if category is not None:
                        candidates.append(_Candidate(slot, category, pg["id"]))
            for pg in chunk.rows:
                deleted_at = pg["deleted_at"]
                if deleted_at is not None and deleted_at < cutoff:
                    purge_due.append(pg["id"])
            report.postgres_scanned += len(chunk.rows)
            if progress is not None and chunk.rows:
                progress(len(chunk.rows))
            if len(candidates) >= self.chunk:
                self._confirm(candidates, report, repair=repair, vector_ok=vector_ok)
                candidates = []
            if len(purge_due) >= self.chunk:
                self._purge(purge_due, report, repair=repair)
                purge_due = []
        if candidates:
            self._confirm(candidates, report, repair=repair, vector_ok=vector_ok)
        if purge_due:
            self._purge(purge_due, report, repair=repair)
        report.seconds = time.perf_counter() - started
        return report

    # ------------------------------------------------------------------------------------------
    def _check_model(self, report: ReconcileReport) -> bool:
        """Whether vectors may be (re)written: the embedder must be the collection's model."""
        if self.vectors is None:
            return False
        if self.vector_model_id is not None:
            collection_model: str | None = self.vector_model_id
        else:
            active = self.vectors.active_model()
            collection_model = active.model_id if active else None
        embedder_model = self.embedder.info.model_id if self.embedder is not None else None
        match = collection_model is not None and collection_model == embedder_model
        report.model = {"collection": collection_model, "embedder": embedder_model, "match": match}
        if not match:
            report.model["hint"] = (
                "the active collection was built by another model than the configured embedder: every vector is "
                "stale. Run `memoryctl migrate --to-model ...` (or fix [embedder] in the config); reconcile does "
                "not re-embed across models"
            )
        return match

    def _confirm(
        self, candidates: Sequence[_Candidate], report: ReconcileReport, *, repair: bool, vector_ok: bool
    ) -> None:
        ids = list({c.id for c in candidates})
        pending = self.state.pending_targets(ids)
        orphan_ids = [c.id for c in candidates if c.category == "orphan"]
        now_in_pg = self.state.existing(orphan_ids)
        delete: dict[str, list[uuid.UUID]] = {"vector": [], "graph": []}
        fix: dict[str, list[uuid.UUID]] = {"vector": [], "graph": []}
        redeliver: set[uuid.UUID] = set()
        for c in candidates:
            drift = report.stores[c.store]
            if TARGET_OF[c.store] in pending.get(c.id, set()):
                drift.pending += 1
                continue
            if c.category == "orphan" and c.id in now_in_pg:
                # Written after its PostgreSQL page was read, or moved to another agent: re-deliver.
                drift.raced += 1
                redeliver.add(c.id)
                continue
            drift.note(c.category, c.id)
            if c.category == "orphan":
                delete[c.store].append(c.id)
            else:
                fix[c.store].append(c.id)
                redeliver.add(c.id)
        if not repair:
            return
        if delete["vector"] and self.vectors is not None:
            self.vectors.delete(delete["vector"], model_id=self.vector_model_id)
            report.stores["vector"].repaired += len(delete["vector"])
        if delete["graph"] and self.graph is not None:
            self.graph.delete(delete["graph"])
            report.stores["graph"].repaired += len(delete["graph"])
        if redeliver:
            self._redeliver(sorted(redeliver), fix, report, vector_ok=vector_ok)

    def _redeliver(
        self, ids: list[uuid.UUID], fix: dict[str, list[uuid.UUID]], report: ReconcileReport, *, vector_ok: bool
    ) -> None:
        """Enqueue and deliver through the outbox: the same code path, and nothing lost if it fails."""
        self.records.enqueue(ids, "upsert")
        targets = [t for t in ("vector", "graph") if t in report.stores and (t != "vector" or vector_ok)]
        result = Deliverer(self.records, self.vectors, self.graph, self.embedder).deliver(
            memory_ids=ids, targets=targets, wait_held_s=HELD_WAIT_S
        )
        report.delivery.merge(result)
        for target, why in result.failed.items():
            report.errors.append(f"{target}: {why}")
        still = self.state.pending_targets(ids)
        for target in targets:
            report.stores[target].repaired += sum(1 for i in fix[target] if target not in still.get(i, set()))

    def _purge(self, ids: list[uuid.UUID], report: ReconcileReport, *, repair: bool) -> None:
        report.purge_due += len(ids)
        report.purge_samples.extend(str(i) for i in ids[: max(0, SAMPLES - len(report.purge_samples))])
        if not repair:
            return
        done = self.records.purge(ids)
        report.purged += len(done)
        targets = [t for t in ("vector", "graph") if t in report.stores]
        if done and targets:
            deliverer = Deliverer(self.records, self.vectors, self.graph, self.embedder)
            report.delivery.merge(deliverer.deliver(memory_ids=done, targets=targets))


def _classify(slot: str, pg: dict[str, Any] | None, row: VectorRecord | GraphRecord | None) -> str | None:
    if pg is None:
        return "orphan" if row is not None else None
    deleted = pg["deleted_at"] is not None
    if row is None:
        return None if deleted else "missing"
    if row.deleted != deleted or row.agent_id != pg["agent_id"]:
        return "stale"
    if slot == "vector" and not deleted and isinstance(row, VectorRecord) and row.content_hash != pg["content_hash"]:
        return "stale"
    return None


# ---------------------------------------------------------------------------------------------
def reconcile(
    stack: MaintenanceStack,
    *,
    agent_id: str | None = None,
    repair: bool = False,
    progress: Callable[[int], None] | None = None,
    page: int = 2000,
    stores: Sequence[str] = ("vector", "graph"),
) -> ReconcileReport:
    """Reconcile the stack's stores (``stores``: which of "vector" and "graph"), recording the run in
    ``maintenance_runs``."""
    vectors = stack.vectors() if "vector" in stores else None
    graph = stack.graph() if "graph" in stores else None
    wanted = {stack.store_names[s] for s in stores}
    skipped = {name: why for name, why in stack.unavailable.items() if name != names.POSTGRES and name in wanted}
    embedder = stack.embedder if vectors is not None else None
    with recorded_run(stack.runs, "reconcile") as rec:
        rec.details = {"agent_id": agent_id, "repair": repair, "stores": list(stores)}
        report = Reconciler(
            stack.records,
            vectors,
            graph,
            embedder,
            delete_grace=parse_duration(stack.settings.delete_grace),
            page=page,
        ).run(agent_id=agent_id, repair=repair, progress=progress, skipped=skipped)
        rec.counts = report.counts()
        rec.details.update(
            model=report.model,
            skipped=report.skipped,
            errors=report.errors,
            seconds=round(report.seconds, 3),
            samples={k: v.samples for k, v in report.stores.items()},
        )
        if report.skipped or report.errors or (repair and report.unrepaired):
            rec.status = "partial"
    return report
