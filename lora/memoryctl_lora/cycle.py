"""One nightly cycle per adapter kind: build data → train → gate → register → promote/rollback.

This is the glue ``memoryctl nightly`` calls; it owns no scheduling, locking or database writes.
The lead's command takes the lock, reads rows from PostgreSQL, calls :func:`embedding_cycle` /
:func:`generation_cycle`, mirrors the returned :class:`CycleOutcome` into ``model_versions`` and
the run record, and then promotes:

* embedding: re-embed into a new collection named from ``outcome.version.model_id`` (``migrate``),
  swap the alias, then :meth:`AdapterRegistry.set_active`;
* generation: :func:`promote_generation` (vLLM hot swap, then ``set_active``).

Failure semantics: a candidate that fails the gate is **not** registered (its directory stays in
the work dir for inspection, and the metrics go into the outcome). Registering does not change
what is served; only ``set_active`` after a successful promotion does. So any failure before that
point leaves the serving state as it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .config import LoraTrainingConfig
from .datasets import Skipped, build_embedding_dataset, build_generation_dataset
from .evaluate import Decision, embedding_gate, generation_gate
from .manifest import DataWindow
from .registry import AdapterRegistry, AdapterVersion
from .serving import AdapterRef, AdapterServing, SwapResult

Status = Literal["skipped", "rejected", "registered"]


@dataclass
class CycleOutcome:
    """What happened, for the run record. ``version`` is set only when status == "registered"."""

    kind: str
    status: Status
    reason: str
    counts: dict[str, int] = field(default_factory=dict)
    decision: Decision | None = None
    version: AdapterVersion | None = None
    candidate_dir: Path | None = None
    train_metrics: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    gpu_pause: dict[str, Any] | None = None  # what ``around_training`` recorded (units stopped, restarted)

    def to_record(self) -> dict[str, Any]:
        return {
            **({"gpu_pause": self.gpu_pause} if self.gpu_pause is not None else {}),
            "kind": self.kind,
            "status": self.status,
            "reason": self.reason,
            "counts": self.counts,
            "promote": self.decision.promote if self.decision else None,
            "gate_metrics": self.decision.metrics if self.decision else {},
            "train_metrics": self.train_metrics,
            "version": self.version.version if self.version else None,
            "model_id": self.version.model_id if self.version else None,
            "seconds": round(self.seconds, 3),
        }


def _split_kw(config: LoraTrainingConfig) -> dict[str, Any]:
    return {
        "min_examples": config.min_examples,
        "min_heldout": config.min_heldout,
        "heldout_fraction": config.heldout_fraction,
    }


def embedding_cycle(
    rows: Iterable[Mapping[str, Any]],
    *,
    registry: AdapterRegistry,
    workdir: Path | str,
    config: LoraTrainingConfig | None = None,
    window: DataWindow | None = None,
    around_training: Callable[[], AbstractContextManager[dict[str, Any]]] | None = None,
) -> CycleOutcome:
    """Train an embedding adapter and gate it against the active one (or the base model).

    ``around_training``: as for :func:`generation_cycle`, around the training and the gate (both
    hold the model on the GPU)."""
    from .train_embedding import load_embedding_model, train_embedding_adapter

    t0 = time.monotonic()
    config = config or LoraTrainingConfig.for_embedding()
    ds = build_embedding_dataset(rows, window=window, **_split_kw(config))
    if isinstance(ds, Skipped):
        return CycleOutcome("embedding", "skipped", ds.reason, ds.counts, seconds=time.monotonic() - t0)
    active = registry.active("embedding")
    # Both on the weights the adapter was trained on (the served model's, when it is not MiniLM).
    base, threads = config.base_model_path, config.torch_threads
    with (around_training or _no_pause)() as paused:
        result = train_embedding_adapter(ds, Path(workdir) / "embedding-candidate", config)
        candidate_model = load_embedding_model(result.adapter_dir, base_model_dir=base, threads=threads)
        active_model = load_embedding_model(active.path if active else None, base_model_dir=base, threads=threads)
        decision = embedding_gate(
            candidate_model,
            active_model,
            ds.heldout,
            k=config.recall_k,
            min_improvement=config.min_recall_improvement,
            min_heldout=config.min_heldout,
        )
        del candidate_model, active_model  # off the GPU before the paused units start again
    outcome = _finish("embedding", registry, result.adapter_dir, result.metrics, ds.counts(), decision, t0)
    outcome.gpu_pause = paused if around_training else None
    return outcome


def generation_cycle(
    rows: Iterable[Mapping[str, Any]],
    *,
    registry: AdapterRegistry,
    workdir: Path | str,
    config: LoraTrainingConfig,
    window: DataWindow | None = None,
    around_training: Callable[[], AbstractContextManager[dict[str, Any]]] | None = None,
) -> CycleOutcome:
    """Train a generation adapter and gate it on held-out loss against the active adapter.

    ``around_training``: a context entered only when there is something to train, for the training
    alone (the nightly frees the GPU with it: ``memoryctl.maintenance.gpu_pause``); what it yields is kept
    in the outcome's ``gpu_pause``."""
    from .train_generation import train_generation_adapter

    t0 = time.monotonic()
    ds = build_generation_dataset(rows, window=window, **_split_kw(config))
    if isinstance(ds, Skipped):
        return CycleOutcome("generation", "skipped", ds.reason, ds.counts, seconds=time.monotonic() - t0)
    active = registry.active("generation")
    with (around_training or _no_pause)() as paused:
        result = train_generation_adapter(
            ds, Path(workdir) / "generation-candidate", config, active_adapter_dir=active.path if active else None
        )
    m = result.metrics
    decision = generation_gate(
        m["heldout_loss_after"], m["heldout_loss_active"], min_improvement=config.min_loss_improvement
    )
    outcome = _finish("generation", registry, result.adapter_dir, m, ds.counts(), decision, t0)
    outcome.gpu_pause = paused if around_training else None
    return outcome


def _no_pause() -> AbstractContextManager[dict[str, Any]]:
    return nullcontext({})


def _finish(
    kind: Any,
    registry: AdapterRegistry,
    adapter_dir: Path,
    metrics: dict[str, Any],
    counts: dict[str, int],
    decision: Decision,
    t0: float,
) -> CycleOutcome:
    if not decision.promote:
        return CycleOutcome(
            kind, "rejected", decision.reason, counts, decision, None, adapter_dir, metrics, time.monotonic() - t0
        )
    version = registry.register(kind, adapter_dir)
    return CycleOutcome(
        kind, "registered", decision.reason, counts, decision, version, adapter_dir, metrics, time.monotonic() - t0
    )


def promote_generation(
    registry: AdapterRegistry,
    version: AdapterVersion,
    serving: AdapterServing,
    *,
    path_on_server: Callable[[AdapterVersion], str] = lambda v: str(v.path),
) -> SwapResult:
    """Hot-load ``version`` into vLLM, unload the previously active adapter, then mark it active.

    ``path_on_server`` maps a registry path to the path vLLM sees (the registry directory is synced
    to, or mounted on, the GPU node). If the swap raises, the registry's active version is unchanged.
    """
    previous = registry.active("generation")
    swap = serving.hot_swap(
        AdapterRef(version.served_name, path_on_server(version)), previous.served_name if previous else None
    )
    registry.set_active("generation", version.version)
    return swap


def serve_active_generation(
    registry: AdapterRegistry,
    serving: AdapterServing,
    *,
    path_on_server: Callable[[AdapterVersion], str] = lambda v: str(v.path),
) -> dict[str, Any]:
    """Load the registry's active generation adapter when vLLM does not list it: a restarted vLLM
    has forgotten every adapter loaded at run time. ``{"active": name or None, "loaded": bool}``."""
    active = registry.active("generation")
    if active is None:
        return {"active": None, "loaded": False}
    ref = AdapterRef(active.served_name, path_on_server(active))
    if serving.client.models().has_adapter(ref.name, ref.path):
        return {"active": ref.name, "loaded": False}
    serving.hot_swap(ref)
    return {"active": ref.name, "loaded": True}


def rollback_generation(
    registry: AdapterRegistry,
    serving: AdapterServing,
    *,
    path_on_server: Callable[[AdapterVersion], str] = lambda v: str(v.path),
) -> AdapterVersion | None:
    """Serve the previously active adapter again (or the bare base model); returns it."""
    current = registry.active("generation")
    if current is None:
        return None
    previous = registry.previous("generation")
    serving.rollback(
        current.served_name, AdapterRef(previous.served_name, path_on_server(previous)) if previous else None
    )
    return registry.rollback("generation")
