"""Nightly LoRA fine-tuning for memoryctl: datasets, training, gates, adapter registry, vLLM hot-loading.

Importing this package needs no torch: the registry, the dataset builders, the gates and the
adapter serving are plain Python (+ numpy; vLLM's HTTP client is ``memoryctl.vllm``). Training and
the embedding/generation loaders import torch, transformers and peft lazily and raise
``memoryctl.errors.ConfigError`` with the hint ``pip install 'memoryctl[lora]'`` when the extra is
missing.

Entry points for ``memoryctl nightly`` (see each module's docstring):

* :mod:`lora.config` — ``LoraTrainingConfig``
* :mod:`lora.datasets` — ``build_embedding_dataset`` / ``build_generation_dataset`` → dataset or ``Skipped``
* :mod:`lora.train_embedding` — ``train_embedding_adapter``, ``load_embedding_model``
* :mod:`lora.train_generation` — ``train_generation_adapter``, ``load_generation_model``, ``build_tiny_qwen2``
* :mod:`lora.evaluate` — ``embedding_gate``, ``generation_gate`` → ``Decision``
* :mod:`lora.registry` — ``AdapterRegistry`` (register/list/get/latest/active/previous/rollback)
* :mod:`lora.serving` — ``AdapterServing`` over ``memoryctl.vllm.VLLMClient`` (hot_swap, rollback)
"""

from __future__ import annotations

from ._deps import LORA_EXTRA_HINT, require_torch, torch_available
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
    "LORA_EXTRA_HINT",
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
