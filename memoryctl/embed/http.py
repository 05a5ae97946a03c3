"""Embeddings from an OpenAI-compatible ``POST /v1/embeddings`` endpoint (vLLM serving BGE-M3).

The request goes through memoryctl's one vLLM client (``memoryctl.vllm``), whose transport retries
connection errors, timeouts, 429 and 5xx with exponential backoff, bounded (so a dead endpoint
costs at most ``(retry.retries + 1) * timeout`` plus backoff); any other 4xx is a configuration
problem and fails at once with a hint naming the ``embedder.*`` setting. What is this module's:
the answer's shape, checked strictly: ``data[*].index`` is honoured because the spec does not
promise order, and an answer that is not the documented shape is a ``StoreError`` naming what was
wrong. ``StoreUnavailable`` means "could not get an answer" so the write path can leave the outbox
entry for ``memoryctl sync``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

from memoryctl.embed.base import STORE, FloatArray, clean_text, embed_batched, finish_vectors, has_content
from memoryctl.errors import ConfigError, StoreError
from memoryctl.http_service import Retry
from memoryctl.stores.protocols import EmbeddingModelInfo
from memoryctl.vllm import VLLMClient

_DIM_PROBE = "dimension probe"


class HttpEmbedder:
    """Client of an OpenAI-compatible embeddings server. ``model_id`` is ``"http:" + model``."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        dim: int | None = None,
        batch_size: int = 64,
        timeout_s: float = 30.0,
        retry: Retry | None = None,
        model_id: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        hint = "e.g. MEMORYCTL_EMBEDDER__URL=http://10.77.0.3:8001 (the vLLM embeddings server)"
        if not url:
            raise ConfigError('embedder.kind = "http" needs embedder.url', hint=hint)
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"embedder.url {url!r} is not an http(s) URL", hint=hint)
        if not model:
            raise ConfigError(
                'embedder.kind = "http" needs embedder.model (the served model name)',
                hint='e.g. embedder.model = "BAAI/bge-m3" (see GET /v1/models on the server)',
            )
        self._model = model
        self._dim = dim
        self._batch_size = batch_size
        self._model_id = model_id or f"http:{model}"
        self._vllm = VLLMClient(
            url,
            api_key=api_key,
            timeout_s=timeout_s,
            retry=retry or Retry(),
            store=STORE,
            settings="embedder",
            transport=transport,
        )
        self._url = self._vllm.url + "/v1/embeddings"

    @property
    def info(self) -> EmbeddingModelInfo:
        """Asks the server once (a one-text request) when ``dim`` was not configured."""
        if self._dim is None:
            self._dim = self._request([_DIM_PROBE]).shape[1]
        return EmbeddingModelInfo(model_id=self._model_id, dim=self._dim)

    @property
    def batch_size(self) -> int:
        return self._batch_size

    def _run(self, batch: list[str]) -> FloatArray:
        return self._request(batch)

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        if isinstance(texts, str):
            raise TypeError("embed_documents takes a sequence of texts, not one str")
        if not texts:
            return np.zeros((0, self.info.dim), dtype=np.float32)
        who = f"embedder at {self._url}"
        if self._dim is None:  # learn the dimension from the first real batch, not a probe
            first = self._request([clean_text(t) for t in texts[: self._batch_size]])
            self._dim = first.shape[1]
            rest = texts[self._batch_size :]
            if not rest:
                return first
            out: FloatArray = np.concatenate(
                [first, embed_batched(rest, self._batch_size, self._dim, self._run, who=who)], axis=0
            )
            return out
        return embed_batched(texts, self._batch_size, self._dim, self._run, who=who)

    def embed_query(self, text: str) -> FloatArray:
        raw = self._request([clean_text(text)])
        if self._dim is None:
            self._dim = raw.shape[1]
        row: FloatArray = raw[0]
        return row

    def informative(self, text: str) -> bool:
        """The served model's tokens are not visible from here: a letter or a digit (``has_content``)."""
        return has_content(text)

    def close(self) -> None:
        self._vllm.close()

    def _request(self, batch: list[str]) -> FloatArray:
        return self._parse(self._vllm.embeddings(self._model, batch), len(batch))

    def _parse(self, payload: Any, n: int) -> FloatArray:
        bad = f"malformed /v1/embeddings response from {self._url}"
        hint = "embedder.url must point at an OpenAI-compatible embeddings server (vLLM --task embed)"
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list) or len(data) != n:
            got = len(data) if isinstance(data, list) else type(data).__name__
            raise StoreError(STORE, f"{bad}: expected 'data' with {n} items, got {got}", hint=hint)
        rows: list[Any] = [None] * n
        for pos, item in enumerate(data):
            if not isinstance(item, dict) or not isinstance(item.get("embedding"), list):
                raise StoreError(
                    STORE,
                    f"{bad}: data[{pos}] has no 'embedding' list (base64 encoding is not requested and not accepted)",
                    hint=hint,
                )
            index = item.get("index", pos)
            if not isinstance(index, int) or not 0 <= index < n or rows[index] is not None:
                raise StoreError(STORE, f"{bad}: data[{pos}] has invalid or duplicate index {index!r}", hint=hint)
            rows[index] = item["embedding"]
        widths = {len(r) for r in rows}
        if len(widths) != 1 or 0 in widths:
            raise StoreError(STORE, f"{bad}: embeddings of differing or zero length {sorted(widths)}", hint=hint)
        width = widths.pop()
        if self._dim is not None and width != self._dim:
            raise StoreError(
                STORE,
                f"{self._url} returned {width}-dimensional vectors, expected {self._dim}",
                hint="embedder.dim or the served model is wrong; a different model needs `memoryctl migrate`",
            )
        try:
            arr = np.asarray(rows, dtype=np.float32)
        except (TypeError, ValueError):
            raise StoreError(STORE, f"{bad}: embeddings contain non-numbers", hint=hint) from None
        return finish_vectors(arr, n, width, who=f"embedder at {self._url}")
