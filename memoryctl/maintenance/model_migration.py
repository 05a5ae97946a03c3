"""``memoryctl migrate``: move every memory to a new embedding model without downtime.

Phases, each safe to interrupt (``kill -9`` included) and resumed by running the command again:

1. **prepare**: build the target embedder (``--to-model`` spec, see ``maintenance.models``), create its
   versioned collection *without* activating it, open (or resume) the checkpoint row in
   ``embedding_migrations``. A PostgreSQL advisory lock keeps a second ``migrate`` out.
2. **copy**: keyset pages of live memories in id order, embedded with the target model and upserted
   into the target collection by name; after each batch the last id is checkpointed in PostgreSQL,
   so a restart continues after it (re-doing at most one batch, which is idempotent).
3. **catch-up**: memories written since the copy started (``updated_at >= copy_since - margin``;
   ``updated_at`` is the store's write time, so inserts, edits, metadata changes and soft deletes
   all count) are re-embedded / removed; then a merge-join of PostgreSQL against the target
   collection (ids, content hashes) re-embeds anything still missing or different and deletes
   what PostgreSQL no longer has. The merge-join is the verification proper, and it also catches
   what no timestamp can: purges (no row left to carry one).
4. **verify**: the target's point count must equal PostgreSQL's live count (retried through
   catch-up while writes keep arriving); recall of a sample of queries is measured on the new
   collection and on the old one and reported (``--min-recall`` can make it a gate).
5. **swap**: the model registry (``model_versions``) records the target as active with its spec
   and retires the source, then the alias is swapped atomically (``VectorStore.activate``). From now
   on new processes embed with the target model (``maintenance.models``); a long-running process still on
   the old model has its deliveries refused (they stay in the outbox) and its queries refused by the
   store's model check, never mixed.
6. **post-swap catch-up**: writes delivered to the old collection between verification and the
   swap are copied over by the timestamp catch-up, so nothing written during the migration is
   lost. No second merge-join: it would cost a full scan of both stores (~45 us per memory, a
   quarter of the pipeline at 500k, benchmarks/ops.py) for one case only, a purge in the seconds
   between verification and swap, which leaves an orphan point that queries never return (hits are
   hydrated from PostgreSQL) and ``reconcile --repair`` removes.

Queries keep working throughout: until the swap they use the old (active) collection, after it the
new one. ``--rollback`` is the same catch-up into the previous model's collection followed by the
swap back; ``--cleanup`` drops retired collections once their grace period has passed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from memoryctl.config import EmbedderSettings
from memoryctl.errors import MemoryctlError, StoreError, UsageError
from memoryctl.maintenance.models import settings_from_spec, spec_of
from memoryctl.maintenance.needs import MaintenanceStack
from memoryctl.maintenance.pgstate import OpsState
from memoryctl.maintenance.reembed import PipelineStats, Reembedder
from memoryctl.maintenance.runs import recorded_run
from memoryctl.maintenance.streams import paged_join, record_key, row_key
from memoryctl.model import Memory
from memoryctl.stores import names
from memoryctl.stores.protocols import EmbeddingModelInfo, VectorFilter, VectorStore
from memoryctl.stores.schema import apply_schema

if TYPE_CHECKING:
    from memoryctl.embed import Embedder

LOCK = "migrate"
CATCHUP_MARGIN = timedelta(seconds=60)
VERIFY_ROUNDS = 3

Progress = Callable[[str, int, int | None], None]  # (phase, advance, total-or-None at phase start)


class MigrationInterrupted(MemoryctlError):
    """Raised by ``stop_after_batches`` (tests): the process 'dies' with the checkpoint written."""


@dataclass(slots=True)
class MigrationReport:
    action: str
    source_model: str | None = None
    target_model: str | None = None
    status: str = "started"
    resumed_from: int = 0
    copied: int = 0
    caught_up: int = 0
    removed: int = 0
    verify: dict[str, Any] = field(default_factory=dict)
    swapped: bool = False
    dropped: list[str] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)
    config_hint: str | None = None
    pipeline: PipelineStats = field(default_factory=PipelineStats)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase (copy, catch-up, ...)
    seconds: float = 0.0
    adapter_registry: dict[str, Any] | None = None  # --rollback: what the adapter registry now says

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(
            pipeline=self.pipeline.as_dict(),
            phases={k: round(v, 3) for k, v in self.phases.items()},
            seconds=round(self.seconds, 3),
        )
        if self.adapter_registry is None:
            del out["adapter_registry"]
        return out


def _noop(phase: str, advance: int, total: int | None) -> None:
    return None


class Migrator:
    def __init__(
        self,
        stack: MaintenanceStack,
        *,
        batch: int = 512,
        sample: int = 50,
        k: int = 10,
        min_recall: float | None = None,
        stop_after_batches: int | None = None,
        progress: Progress | None = None,
    ) -> None:
        if batch < 1:
            raise UsageError("--batch must be >= 1")
        self.stack = stack
        self.state = OpsState(stack.pool)
        self.batch = batch
        self.sample = sample
        self.k = k
        self.min_recall = min_recall
        self.stop_after_batches = stop_after_batches
        self.progress = progress or _noop

    # ---------------------------------------------------------------------------------- migrate
    def migrate(self, target_settings: EmbedderSettings) -> MigrationReport:
        from memoryctl.embed import make_embedder

        started = time.perf_counter()
        report = MigrationReport(action="migrate")
        apply_schema(self.stack.pool)  # the checkpoint table arrived with schema 0003
        vectors = self.stack.require_vectors()
        target_embedder = make_embedder(target_settings)
        target = target_embedder.info
        source = vectors.active_model()
        report.source_model = source.model_id if source else None
        report.target_model = target.model_id
        with self.state.exclusive(LOCK) as got:
            if not got:
                raise UsageError(
                    "another `memoryctl migrate` is running", hint="wait for it; `memoryctl runs` shows it"
                )
            mig = self.state.open_migration(target.model_id)
            if source is not None and source.model_id == target.model_id and mig is None:
                report.status = "already-active"
                report.config_hint = self._config_hint(target_settings)
                report.seconds = time.perf_counter() - started
                return report
            other = self.state.any_open_migration()
            if mig is None and other is not None:
                raise UsageError(
                    f"a migration to {other['target_model']!r} is unfinished",
                    hint="run that migration again to finish it, or `memoryctl migrate --abandon` to drop it",
                )
            self._register_source(source)
            if mig is None:
                mig = self.state.start_migration(report.source_model, target.model_id, spec_of(target_settings))
            else:
                report.resumed_from = int(mig["copied"])
            vectors.ensure_collection(target, activate_if_none=False)
            pipe = Reembedder(vectors, target_embedder, target.model_id, remove_deleted=True)

            if mig["status"] == "copying":
                with report.phase("copy"):
                    self._copy(mig, pipe, report)
                self.state.set_migration(int(mig["id"]), "verifying")
            since = mig["copy_since"] - CATCHUP_MARGIN
            next_since = self.state.safe_watermark() - CATCHUP_MARGIN
            with report.phase("catch-up"):
                self._catch_up(vectors, pipe, target.model_id, since, report)
            with report.phase("verify"):
                report.verify = self._verify(vectors, pipe, target, target_embedder, source, report)
            report.pipeline = pipe.stats
            if not report.verify["counts_equal"] or not report.verify.get("recall_ok", True):
                report.status = "verify-failed"
                self.state.set_migration(int(mig["id"]), "verifying", details={"verify": report.verify})
                report.seconds = time.perf_counter() - started
                return report
            # Swap: registry first (new processes follow it), then the alias.
            self.state.register_embedding(target.model_id, target.dim, spec_of(target_settings))
            self.state.activate_embedding(target.model_id)
            vectors.activate(target.model_id)
            report.swapped = True
            with report.phase("post-swap catch-up"):
                self._catch_up(vectors, pipe, target.model_id, next_since, report, merge_join=False)
            self.state.set_migration(
                int(mig["id"]), "swapped", details={"verify": report.verify, "pipeline": pipe.stats.as_dict()}
            )
            report.status = "swapped"
            report.pipeline = pipe.stats
            report.config_hint = self._config_hint(target_settings)
        report.seconds = time.perf_counter() - started
        return report

    def _register_source(self, source: EmbeddingModelInfo | None) -> None:
        """Record the model being replaced, with its spec when the running embedder is that model."""
        if source is None:
            return
        spec = None
        if self.stack.embedder.info.model_id == source.model_id:
            from memoryctl.maintenance.models import effective_embedder_settings

            spec = spec_of(effective_embedder_settings(self.stack.pool, self.stack.settings.embedder))
        self.state.register_embedding(source.model_id, source.dim, spec)
        if self.state.active_embedding() is None:
            self.state.activate_embedding(source.model_id)

    def _copy(self, mig: dict[str, Any], pipe: Reembedder, report: MigrationReport) -> None:
        mig_id = int(mig["id"])
        copied = int(mig["copied"])
        start_after: uuid.UUID | None = mig["last_id"]
        self.progress("copy", copied, self.state.count_live())
        batches = 0

        def pages() -> Iterator[list[Memory]]:
            last = start_after
            while True:
                page = self.state.live_after(last, self.batch)
                if not page:
                    return
                yield page
                last = page[-1].id

        def checkpoint(page: list[Memory]) -> None:
            nonlocal copied, batches
            copied += len(page)
            batches += 1
            self.state.checkpoint(mig_id, page[-1].id, copied)
            report.copied += len(page)
            self.progress("copy", len(page), None)
            if self.stop_after_batches is not None and batches >= self.stop_after_batches:
                raise MigrationInterrupted(f"stopped after {batches} batches (checkpoint at {copied})")

        pipe.run(pages(), after_batch=checkpoint)

    def _catch_up(
        self,
        vectors: VectorStore,
        pipe: Reembedder,
        model_id: str,
        since: datetime,
        report: MigrationReport,
        *,
        merge_join: bool = True,
    ) -> None:
        """Re-embed rows written since ``since``, then (``merge_join``) compare PostgreSQL against
        the whole collection."""
        self.progress("catch-up", 0, None)
        before = pipe.stats.embedded + pipe.stats.removed
        pipe.run(self.state.changed_since(since, batch=self.batch))
        report.caught_up += pipe.stats.embedded + pipe.stats.removed - before
        if merge_join:
            self._diff_pass(vectors, pipe, model_id, report)

    def _diff_pass(self, vectors: VectorStore, pipe: Reembedder, model_id: str, report: MigrationReport) -> None:
        records = self.stack.records
        redo: list[uuid.UUID] = []
        drop: list[uuid.UUID] = []

        def flush() -> None:
            if redo:
                rows = records.get_many(redo)
                pipe.apply([rows[i] for i in redo if i in rows])
                report.caught_up += len(rows)
                gone = [i for i in redo if i not in rows]
                if gone:
                    vectors.delete(gone, model_id=model_id)
            if drop:
                vectors.delete(drop, model_id=model_id)
                report.removed += len(drop)
            redo.clear()
            drop.clear()

        pages = records.scroll(batch=2000)
        others = [(vectors.scroll(model_id=model_id, batch=2000), record_key, vectors.name)]
        for chunk in paged_join(pages, row_key, others):
            matched = chunk.matched[0]
            drop.extend(point.id for point in chunk.unmatched[0])
            for pg in chunk.rows:
                point = matched.get(pg["id"])
                if pg["deleted_at"] is not None:
                    if point is not None:
                        drop.append(pg["id"])
                elif (
                    point is None
                    or point.deleted
                    or point.content_hash != pg["content_hash"]
                    or point.agent_id != pg["agent_id"]
                ):
                    redo.append(pg["id"])
            if len(redo) + len(drop) >= self.batch:
                flush()
        flush()

    def _verify(
        self,
        vectors: VectorStore,
        pipe: Reembedder,
        target: EmbeddingModelInfo,
        target_embedder: Embedder,
        source: EmbeddingModelInfo | None,
        report: MigrationReport,
    ) -> dict[str, Any]:
        self.progress("verify", 0, None)
        out: dict[str, Any] = {}
        for attempt in range(1, VERIFY_ROUNDS + 1):
            live = self.state.count_live()
            points = vectors.count(model_id=target.model_id)
            out.update(postgres_live=live, new_points=points, counts_equal=live == points, rounds=attempt)
            if live == points:
                break
            self._diff_pass(vectors, pipe, target.model_id, report)  # writes kept arriving: once more
        out.update(self._recall(vectors, target, target_embedder, source))
        if self.min_recall is not None and out.get("recall_new") is not None:
            out["recall_ok"] = out["recall_new"] >= self.min_recall
        return out

    def _recall(
        self,
        vectors: VectorStore,
        target: EmbeddingModelInfo,
        target_embedder: Embedder,
        source: EmbeddingModelInfo | None,
    ) -> dict[str, Any]:
        """Self-recall@k on both collections and the overlap of their top-k, on a sample of texts.

        Each sampled memory's own text is the query; finding the memory itself in the top k is a
        model-independent sanity check (a broken re-embed scores near 0), and the overlap with the
        old collection's answers says how much the result lists will change for users.
        """
        sample = self.state.sample_live(self.sample)
        if not sample:
            return {"sample": 0, "k": self.k}
        old_embedder = self.stack.embedder if source is not None else None
        if old_embedder is not None and source is not None and old_embedder.info.model_id != source.model_id:
            old_embedder = None
        hit_new = hit_old = 0
        overlap = 0.0
        for m in sample:
            flt = VectorFilter(agent_id=m.agent_id)
            qv = target_embedder.embed_query(m.text).tolist()
            new = [h.id for h in vectors.search(qv, flt, self.k, model_id=target.model_id, inactive_ok=True)]
            hit_new += m.id in new
            if old_embedder is not None and source is not None:
                ov = old_embedder.embed_query(m.text).tolist()
                old = [h.id for h in vectors.search(ov, flt, self.k, model_id=source.model_id, inactive_ok=True)]
                hit_old += m.id in old
                overlap += len(set(old) & set(new)) / max(1, min(self.k, len(old)))
        n = len(sample)
        out: dict[str, Any] = {"sample": n, "k": self.k, "recall_new": round(hit_new / n, 4)}
        if old_embedder is not None:
            out.update(recall_old=round(hit_old / n, 4), overlap_at_k=round(overlap / n, 4))
        return out

    @staticmethod
    def _config_hint(target_settings: EmbedderSettings) -> str:
        spec = spec_of(target_settings)
        lines = ", ".join(f"{k} = {v!r}" for k, v in spec.items())
        return (
            "the active embedder is recorded in PostgreSQL (model_versions) and every memoryctl process started "
            f"from now on uses it; to keep the config file in step set [embedder] {lines}"
        )

    # ---------------------------------------------------------------------------------- rollback
    def rollback(self) -> MigrationReport:
        """Swap back to the most recently retired model, after catching its collection up."""
        from memoryctl.embed import make_embedder

        started = time.perf_counter()
        report = MigrationReport(action="rollback")
        apply_schema(self.stack.pool)
        vectors = self.stack.require_vectors()
        current = vectors.active_model()
        report.source_model = current.model_id if current else None
        prev = rollback_candidate(self.state, vectors)
        if prev is None:
            raise UsageError(
                "nothing to roll back to: no retired embedding model with a collection",
                hint="`memoryctl migrate --to-model ...` to move to a specific model",
            )
        spec = prev["manifest"].get("embedder")
        if not spec:
            raise UsageError(
                f"no recorded embedder spec for {prev['model_id']!r}",
                hint="migrate to it explicitly with `memoryctl migrate --to-model ...` (its collection is reused)",
            )
        settings = settings_from_spec(spec, self.stack.settings.embedder)
        embedder = make_embedder(settings)
        if embedder.info.model_id != prev["model_id"]:
            raise StoreError(
                names.QDRANT,
                f"the recorded spec of {prev['model_id']!r} now builds {embedder.info.model_id!r}",
                hint="the model package changed version; migrate explicitly instead of rolling back",
            )
        report.target_model = prev["model_id"]
        retired_at = prev["manifest"].get("retired_at")
        since = (
            datetime.fromisoformat(retired_at) - CATCHUP_MARGIN
            if retired_at
            else self.state.now() - timedelta(days=3650)
        )
        with self.state.exclusive(LOCK) as got:
            if not got:
                raise UsageError("a `memoryctl migrate` is running", hint="wait for it; `memoryctl runs` shows it")
            pipe = Reembedder(vectors, embedder, prev["model_id"], remove_deleted=True)
            next_since = self.state.safe_watermark() - CATCHUP_MARGIN
            self._catch_up(vectors, pipe, prev["model_id"], since, report)
            self.state.activate_embedding(prev["model_id"])
            vectors.activate(prev["model_id"])
            report.swapped = True
            self._catch_up(vectors, pipe, prev["model_id"], next_since, report, merge_join=False)
            last = self.state.last_migration()
            if last is not None and last["status"] == "swapped" and last["target_model"] == report.source_model:
                self.state.set_migration(int(last["id"]), "rolled_back")
            report.pipeline = pipe.stats
            report.status = "rolled-back"
            report.config_hint = self._config_hint(settings)
        report.seconds = time.perf_counter() - started
        return report

    # ---------------------------------------------------------------------------------- cleanup
    def cleanup(self, grace: timedelta) -> MigrationReport:
        """Drop collections of models retired longer than ``grace`` ago; never the active one."""
        started = time.perf_counter()
        report = MigrationReport(action="cleanup")
        apply_schema(self.stack.pool)
        vectors = self.stack.require_vectors()
        registry = {r["model_id"]: r for r in self.state.embedding_models()}
        cutoff = self.state.now() - grace
        open_mig = self.state.any_open_migration()
        for c in vectors.collections():
            mid = c.model.model_id
            row = registry.get(mid)
            retired_at = row["manifest"].get("retired_at") if row else None
            if c.active:
                continue
            if open_mig is not None and open_mig["target_model"] == mid:
                report.kept.append({"model": mid, "why": "target of an unfinished migration"})
            elif row is None or row["status"] != "retired" or not retired_at:
                report.kept.append({"model": mid, "why": "not a retired model (unknown to the registry)"})
            elif datetime.fromisoformat(retired_at) > cutoff:
                report.kept.append({"model": mid, "why": f"retired at {retired_at}, inside the grace period"})
            else:
                vectors.drop_collection(mid)
                report.dropped.append(mid)
        report.status = "cleaned"
        report.seconds = time.perf_counter() - started
        return report

    def abandon(self) -> MigrationReport:
        """Give up an unfinished migration: its row is closed; its collection is dropped if inactive."""
        report = MigrationReport(action="abandon")
        apply_schema(self.stack.pool)
        mig = self.state.any_open_migration()
        if mig is None:
            report.status = "nothing-open"
            return report
        report.target_model = mig["target_model"]
        vectors = self.stack.require_vectors()
        active = vectors.active_model()
        if active is None or active.model_id != mig["target_model"]:
            vectors.drop_collection(mig["target_model"])
            report.dropped.append(mig["target_model"])
        self.state.set_migration(int(mig["id"]), "abandoned")
        report.status = "abandoned"
        return report


def rollback_candidate(state: OpsState, vectors: VectorStore) -> dict[str, Any] | None:
    """The ``model_versions`` row ``--rollback`` goes back to: the most recently retired embedding
    model whose collection still exists (not the active one); None when there is none. The
    nightly's clean-up of merged model versions keeps this one's files."""
    current = vectors.active_model()
    existing = {c.model.model_id for c in vectors.collections()}
    retired = [
        r
        for r in state.embedding_models()
        if r["status"] == "retired"
        and r["model_id"] in existing
        and r["model_id"] != (current.model_id if current else None)
    ]
    return max(retired, key=lambda r: str(r["manifest"].get("retired_at", ""))) if retired else None


def run_model_migration(stack: MaintenanceStack, action: str, **kwargs: Any) -> MigrationReport:
    """Run one migrate action (migrate | rollback | cleanup | abandon), recorded in maintenance_runs."""
    target: EmbedderSettings | None = kwargs.pop("target", None)
    grace: timedelta | None = kwargs.pop("grace", None)
    migrator = Migrator(stack, **kwargs)
    with recorded_run(stack.runs, "migrate") as rec:
        rec.details = {"action": action, "target": spec_of(target) if target else None}
        if action == "migrate":
            assert target is not None
            report = migrator.migrate(target)
        elif action == "rollback":
            report = migrator.rollback()
            # The adapter registry (where the nightly trains) follows the model now aliased, so it,
            # `adapters embedding` and the next night's gate baseline agree with the vectors.
            from memoryctl.maintenance.adapters import follow_active_embedding

            report.adapter_registry = follow_active_embedding(stack, reason="migrate --rollback")
        elif action == "cleanup":
            report = migrator.cleanup(timedelta(days=7) if grace is None else grace)  # 0 is a grace too
        elif action == "abandon":
            report = migrator.abandon()
        else:  # pragma: no cover - the CLI only passes the four above
            raise UsageError(f"unknown migrate action {action!r}")
        rec.counts = {
            "copied": report.copied,
            "caught_up": report.caught_up,
            "removed": report.removed,
            "dropped": len(report.dropped),
        }
        rec.details.update(report.as_dict())
        if report.status == "verify-failed":
            rec.status = "partial"
    return report
