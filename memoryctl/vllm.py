"""The one client of vLLM's OpenAI-compatible server: embeddings, chat completions, the served
models, health, and the runtime LoRA API the nightly promotion uses.

Endpoints (vLLM docs, "OpenAI-Compatible Server" and "LoRA Adapters → Dynamically serving LoRA
adapters"):

* ``GET /health``: 200 with an empty body when the engine is up (not behind the API key).
* ``GET /v1/models``: ``{"data": [{"id", "root", "parent", ...}]}``; base models have ``parent:
  null``, LoRA adapters ``parent`` = the base model id and ``root`` = the adapter path.
* ``POST /v1/embeddings`` ``{"model", "input": [...], "encoding_format": "float"}`` →
  ``{"data": [{"embedding", "index"}]}`` (the order of ``data`` is not promised: ``index`` is).
* ``POST /v1/chat/completions``: the OpenAI request; ``response_format`` ``json_schema`` for
  structured outputs.
* ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}`` and ``POST
  /v1/unload_lora_adapter`` ``{"lora_name"}``: 200 with plain text (every answer of vLLM 0.19.1, the
  version the product deploys, read from its source: tests/fixtures/vllm-0.19.1/lora_adapter_api.json);
  they exist only when the server
  runs with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (and ``--enable-lora --max-lora-rank N``),
  otherwise FastAPI answers 404 ``{"detail": "Not Found"}``, reported with that hint.

Errors come back as ``{"error": {"message", "type", "code"}}`` (newer vLLM) or flat ``{"message",
...}`` (older); ``http_service.error_text`` reads both. Transport, retries and "could not get an
answer" (``StoreUnavailable``) are ``http_service``'s; a 4xx is a ``StoreError`` with a hint that
names the setting to check (``settings``: ``vllm`` or ``embedder``, whichever configured the URL and
key). A new endpoint is one method over ``_json`` / ``_post``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import httpx

from memoryctl.errors import StoreError, StoreUnavailable
from memoryctl.http_service import HttpService, Retry, error_text, root_url

STORE = "vllm"
LORA_ROUTES = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
# How vLLM's engine core wraps an error raised while adding an adapter (v1/engine/core.py).
ENGINE_CALL_FAILED = "Call to add_lora method failed: "
RUNTIME_LORA_HINT = (
    "start vLLM with --enable-lora --max-lora-rank >= the adapter rank and the environment variable "
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
)


@dataclass(frozen=True)
class ServedModel:
    id: str
    root: str | None
    parent: str | None

    @property
    def is_adapter(self) -> bool:
        return self.parent is not None


@dataclass(frozen=True)
class ModelList:
    """What ``/v1/models`` reports: the base model(s) and the LoRA adapters currently loaded."""

    base: tuple[ServedModel, ...]
    adapters: tuple[ServedModel, ...]

    def adapter_names(self) -> set[str]:
        return {a.id for a in self.adapters}

    def has_adapter(self, name: str, path: str | None = None) -> bool:
        return any(a.id == name and (path is None or a.root in (None, path)) for a in self.adapters)


class VLLMClient(AbstractContextManager["VLLMClient"]):
    """vLLM (or any OpenAI-compatible server for the endpoints it has). Use as a context manager,
    or ``close()``. ``transport``: an ``httpx`` transport under the retries (tests: ``MockTransport``)."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        retry: Retry | None = None,
        store: str = STORE,
        settings: str = "vllm",
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = root_url(url)
        self.settings = settings
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = HttpService(
            self.url,
            store=store,
            headers=headers,
            timeout_s=timeout_s,
            retry=retry,
            transport=transport,
            hint=f"check that vLLM is up and reachable over the mesh at {settings}.url (memoryctl health),"
            f" or raise {settings}.timeout_s",
        )

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # -- endpoints -------------------------------------------------------------------------------
    def health(self, *, timeout_s: float | None = None) -> bool:
        """True when the server answers 200 on /health, False when it answers otherwise;
        ``StoreUnavailable`` when it cannot be reached (health wants "down" apart from "unhealthy")."""
        return self.http.request("GET", "/health", retry=False, timeout_s=timeout_s).status_code == 200

    def models(self, *, timeout_s: float | None = None, retry: bool = True) -> ModelList:
        data = self._json("GET", "/v1/models", retry=retry, timeout_s=timeout_s)
        cards = [
            ServedModel(str(m["id"]), m.get("root"), m.get("parent"))
            for m in (data.get("data", []) if isinstance(data, dict) else [])
            if isinstance(m, dict) and "id" in m
        ]
        return ModelList(tuple(c for c in cards if not c.is_adapter), tuple(c for c in cards if c.is_adapter))

    def embeddings(self, model: str, texts: list[str]) -> Any:
        """The decoded ``/v1/embeddings`` answer for ``texts``; its shape is the caller's to check."""
        return self._json("POST", "/v1/embeddings", json={"model": model, "input": texts, "encoding_format": "float"})

    def score(self, model: str, text_1: str, text_2: list[str], *, timeout_s: float | None = None) -> list[float]:
        """vLLM's score API (``POST /score``, a cross-encoder served with ``--runner pooling``): one
        score per ``text_2`` entry, in their order (vLLM answers with indices; they are followed,
        not trusted to be in order). One attempt: the caller has a budget and a fallback."""
        body = {"model": model, "text_1": text_1, "text_2": text_2}
        data = self._json("POST", "/score", json=body, retry=False, timeout_s=timeout_s)
        rows = data.get("data") if isinstance(data, dict) else None
        scores: dict[int, float] = {}
        for row in rows if isinstance(rows, list) else []:
            index, score = (row.get("index"), row.get("score")) if isinstance(row, dict) else (None, None)
            if isinstance(index, int) and isinstance(score, int | float):
                scores[index] = float(score)
        if sorted(scores) != list(range(len(text_2))):
            raise StoreError(
                self.http.store,
                f"malformed answer to POST {self.url}/score: {len(scores)} scores for {len(text_2)} passages",
                hint=f"{self.settings}.url must point at a vLLM serving a cross-encoder (--runner pooling)",
            )
        return [scores[i] for i in range(len(text_2))]

    def chat(self, body: dict[str, Any]) -> Any:
        """The decoded ``/v1/chat/completions`` answer for an OpenAI request body."""
        return self._json("POST", "/v1/chat/completions", json=body)

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Load an adapter. Idempotent: if ``name`` is already served from ``path``, do nothing.

        Never under a served base model's name: vLLM 0.19.1 accepts that (0.33.0 refuses it) and then
        answers every request naming the base model with the adapter, so the client refuses first.
        vLLM answers an adapter whose rank exceeds ``--max-lora-rank`` with a 500 (the engine refuses
        it; tests/fixtures/vllm-0.19.1/lora_adapter_api.json): not an outage, so it is a
        ``StoreError`` naming the setting, never a ``StoreUnavailable`` a caller would wait out."""
        if name in {m.id for m in self.models().base}:
            raise StoreError(
                self.http.store,
                f"loading LoRA adapter {name!r}: that is the name of a model the server serves (a base model)",
                hint="give the adapter its own name: vLLM would serve every request for the base model with it",
            )
        try:
            resp = self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        except StoreUnavailable as exc:
            if "max_lora_rank" not in exc.message:
                raise
            refusal = exc.message.split(": ", 1)[-1].replace(ENGINE_CALL_FAILED, "")
            raise StoreError(
                self.http.store,
                f"loading LoRA adapter {name!r} from {path}: {refusal}",
                hint="start vLLM with --max-lora-rank >= the adapter's rank (r in its adapter_config.json),"
                " or train with a lower rank ([nightly] generation_lora.rank)",
            ) from None
        if resp.status_code == 400 and "already" in error_text(resp) and self.models().has_adapter(name, path):
            return
        self._raise_for(resp, f"loading LoRA adapter {name!r} from {path}")

    def unload_lora_adapter(self, name: str, *, missing_ok: bool = False) -> None:
        resp = self._post("/v1/unload_lora_adapter", {"lora_name": name})
        if missing_ok and resp.status_code == 404 and "cannot be found" in error_text(resp):
            return
        self._raise_for(resp, f"unloading LoRA adapter {name!r}")

    # -- internals -------------------------------------------------------------------------------
    def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """A POST with a side effect on the server: one attempt, the answer unchecked."""
        return self.http.request("POST", path, json=body, retry=False)

    def _json(
        self, method: str, path: str, *, json: Any = None, retry: bool = True, timeout_s: float | None = None
    ) -> Any:
        resp = self.http.request(method, path, json=json, retry=retry, timeout_s=timeout_s)
        self._raise_for(resp, f"{method} {path}")
        try:
            return resp.json()
        except ValueError:
            raise StoreError(
                self.http.store,
                f"malformed answer to {method} {self.url}{path}: body is not JSON ({resp.text[:120]!r})",
                hint=f"{self.settings}.url must point at an OpenAI-compatible server (vLLM)",
            ) from None

    def _raise_for(self, resp: httpx.Response, what: str) -> None:
        code = resp.status_code
        if code < 400:
            return
        raise StoreError(self.http.store, f"{what}: HTTP {code}: {error_text(resp)}", hint=self._hint(resp))

    def _hint(self, resp: httpx.Response) -> str:
        code, path = resp.status_code, resp.request.url.path
        if code in (401, 403):
            return f"set {self.settings}.api_key to the key vLLM was started with (--api-key)"
        if code == 404 and path in LORA_ROUTES and error_text(resp) in ("Not Found", ""):
            return RUNTIME_LORA_HINT
        if code == 404:
            return f"check {self.settings}.url (the server root, without /v1/...) and the model name (GET /v1/models)"
        if code in (400, 422) and path == "/v1/chat/completions":
            return (
                f"check {self.settings}.model (GET /v1/models); structured outputs (response_format"
                " json_schema) need vLLM >= 0.6"
            )
        if code in (400, 413, 422):
            return "the server refused the request: a text may exceed the model's context, or the model name is wrong"
        return "see the vLLM server's log"
