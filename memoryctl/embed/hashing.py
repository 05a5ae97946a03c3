"""A deterministic, fast, NOT semantic stand-in embedder (the hashing trick).

Why it exists: pipeline tests and store benchmarks need vectors of the right shape, produced in
microseconds, identical on every machine and every run, without loading a model. It hashes each
token (NFKC, case-folded ``\\w+`` runs) with BLAKE2b into one of ``dim`` buckets with a ±1 sign and
L2-normalises the counts. Texts that share words get a positive cosine, so "search finds the text
it was given" tests work, but synonyms, paraphrases and other languages score zero: never use it
for real memories. Its model id says ``hash`` so a collection built with it can never be mistaken
for a real model's.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Sequence

import numpy as np

from memoryctl.embed.base import FloatArray, InProcessModel, clean_text, embed_batched, finish_vectors
from memoryctl.stores.protocols import EmbeddingModelInfo

DEFAULT_DIM = 384
_TOKEN = re.compile(r"\w+")
_EMPTY_TOKEN = "\x00empty"  # so the empty text still has a unit vector


class HashEmbedder(InProcessModel):
    """Hashing-trick bag of words. Same input, same vector, in any process. NOT semantic."""

    def __init__(self, dim: int = DEFAULT_DIM, *, batch_size: int = 256, model_id: str | None = None) -> None:
        if dim < 8:
            raise ValueError("hash embedder needs dim >= 8")
        self._dim = dim
        super().__init__(EmbeddingModelInfo(model_id=model_id or f"hash/bow-blake2b-v1@{dim}", dim=dim), batch_size)

    def _bucket(self, token: str) -> tuple[int, float]:
        h = int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")
        return h % self._dim, (1.0 if (h >> 63) & 1 else -1.0)

    def _row(self, text: str, out: FloatArray) -> None:
        tokens = _TOKEN.findall(unicodedata.normalize("NFKC", text).casefold())
        for tok in tokens:
            idx, sign = self._bucket(tok)
            out[idx] += sign
        if not out.any():  # no tokens, or colliding tokens cancelled out: still a unit vector
            idx, sign = self._bucket(_EMPTY_TOKEN)
            out[idx] = sign

    def _run(self, batch: list[str]) -> FloatArray:
        arr: FloatArray = np.zeros((len(batch), self._dim), dtype=np.float32)
        for i, text in enumerate(batch):
            self._row(text, arr[i])
        return arr

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        return embed_batched(texts, self._batch_size, self._dim, self._run, who="hash embedder")

    def embed_query(self, text: str) -> FloatArray:
        row = finish_vectors(self._run([clean_text(text)]), 1, self._dim, who="hash embedder")
        out: FloatArray = row[0]
        return out
