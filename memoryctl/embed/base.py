"""The embedder contract every implementation meets, and the checks that enforce it.

Why a protocol of our own instead of a library's: the vector store keys its collections by
``EmbeddingModelInfo.model_id`` and must never mix two models in one collection, so every embedder
has to name itself stably and produce vectors of exactly ``dim`` floats, L2-normalised (the stores
use cosine distance and the query engine compares scores across batches). ``finish_vectors`` is
the one place that checks this, whatever the backend returned: a wrong shape or a NaN becomes a
``StoreError`` here instead of a corrupted collection later.
"""

from __future__ import annotations

import importlib
import unicodedata
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy as np
import numpy.typing as npt

from memoryctl.embed.cores import map_parts
from memoryctl.errors import StoreError
from memoryctl.stores.protocols import EmbeddingModelInfo

#: Vectors as the embedders return them: float32, one row per text.
FloatArray: TypeAlias = npt.NDArray[np.float32]

STORE = "embedder"  # the ``store`` name in errors and health reports


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit vectors for one fixed model version.

    ``embed_documents`` is for what gets stored, ``embed_query`` for what gets searched: asymmetric
    models (e5) embed the two differently, symmetric ones (MiniLM, BGE-M3) identically.
    """

    @property
    def info(self) -> EmbeddingModelInfo:
        """Model id (names the Qdrant collection) and dimension. May load/probe the model once."""
        ...

    @property
    def batch_size(self) -> int: ...

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        """``(len(texts), dim)`` float32, each row L2-normalised. Empty input gives ``(0, dim)``."""
        ...

    def embed_query(self, text: str) -> FloatArray:
        """``(dim,)`` float32, L2-normalised."""
        ...

    def informative(self, text: str) -> bool:
        """Whether the model sees anything in ``text``: a text of only symbols it has no token
        for (emoji, unknown characters) is embedded as the unknown token alone, the same vector
        for every such text, and would score cosine 1.0 against any other (``has_content``)."""
        ...

    def close(self) -> None:
        """Release connections (http); a no-op for in-process models."""
        ...


class InProcessModel:
    """What every in-process embedder shares: its model id and dimension are known without loading
    the model (they are asked for at start-up, to name collections, and must not cost a load), and
    nothing is released at close (the model is process-wide and reused by the next embedder)."""

    def __init__(self, info: EmbeddingModelInfo, batch_size: int) -> None:
        self._info = info
        self._batch_size = batch_size

    @property
    def info(self) -> EmbeddingModelInfo:
        return self._info

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def load(self) -> None:
        """Load the model now, if it is not loaded yet (seconds, once per process): the query loads
        it before its embedding runs under the query's timeout."""
        return None

    def informative(self, text: str) -> bool:
        return has_content(text)

    def close(self) -> None:
        return None


def has_content(text: str) -> bool:
    """Whether ``text`` holds a letter or a digit (Unicode categories L and N): what an embedder
    whose tokens cannot be inspected is assumed to see. Emoji, punctuation and other symbols alone
    carry no meaning a text model was trained on."""
    return any(unicodedata.category(c)[0] in "LN" for c in text)


def known_tokens(ids: Sequence[int], special: Collection[int]) -> bool:
    """Whether a tokenised text has a token other than the special ones ([CLS], [SEP], [UNK], …)."""
    return any(i not in special for i in ids)


def clean_text(text: str) -> str:
    """Make any Python string safe to hand to a C engine or a JSON body.

    NUL would silently truncate a C string (the rest of the memory would not be embedded) and lone
    surrogates cannot be encoded as UTF-8 at all; both become harmless replacements instead.
    """
    if not isinstance(text, str):
        raise TypeError(f"embedders take str, not {type(text).__name__}")
    if "\x00" in text:
        text = text.replace("\x00", " ")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def chunks(texts: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(texts), size):
        yield texts[start : start + size]


def finish_vectors(raw: object, n: int, dim: int, *, who: str) -> FloatArray:
    """Check shape and finiteness, then L2-normalise rows (idempotent for already-unit vectors).

    Re-normalising costs nothing next to the model and makes the invariant hold even for a backend
    that returns unnormalised vectors (a misconfigured vLLM pooler, say).
    """
    arr = np.asarray(raw, dtype=np.float32)
    if arr.ndim != 2 or arr.shape != (n, dim):
        raise StoreError(
            STORE,
            f"{who} returned vectors of shape {arr.shape}, expected ({n}, {dim})",
            hint="the model behind this embedder changed its dimension; configure embedder.dim or migrate",
        )
    if not np.isfinite(arr).all():
        raise StoreError(STORE, f"{who} returned non-finite values (NaN/inf)")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    if n and float(norms.min()) <= 1e-12:
        raise StoreError(STORE, f"{who} returned an all-zero vector, which cannot be normalised")
    out: FloatArray = np.ascontiguousarray(arr / norms, dtype=np.float32)
    return out


def embed_batched(
    texts: Sequence[str],
    batch_size: int,
    dim: int,
    run: Callable[[list[str]], object],
    *,
    who: str,
) -> FloatArray:
    """Embed ``texts`` ``batch_size`` at a time and stack the checked, normalised results.

    Batching bounds memory and request size (a re-embed of a million rows goes through here) while
    keeping each model call large enough to use every core.
    """
    if isinstance(texts, str):
        raise TypeError("embed_documents takes a sequence of texts, not one str")
    cleaned = [clean_text(t) for t in texts]
    if not cleaned:
        return np.zeros((0, dim), dtype=np.float32)
    parts = [finish_vectors(run(list(batch)), len(batch), dim, who=who) for batch in chunks(cleaned, batch_size)]
    if len(parts) == 1:
        return parts[0]
    out: FloatArray = np.concatenate(parts, axis=0)
    return out


def bert_vectors(session: Any, tokens: list[list[int]], pooling: str) -> FloatArray:
    """One call of a BERT-shaped ONNX model (input_ids, attention_mask, token_type_ids ->
    last_hidden_state) on token id lists padded to the longest of them ([PAD] is id 0), pooled as
    the model defines its sentence vector: ``mean`` (attention-masked mean) or ``cls``."""
    width = max(len(t) for t in tokens)
    ids = np.zeros((len(tokens), width), dtype=np.int64)
    mask = np.zeros((len(tokens), width), dtype=np.int64)
    for row, t in enumerate(tokens):
        ids[row, : len(t)] = t
        mask[row, : len(t)] = 1
    (hidden,) = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    if pooling == "cls":
        cls: FloatArray = hidden[:, 0, :].astype(np.float32)
        return cls
    summed = (hidden * mask[..., None]).sum(axis=1)
    mean: FloatArray = (summed / np.maximum(mask.sum(axis=1, keepdims=True), 1)).astype(np.float32)
    return mean


def onnx_session(weights: Path) -> Any:
    """An onnxruntime session on ``weights`` as every in-process ONNX embedder runs one: one
    intra-op thread that never spins (``memoryctl.embed.cores`` spreads a batch over the cores
    instead), warnings about unused initialisers silenced (they are not ours)."""
    ort = importlib.import_module("onnxruntime")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(weights), options, providers=["CPUExecutionProvider"])


class OnnxBertModel(InProcessModel):
    """An int8 BERT-shaped ONNX embedder once its session and ``tokenizers`` WordPiece tokenizer
    are loaded (``loaded``, once per process): the default MiniLM and the registry e5/bge differ
    only in their weights, pooling and prefixes, which subclasses set.

    A batch is sorted by token count and cut into one sub-batch per core, so that each sub-batch
    is padded only to the longest of its similar-length neighbours, not to the longest text of the
    whole batch."""

    who: str  # the model, in errors
    pooling = "mean"  # "mean" | "cls": how the model defines its sentence vector
    query_prefix = ""
    passage_prefix = ""

    def loaded(self) -> tuple[Any, Any]:
        """(session, tokenizer), loading them on first use."""
        raise NotImplementedError

    def _encode(self, texts: list[str]) -> FloatArray:
        session, tokenizer = self.loaded()
        tokens = [e.ids for e in tokenizer.encode_batch(texts)]
        order = sorted(range(len(tokens)), key=lambda i: len(tokens[i]))
        parts = map_parts(lambda idx: bert_vectors(session, [tokens[i] for i in idx], self.pooling), order)
        out: FloatArray = np.empty((len(texts), self._info.dim), dtype=np.float32)
        out[order] = np.concatenate(parts, axis=0)
        return out

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        prefix = self.passage_prefix
        return embed_batched(
            texts,
            self._batch_size,
            self._info.dim,
            lambda batch: self._encode([prefix + t for t in batch]),
            who=self.who,
        )

    def embed_query(self, text: str) -> FloatArray:
        vectors = self._encode([self.query_prefix + clean_text(text)])
        row: FloatArray = finish_vectors(vectors, 1, self._info.dim, who=self.who)[0]
        return row

    def load(self) -> None:
        self.loaded()

    def informative(self, text: str) -> bool:
        """Whether WordPiece finds a token of its vocabulary in ``text``, without a prefix (the
        prefix alone carries nothing of the memory): emoji, and the characters it has no piece
        for, are [UNK] ("🎉" and "😀" are the same input to the model)."""
        tokenizer = self.loaded()[1]
        special = {tokenizer.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")}
        return known_tokens(tokenizer.encode(clean_text(text)).ids, special)
