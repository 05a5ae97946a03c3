"""Shared training plumbing: seeding, determinism, the LoRA training loop, result type, the manifest
fields both kinds write."""

from __future__ import annotations

import platform
import random
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ._deps import require, require_torch
from .config import LoraTrainingConfig
from .datasets import EmbeddingDataset, GenerationDataset
from .manifest import write_manifest


@dataclass(frozen=True)
class TrainResult:
    """A trained adapter directory (adapter files + manifest.json) and what the run measured."""

    adapter_dir: Path
    manifest: dict[str, Any]

    @property
    def metrics(self) -> dict[str, Any]:
        return dict(self.manifest["metrics"])

    @property
    def checksum(self) -> str:
        return str(self.manifest["checksum"]["combined"])


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Limit torch's intra-op threads for a block (see LoraTrainingConfig.torch_threads for why)."""
    torch = require_torch()
    if n is None:
        yield
        return
    prev = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


@contextmanager
def deterministic(seed: int, threads: int | None = None) -> Iterator[None]:
    """Seed every RNG and force deterministic torch kernels for the duration of a run.

    Restores the global flags afterwards so that a long-lived process (tests, a daemon) is not
    left in deterministic mode by one training run. The thread count is part of it: float sums
    reduce in a different order with a different number of threads.
    """
    torch = require_torch()
    prev = torch.are_deterministic_algorithms_enabled()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    try:
        with torch_threads(threads):
            yield
    finally:
        torch.use_deterministic_algorithms(prev)


def write_adapter(
    model: Any,
    adapter_dir: Path,
    dataset: EmbeddingDataset | GenerationDataset,
    metrics: dict[str, Any],
    *,
    kind: str,
    config: LoraTrainingConfig,
    base_model_id: str,
    base_model_path: Path,
    **sections: Any,
) -> TrainResult:
    """Write the adapter directory: the adapter's files, then the manifest that checksums them and
    records what every kind records (base model, data window and counts, config, software versions,
    ``metrics``) plus the kind's own ``sections``."""
    torch = require_torch()
    import peft
    import transformers

    manifest = {
        "kind": kind,
        "base_model_id": base_model_id,
        "base_model_path": str(base_model_path),
        "data_window": dataset.window.to_json() if dataset.window else None,
        "examples": dataset.counts(),
        "config": config.model_dump(mode="json"),
        "software": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
        },
        "metrics": metrics,
        **sections,
    }
    save_adapter(model, adapter_dir)
    return TrainResult(adapter_dir, write_manifest(adapter_dir, manifest))


def trainable_parameters(model: Any) -> dict[str, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return {"trainable": int(trainable), "total": int(total)}


@contextmanager
def quiet_peft() -> Iterator[None]:
    """Hide a FutureWarning that peft 0.21 triggers inside transformers 5 (``is_gradient_checkpointing``
    deprecated) whenever it wraps a model; it is not ours to fix and clutters the nightly log."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def get_peft_model(model: Any, lora_config: Any) -> Any:
    with quiet_peft():
        return require("peft").get_peft_model(model, lora_config)


def load_peft_adapter(model: Any, adapter_dir: Path) -> Any:
    """Apply a saved adapter to ``model`` for inference."""
    with quiet_peft():
        return require("peft").PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False)


_Batch = TypeVar("_Batch")


@dataclass(frozen=True)
class LoraRun:
    """What :func:`train_lora` leaves: the adapter-wrapped model and what its loop measured."""

    model: Any
    parameters: dict[str, int]
    losses: list[float]
    train_seconds: float

    def metrics(self, config: LoraTrainingConfig, *, started: float, loaded: float) -> dict[str, Any]:
        """The loss curve, size and timings every manifest records, whatever the kind measured besides.

        ``started``/``loaded``: ``time.monotonic()`` at the run's start and once the base model was
        loaded; ``total`` runs to now, so call this after the adapter is saved."""
        return {
            "train_loss_first": self.losses[0],
            "train_loss_last": self.losses[-1],
            "steps": config.steps,
            "parameters": self.parameters,
            "seconds": {
                "load": round(loaded - started, 3),
                "train": round(self.train_seconds, 3),
                "total": round(time.monotonic() - started, 3),
            },
        }


def train_lora(
    model: Any,
    config: LoraTrainingConfig,
    batches: Iterator[_Batch],
    batch_loss: Callable[[Any, _Batch], Any],
    **lora_options: Any,
) -> LoraRun:
    """Wrap ``model`` in a fresh LoRA adapter shaped by ``config`` and take ``config.steps`` AdamW
    steps on the adapter's weights alone (the base stays frozen).

    The two kinds train the same way and differ only in what a batch is and how its loss is computed
    (``batch_loss(model, batch)``: contrastive for embeddings, response-token cross-entropy for
    generation); ``lora_options`` are extra ``peft.LoraConfig`` fields (the causal LM's task type).
    Call it inside :func:`deterministic`: the adapter's initial weights come from torch's RNG.
    """
    torch = require_torch()
    lora_config = require("peft").LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules_for()),
        bias="none",
        **lora_options,
    )
    model = get_peft_model(model, lora_config)
    parameters = trainable_parameters(model)
    optim = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=config.lr, weight_decay=config.weight_decay
    )
    losses: list[float] = []
    started = time.monotonic()
    model.train()
    for _ in range(config.steps):
        loss = batch_loss(model, next(batches))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        losses.append(float(loss.detach()))
    return LoraRun(model, parameters, losses, time.monotonic() - started)


def save_adapter(model: Any, adapter_dir: Path) -> None:
    """Save the adapter's files without the model-card README peft writes beside them: it is not part
    of an adapter, and the manifest's checksums cover the adapter files only."""
    model.save_pretrained(str(adapter_dir))
    (adapter_dir / "README.md").unlink(missing_ok=True)
