"""A STAND-IN for vLLM's OpenAI-compatible server — not vLLM.

vLLM needs a GPU and cannot run in CI, so the LoRA promotion client (``lora.vllm``) is tested
against this small, real HTTP server (stdlib ``http.server`` in a thread, bound to 127.0.0.1). It
implements exactly the endpoints the client uses, with the request/response shapes and error
behaviour of vLLM's ``serving_models.py`` / LoRA router:

* ``GET /health`` → 200, empty body; not behind the API key (as in vLLM).
* ``GET /v1/models`` → ``{"object": "list", "data": [...]}``: base model cards (``parent: null``)
  then one card per loaded adapter (``root`` = its path, ``parent`` = the base model).
* ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}`` → 200 plain text
  ``Success: LoRA adapter '<name>' added successfully.``; 400 ``InvalidUserInput`` when a field is
  missing or the name is already loaded; 404 ``NotFoundError`` "No adapter found for <path>" when
  the directory has no ``adapter_config.json``; 400 when the adapter's rank exceeds
  ``max_lora_rank``.
* ``POST /v1/unload_lora_adapter`` ``{"lora_name"}`` → 200 plain text; 404 when not loaded.
* ``POST /v1/embeddings`` ``{"model", "input"}`` → OpenAI embedding list with deterministic unit
  vectors derived from a hash of each input (NOT semantic — for plumbing tests only).
* The two LoRA routes are registered only when ``allow_runtime_lora_updating`` is true, mirroring
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``; otherwise they answer FastAPI's ``{"detail": "Not Found"}``.
* With ``api_key`` set, ``/v1/*`` requires ``Authorization: Bearer <key>`` (401 otherwise).

Fault injection for rollback tests: ``fail_next_load`` (answer 500 once), ``hide_adapters`` (accept a
load but leave it out of /v1/models), ``fail_unload`` (names whose unload answers 500).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class StandinState:
    base_model: str = "Qwen/Qwen2.5-7B-Instruct"
    api_key: str | None = None
    allow_runtime_lora_updating: bool = True
    max_lora_rank: int = 16
    embedding_dim: int = 1024
    loras: dict[str, str] = field(default_factory=dict)  # name -> path, in load order
    fail_next_load: bool = False
    hide_adapters: set[str] = field(default_factory=set)
    fail_unload: set[str] = field(default_factory=set)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path) log


class _Handler(BaseHTTPRequestHandler):
    server: VLLMStandin

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    # -- helpers ---------------------------------------------------------------------------
    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = (
            body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
        )
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, message: str, err_type: str) -> None:
        self._send(code, {"error": {"message": message, "type": err_type, "param": None, "code": code}})

    def _authorised(self) -> bool:
        key = self.server.state.api_key
        if key is None or not self.path.startswith("/v1"):
            return True
        if self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def _json_body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self._error(400, "invalid JSON body", "BadRequestError")
            return None
        if not isinstance(body, dict):
            self._error(400, "expected a JSON object", "BadRequestError")
            return None
        return body

    # -- routes ----------------------------------------------------------------------------
    def do_GET(self) -> None:
        st = self.server.state
        with self.server.lock:
            st.requests.append(("GET", self.path))
            if not self._authorised():
                return
            if self.path == "/health":
                self._send(200, b"")
            elif self.path == "/v1/models":
                cards = [
                    {
                        "id": st.base_model,
                        "object": "model",
                        "created": 0,
                        "owned_by": "vllm",
                        "root": st.base_model,
                        "parent": None,
                        "max_model_len": 32768,
                    }
                ]
                cards += [
                    {
                        "id": n,
                        "object": "model",
                        "created": 0,
                        "owned_by": "vllm",
                        "root": p,
                        "parent": st.base_model,
                        "max_model_len": None,
                    }
                    for n, p in st.loras.items()
                    if n not in st.hide_adapters
                ]
                self._send(200, {"object": "list", "data": cards})
            else:
                self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        st = self.server.state
        with self.server.lock:
            st.requests.append(("POST", self.path))
            if not self._authorised():
                return
            lora_route = self.path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
            if lora_route and not st.allow_runtime_lora_updating:
                self._send(404, {"detail": "Not Found"})
                return
            body = self._json_body()
            if body is None:
                return
            if self.path == "/v1/load_lora_adapter":
                self._load(body)
            elif self.path == "/v1/unload_lora_adapter":
                self._unload(body)
            elif self.path == "/v1/embeddings":
                self._embeddings(body)
            else:
                self._send(404, {"detail": "Not Found"})

    def _load(self, body: dict[str, Any]) -> None:
        st = self.server.state
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            self._error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
            return
        if name in st.loras:
            self._error(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")
            return
        if st.fail_next_load:
            st.fail_next_load = False
            self._error(500, "injected failure: engine error while adding the adapter", "InternalServerError")
            return
        cfg = Path(path) / "adapter_config.json"
        if not cfg.is_file():
            self._error(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
            return
        rank = int(json.loads(cfg.read_text()).get("r", 0))
        if rank > st.max_lora_rank:
            self._error(400, f"LoRA rank {rank} is greater than max_lora_rank {st.max_lora_rank}.", "BadRequestError")
            return
        st.loras[name] = path
        self._send(200, f"Success: LoRA adapter '{name}' added successfully.", "text/plain; charset=utf-8")

    def _unload(self, body: dict[str, Any]) -> None:
        st = self.server.state
        name = body.get("lora_name")
        if not name:
            self._error(400, "either 'lora_name' and 'lora_int_id' needs to be provided.", "InvalidUserInput")
            return
        if name not in st.loras:
            self._error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
            return
        if name in st.fail_unload:
            self._error(500, f"injected failure unloading {name}", "InternalServerError")
            return
        del st.loras[name]
        self._send(200, f"Success: LoRA adapter '{name}' removed successfully.", "text/plain; charset=utf-8")

    def _embeddings(self, body: dict[str, Any]) -> None:
        st = self.server.state
        model = body.get("model") or st.base_model
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
            self._error(400, "input must be a string or a list of strings", "BadRequestError")
            return
        if model != st.base_model and model not in st.loras:
            self._error(404, f"The model `{model}` does not exist.", "NotFoundError")
            return
        data = [
            {"object": "embedding", "index": i, "embedding": deterministic_vector(t, st.embedding_dim)}
            for i, t in enumerate(inputs)
        ]
        tokens = sum(len(t.split()) for t in inputs)
        self._send(
            200,
            {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )


def deterministic_vector(text: str, dim: int) -> list[float]:
    """A unit vector seeded by sha256(text): same text → same vector, on every machine."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    v = np.random.default_rng(seed).standard_normal(dim)
    return [float(x) for x in v / np.linalg.norm(v)]


class VLLMStandin(ThreadingHTTPServer):
    """Stand-in vLLM server on 127.0.0.1:<ephemeral port>. Use as a context manager."""

    daemon_threads = True

    def __init__(self, state: StandinState | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state or StandinState()
        self.lock = threading.Lock()
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, name="vllm-standin", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> VLLMStandin:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)
