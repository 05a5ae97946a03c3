"""Qdrant's REST API read directly, for what must not wait for qdrant-client.

Why not the vector store adapter: importing qdrant-client (pydantic models for the whole API) takes
about a second on an idle 2-core node, and 8-10 s at a load average of 10 (measured with ``python
-X importtime``), which alone would blow the 2 s budget of ``memoryctl health`` in a fresh process.
A few GETs say what an operator needs. The HTTP is memoryctl's one layer (``http_service``: the
retrying transport, ``StoreUnavailable`` when no answer came); this module adds the API key header
and Qdrant's ``{"result": ...}`` envelope.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import httpx

from memoryctl.errors import StoreError
from memoryctl.http_service import HttpService, Retry, error_text
from memoryctl.stores import names


class QdrantRest(AbstractContextManager["QdrantRest"]):
    """GETs against one Qdrant server (``with``: closed after). ``retry`` None: one attempt (a probe's
    budget is short)."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None,
        timeout_s: float,
        retry: Retry | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.http = HttpService(
            self.url,
            store=names.QDRANT,
            headers={"api-key": api_key} if api_key else {},
            timeout_s=timeout_s,
            retry=retry or Retry(retries=0),
            transport=transport,
            hint="check that Qdrant is running and reachable (qdrant.url, WireGuard)",
        )

    def get(self, path: str) -> httpx.Response:
        """The answer as it came (any status but the retryable ones)."""
        return self.http.request("GET", path)

    def result(self, path: str) -> Any:
        """The ``result`` of a GET; ``StoreError`` for a refused or malformed answer."""
        resp = self.get(path)
        if resp.status_code >= 400:
            hint = "qdrant.api_key is wrong or missing" if resp.status_code in (401, 403) else None
            raise StoreError(names.QDRANT, f"GET {path}: HTTP {resp.status_code}: {error_text(resp)}", hint=hint)
        try:
            return resp.json()["result"]
        except (ValueError, KeyError, TypeError):
            raise StoreError(names.QDRANT, f"GET {path}: not a Qdrant answer ({resp.text[:120]!r})") from None

    def close(self) -> None:
        self.http.close()

    def __exit__(self, *exc: object) -> None:
        self.close()
