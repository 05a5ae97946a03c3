"""Nightly LoRA fine-tuning for memoryctl: datasets, training, gates, adapter registry, vLLM hot-loading.

Its own distribution, ``memoryctl-lora`` (the repository's top-level ``lora/`` folder), installed
where the nightly trains — the GPU node — so that torch, peft and transformers are its
dependencies and never the core's: the db node and every client run memoryctl without them.
The two depend one way: this package imports memoryctl, memoryctl never imports it. memoryctl's
nightly and ``memoryctl adapters`` find :class:`memoryctl_lora.night.LoraTraining` through the
``memoryctl.training`` entry point declared in lora/pyproject.toml (``memoryctl.maintenance.training``
looks it up; tests/unit/test_import_graph.py holds the "never").

Importing it needs no torch: the registry, the dataset builders, the gates and the adapter serving
are plain Python (+ numpy; vLLM's HTTP client is ``memoryctl.vllm``). Training and the
embedding/generation loaders import torch, transformers and peft lazily and raise
``memoryctl.errors.ConfigError`` with :data:`LORA_INSTALL_HINT` when they are missing.

Entry points for ``memoryctl nightly`` (see each module's docstring):

* :mod:`memoryctl_lora.config` — ``LoraTrainingConfig``
* :mod:`memoryctl_lora.datasets` — ``build_embedding_dataset`` / ``build_generation_dataset`` → dataset or ``Skipped``
* :mod:`memoryctl_lora.train_embedding` — ``train_embedding_adapter``, ``load_embedding_model``
* :mod:`memoryctl_lora.train_generation` — ``train_generation_adapter``, ``load_generation_model``, ``build_tiny_qwen2``
* :mod:`memoryctl_lora.evaluate` — ``embedding_gate``, ``generation_gate`` → ``Decision``
* :mod:`memoryctl_lora.registry` — ``AdapterRegistry`` (register/list/get/latest/active/previous/rollback)
* :mod:`memoryctl_lora.serving` — ``AdapterServing`` over ``memoryctl.vllm.VLLMClient`` (hot_swap, rollback)
* :mod:`memoryctl_lora.night` — the nightly's training steps and ``memoryctl adapters``' registry work
  over memoryctl's stack (``LoraTraining``, the entry point)
"""

from __future__ import annotations

from ._deps import LORA_INSTALL_HINT, require_torch, torch_available
from .config import LoraTrainingConfig
from .datasets import (
    EmbeddingDataset,
    EmbeddingPair,
    GenerationDataset,
    GenerationExample,
    Skipped,
    build_embedding_dataset,
    build_generation_dataset,
)
from .evaluate import Decision, embedding_gate, generation_gate
from .manifest import AdapterIntegrityError, DataWindow
from .registry import AdapterRegistry, AdapterVersion

__all__ = [
    "LORA_INSTALL_HINT",
    "AdapterIntegrityError",
    "AdapterRegistry",
    "AdapterVersion",
    "DataWindow",
    "Decision",
    "EmbeddingDataset",
    "EmbeddingPair",
    "GenerationDataset",
    "GenerationExample",
    "LoraTrainingConfig",
    "Skipped",
    "build_embedding_dataset",
    "build_generation_dataset",
    "embedding_gate",
    "generation_gate",
    "require_torch",
    "torch_available",
]
