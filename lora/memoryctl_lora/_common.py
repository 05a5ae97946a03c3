"""Shared training plumbing: seeding, determinism, result type, the manifest fields both kinds write."""

from __future__ import annotations

import platform
import random
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._deps import require_torch
from .config import LoraTrainingConfig
from .manifest import DataWindow


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


def base_manifest(
    *,
    kind: str,
    config: LoraTrainingConfig,
    base_model_id: str,
    base_model_path: Path,
    window: DataWindow | None,
    counts: dict[str, int],
) -> dict[str, Any]:
    torch = require_torch()
    import peft
    import transformers

    return {
        "kind": kind,
        "base_model_id": base_model_id,
        "base_model_path": str(base_model_path),
        "data_window": window.to_json() if window else None,
        "examples": counts,
        "config": config.model_dump(mode="json"),
        "software": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
        },
    }


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
    from ._deps import require

    with quiet_peft():
        return require("peft").get_peft_model(model, lora_config)


def load_peft_adapter(model: Any, adapter_dir: Path) -> Any:
    """Apply a saved adapter to ``model`` for inference."""
    from ._deps import require

    with quiet_peft():
        return require("peft").PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False)
