"""Embeddings from an OpenAI-compatible ``POST /v1/embeddings`` endpoint (vLLM serving BGE-M3).

Why our own small client instead of the ``openai`` package: one more dependency for one request
shape, and we need exact control over what counts as retryable and how each failure reads to the
operator. The request is the OpenAI one (``model``, ``input`` as a list, ``encoding_format``
"float"); the response's ``data[*].index`` is honoured because the spec does not promise order.

Failure policy (bounded, so a dead endpoint costs at most ``(max_retries + 1) * timeout`` plus
backoff): connection errors, timeouts, 429 and 5xx are retried with exponential backoff; any other
4xx is a configuration problem and fails at once; an answer that is not the documented shape is a
``StoreError`` naming what was wrong. ``StoreUnavailable`` means "could not get an answer" so the
write path can leave the outbox entry for ``memoryctl sync``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

from memoryctl.embed.base import STORE, FloatArray, clean_text, embed_batched, finish_vectors, has_content
from memoryctl.errors import ConfigError, StoreError, StoreUnavailable
from memoryctl.stores.protocols import EmbeddingModelInfo

_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_DIM_PROBE = "dimension probe"


def endpoint(url: str) -> str:
    """``http://host:8000``, ``…/`` and ``…/v1`` all mean the same server."""
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + "/v1/embeddings"


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
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        model_id: str | None = None,
    ) -> None:
        if not url or not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"embedder.url {url!r} is not an http(s) URL",
                hint="set embedder.url to the vLLM embeddings server, e.g. http://10.77.0.3:8001",
            )
        if not model:
            raise ConfigError(
                "the http embedder needs embedder.model (the served model name)",
                hint='e.g. embedder.model = "BAAI/bge-m3" (see GET /v1/models on the server)',
            )
        self._url = endpoint(url)
        self._model = model
        self._dim = dim
        self._batch_size = batch_size
        self._timeout_s = timeout_s
        self._max_retries = max(0, max_retries)
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._model_id = model_id or f"http:{model}"
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s), headers=headers)

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
        self._client.close()

    # -- transport ---------------------------------------------------------------------------

    def _request(self, batch: list[str]) -> FloatArray:
        body = {"model": self._model, "input": batch, "encoding_format": "float"}
        last: str = ""
        for attempt in range(self._max_retries + 1):
            if attempt:
                time.sleep(min(self._max_backoff_s, self._backoff_s * 2 ** (attempt - 1)))
            try:
                resp = self._client.post(self._url, json=body)
            except httpx.TimeoutException as exc:
                last = f"timed out after {self._timeout_s:g}s ({type(exc).__name__})"
                continue
            except httpx.TransportError as exc:
                last = f"could not connect: {exc}"
                continue
            if resp.status_code in _RETRY_STATUS:
                last = f"HTTP {resp.status_code}: {_error_text(resp)}"
                continue
            if resp.status_code >= 400:
                raise StoreError(
                    STORE,
                    f"{self._url} answered HTTP {resp.status_code}: {_error_text(resp)}",
                    hint=_hint_for(resp.status_code),
                )
            return self._parse(resp, len(batch))
        raise StoreUnavailable(
            STORE,
            f"{self._url} unavailable after {self._max_retries + 1} attempts: {last}",
            hint="check that the vLLM embeddings server is up and reachable over the mesh "
            "(memoryctl health), or raise embedder.timeout_s",
        )

    def _parse(self, resp: httpx.Response, n: int) -> FloatArray:
        bad = f"malformed /v1/embeddings response from {self._url}"
        hint = "embedder.url must point at an OpenAI-compatible embeddings server (vLLM --task embed)"
        try:
            payload: Any = resp.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise StoreError(STORE, f"{bad}: body is not JSON ({resp.text[:120]!r})", hint=hint) from None
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


def _error_text(resp: httpx.Response) -> str:
    """The server's own error message when it sent one (OpenAI/vLLM shape), else the body's start."""
    try:
        payload = resp.json()
        if isinstance(payload, dict):
            err = payload.get("error", payload.get("message"))
            if isinstance(err, dict):
                err = err.get("message")
            if isinstance(err, str):
                return err[:300]
    except (json.JSONDecodeError, UnicodeDecodeError):
        pass
    return resp.text[:300] or resp.reason_phrase


def _hint_for(status: int) -> str:
    if status in (401, 403):
        return "check embedder.api_key (vLLM --api-key)"
    if status == 404:
        return "check embedder.url (the server root, without /v1/embeddings) and embedder.model (GET /v1/models)"
    if status in (400, 413, 422):
        return "the server rejected the input; a text may exceed the model's context, or embedder.model is wrong"
    return "see the embeddings server's log"
