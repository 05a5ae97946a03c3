"""Client for the parts of vLLM's OpenAI-compatible server that nightly promotion needs.

Endpoints (vLLM docs, "LoRA Adapters → Dynamically serving LoRA adapters"):

* ``GET /health`` — 200 with an empty body when the engine is up (not behind the API key).
* ``GET /v1/models`` — ``{"object": "list", "data": [{"id", "object": "model", "root", "parent",
  ...}]}``; base models have ``parent: null``, LoRA adapters have ``parent`` = the base model id and
  ``root`` = the adapter path.
* ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}`` → 200 with a plain-text
  "Success: LoRA adapter '<name>' added successfully."; 400 if the name is already loaded or the
  adapter is invalid (e.g. rank above ``--max-lora-rank``); 404 "No adapter found" for a bad path.
* ``POST /v1/unload_lora_adapter`` ``{"lora_name"}`` → 200 plain text; 404 if not loaded.
* ``POST /v1/embeddings`` ``{"model", "input"}`` → ``{"data": [{"embedding": [...], "index"}], ...}``.

The two LoRA routes exist **only** when the server runs with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``
(plus ``--enable-lora --max-lora-rank N``); otherwise they answer 404 Not Found, which this client
reports with that hint. vLLM itself warns the feature is risky when exposed — the deploy binds vLLM to
the WireGuard address only and sets ``--api-key`` (sent here as ``Authorization: Bearer``).
Errors come back as ``{"error": {"message", "type", "code"}}`` (newer vLLM) or flat
``{"message", "type", "code"}`` (older); both are understood.

Error mapping: cannot connect / timeout / 5xx → ``StoreUnavailable("vllm", …)``; any other non-2xx
→ ``StoreError("vllm", …)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from memoryctl.errors import StoreError, StoreUnavailable

STORE = "vllm"
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


@dataclass(frozen=True)
class AdapterRef:
    """An adapter as vLLM sees it: the served name and the directory on the vLLM host."""

    name: str
    path: str


@dataclass
class SwapResult:
    """Outcome of a hot swap, for the nightly run record."""

    loaded: str
    unloaded: str | None
    previous_unloaded: bool
    seconds: float
    notes: list[str] = field(default_factory=list)


class VLLMClient:
    """Synchronous, short-lived client; one per nightly run. Use as a context manager."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        verify_attempts: int = 5,
        verify_interval: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.verify_attempts = verify_attempts
        self.verify_interval = verify_interval
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport)

    def __enter__(self) -> VLLMClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- endpoints ---------------------------------------------------------------------------
    def health(self) -> bool:
        """True when the server answers 200 on /health; False when it answers otherwise.

        Raises StoreUnavailable when it cannot be reached at all (health checks want to tell
        "down" from "up but unhealthy").
        """
        return self._request("GET", "/health", check=False).status_code == 200

    def models(self) -> ModelList:
        data = self._request("GET", "/v1/models").json()
        cards = [
            ServedModel(str(m["id"]), m.get("root"), m.get("parent"))
            for m in data.get("data", [])
            if isinstance(m, dict) and "id" in m
        ]
        return ModelList(tuple(c for c in cards if not c.is_adapter), tuple(c for c in cards if c.is_adapter))

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Load an adapter. Idempotent: if ``name`` is already served from ``path``, do nothing."""
        resp = self._request("POST", "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path}, check=False)
        if resp.status_code == 400 and "already" in _error_message(resp) and self.models().has_adapter(name, path):
            return
        self._raise_for(resp, f"loading LoRA adapter {name!r} from {path}")

    def unload_lora_adapter(self, name: str, *, missing_ok: bool = False) -> None:
        resp = self._request("POST", "/v1/unload_lora_adapter", json={"lora_name": name}, check=False)
        if missing_ok and resp.status_code == 404 and "cannot be found" in _error_message(resp):
            return
        self._raise_for(resp, f"unloading LoRA adapter {name!r}")

    def embeddings(self, texts: list[str], model: str) -> list[list[float]]:
        """OpenAI-style embeddings (BGE-M3 in the cluster), returned in input order."""
        data = self._request("POST", "/v1/embeddings", json={"model": model, "input": texts}).json()
        rows = sorted(data.get("data", []), key=lambda d: d.get("index", 0))
        if len(rows) != len(texts):
            raise StoreError(STORE, f"/v1/embeddings returned {len(rows)} vectors for {len(texts)} inputs")
        return [list(map(float, r["embedding"])) for r in rows]

    # -- promotion ---------------------------------------------------------------------------
    def wait_for_adapter(self, name: str, path: str | None = None) -> bool:
        """Poll /v1/models until ``name`` is listed (vLLM lists it right after a 200, but a proxy or
        a restarting worker may lag); False after ``verify_attempts``."""
        for attempt in range(self.verify_attempts):
            if self.models().has_adapter(name, path):
                return True
            if attempt + 1 < self.verify_attempts:
                time.sleep(self.verify_interval)
        return False

    def hot_swap(self, new: AdapterRef, previous: str | None = None) -> SwapResult:
        """Load ``new``, verify it is served, then unload ``previous``.

        Serving never goes without an adapter: the previous one stays loaded until the new one is
        verified. If loading or verification fails, the new adapter is unloaded again (best effort)
        and the error propagates — the serving state is what it was. If only unloading the
        previous adapter fails, both remain loaded, which serves correctly; that is reported in
        ``SwapResult.previous_unloaded``/``notes`` rather than raised, so the caller can record
        the promotion and retry the cleanup later.
        """
        t0 = time.monotonic()
        self.load_lora_adapter(new.name, new.path)
        if not self.wait_for_adapter(new.name, new.path):
            self._try_unload(new.name)
            raise StoreError(
                STORE,
                f"adapter {new.name!r} was accepted but is not listed in /v1/models; unloaded it again",
                hint="check the vLLM log; the previous adapter is still serving",
            )
        result = SwapResult(loaded=new.name, unloaded=None, previous_unloaded=previous is None, seconds=0.0)
        if previous and previous != new.name:
            try:
                self.unload_lora_adapter(previous, missing_ok=True)
                result.unloaded = previous
                result.previous_unloaded = True
            except StoreError as exc:
                result.notes.append(f"previous adapter {previous!r} still loaded: {exc}")
        elif previous == new.name:
            result.previous_unloaded = True
        result.seconds = time.monotonic() - t0
        return result

    def rollback(self, current: str, previous: AdapterRef | None) -> SwapResult:
        """Return to ``previous`` (re-load it if needed, verify) and unload ``current``.

        ``previous=None`` means "back to the base model": just unload ``current``.
        """
        t0 = time.monotonic()
        if previous is None:
            self.unload_lora_adapter(current, missing_ok=True)
            return SwapResult(loaded="", unloaded=current, previous_unloaded=True, seconds=time.monotonic() - t0)
        result = self.hot_swap(previous, current)
        result.seconds = time.monotonic() - t0
        return result

    # -- internals ---------------------------------------------------------------------------
    def _try_unload(self, name: str) -> None:
        try:
            self.unload_lora_adapter(name, missing_ok=True)
        except StoreError:
            pass

    def _request(self, method: str, path: str, *, check: bool = True, **kw: Any) -> httpx.Response:
        try:
            resp = self._http.request(method, path, **kw)
        except httpx.TimeoutException as exc:
            raise StoreUnavailable(
                STORE,
                f"{method} {path} timed out ({exc})",
                hint="check vllm.url and that vLLM is up on the WireGuard address",
            ) from exc
        except httpx.HTTPError as exc:
            raise StoreUnavailable(
                STORE,
                f"{method} {path} failed: {exc}",
                hint="check vllm.url and that vLLM is up on the WireGuard address",
            ) from exc
        if check:
            self._raise_for(resp, f"{method} {path}")
        return resp

    def _raise_for(self, resp: httpx.Response, what: str) -> None:
        code = resp.status_code
        if code < 400:
            return
        msg = f"{what}: HTTP {code}: {_error_message(resp)}"
        if code >= 500:
            raise StoreUnavailable(STORE, msg, hint="vLLM is failing; check its log and GPU memory")
        if code in (401, 403):
            raise StoreError(STORE, msg, hint="set vllm.api_key to the key vLLM was started with (--api-key)")
        lora_route = resp.request.url.path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
        if code == 404 and lora_route and _error_message(resp) in ("Not Found", ""):
            raise StoreError(STORE, msg, hint=RUNTIME_LORA_HINT)
        raise StoreError(STORE, msg)


def _error_message(resp: httpx.Response) -> str:
    """vLLM's error text from either error shape (or the raw body)."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "message" in body:
            return str(body["message"])
        if "detail" in body:  # FastAPI's own 404 for a route that is not registered
            return str(body["detail"])
    return resp.text.strip()
