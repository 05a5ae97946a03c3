"""The one HTTP layer (memoryctl/http_service.py) and the vLLM client on it, with scripted servers:
``httpx.MockTransport`` answers in-process, so the retry policy and the error mapping are checked
without a socket (the real servers: tests/unit/test_embed.py, test_extract.py and tests/lora against
stand-ins on 127.0.0.1)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from memoryctl.embed.http import HttpEmbedder
from memoryctl.errors import StoreError, StoreUnavailable
from memoryctl.http_service import HttpService, Retry
from memoryctl.vllm import RUNTIME_LORA_HINT, VLLMClient

Handler = Callable[[httpx.Request], httpx.Response]


class Script:
    """A server that answers from a list (the last answer repeats) and records what it was asked."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers, self.requests = list(answers), []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


def service(script: Script, *, retries: int = 3, slept: list[float] | None = None) -> HttpService:
    return HttpService(
        "http://vllm.test",
        store="vllm",
        retry=Retry(retries, backoff_s=0.5, max_backoff_s=0.75),
        transport=httpx.MockTransport(script),
        sleep=(slept if slept is not None else []).append,
    )


def test_a_retryable_status_is_retried_with_bounded_backoff() -> None:
    script = Script(httpx.Response(503), httpx.Response(429), httpx.Response(200, json={"ok": True}))
    slept: list[float] = []
    assert service(script, slept=slept).request("POST", "/v1/embeddings", json={"a": 1}).json() == {"ok": True}
    assert len(script.requests) == 3 and slept == [0.5, 0.75]  # 0.5, then 1.0 capped at 0.75
    assert all(r.content == b'{"a":1}' for r in script.requests)  # the body is sent again whole


def test_no_answer_after_the_last_attempt_is_unavailable_with_the_servers_words() -> None:
    script = Script(httpx.Response(503, json={"error": {"message": "model is loading"}}))
    with pytest.raises(StoreUnavailable, match="after 3 attempts: HTTP 503: model is loading") as err:
        service(script, retries=2).request("GET", "/v1/models")
    assert len(script.requests) == 3 and err.value.store == "vllm"


def test_connection_errors_are_retried_then_unavailable() -> None:
    refused = httpx.ConnectError("[Errno 111] Connection refused")
    script = Script(refused, httpx.Response(200, json={}))
    assert service(script).request("GET", "/health").status_code == 200
    always = Script(httpx.ReadTimeout("slow"))
    with pytest.raises(StoreUnavailable, match="timed out after 30s"):
        service(always, retries=1).request("GET", "/health")
    assert len(always.requests) == 2


def test_a_request_with_a_side_effect_gets_one_attempt() -> None:
    script = Script(httpx.Response(500, text="boom"))
    with pytest.raises(StoreUnavailable, match=r"\(1 attempt\): HTTP 500: boom"):
        service(script).request("POST", "/v1/load_lora_adapter", json={}, retry=False)
    assert len(script.requests) == 1


def test_other_statuses_come_back_at_once() -> None:
    script = Script(httpx.Response(404, json={"detail": "Not Found"}))
    assert service(script).request("GET", "/nope").status_code == 404
    assert len(script.requests) == 1


def vllm(handler: Handler, **kw: object) -> VLLMClient:
    return VLLMClient("http://vllm.test/v1", transport=httpx.MockTransport(handler), **kw)  # type: ignore[arg-type]


def test_vllm_client_maps_refusals_to_hints_naming_the_setting() -> None:
    with pytest.raises(StoreError, match="401") as err:
        vllm(Script(httpx.Response(401, json={"message": "bad key"})), api_key="k").models()
    assert not isinstance(err.value, StoreUnavailable) and "vllm.api_key" in (err.value.hint or "")
    models = httpx.Response(200, json={"object": "list", "data": [{"id": "base", "root": "base", "parent": None}]})
    script = Script(models, httpx.Response(404, json={"detail": "Not Found"}))
    with pytest.raises(StoreError) as err:
        vllm(script).load_lora_adapter("a", "/adapters/a")
    assert err.value.hint == RUNTIME_LORA_HINT
    assert [r.url.path for r in script.requests] == ["/v1/models", "/v1/load_lora_adapter"]  # base names first
    with pytest.raises(StoreError) as err:
        vllm(Script(httpx.Response(401)), settings="embedder").embeddings("m", ["x"])
    assert "embedder.api_key" in (err.value.hint or "")


def test_vllm_client_sends_the_key_and_reads_the_models() -> None:
    models = {
        "data": [
            {"id": "qwen", "root": "qwen", "parent": None},
            {"id": "support-v3", "root": "/adapters/v3", "parent": "qwen"},
        ]
    }
    script = Script(httpx.Response(200, json=models))
    listed = vllm(script, api_key="s3cret").models()
    assert [m.id for m in listed.base] == ["qwen"] and listed.has_adapter("support-v3", "/adapters/v3")
    assert script.requests[0].headers["authorization"] == "Bearer s3cret"


def test_the_embedder_takes_a_transport() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [{"index": 0, "embedding": [3.0, 4.0]}]})

    emb = HttpEmbedder("http://vllm.test", "bge-m3", transport=httpx.MockTransport(answer))
    assert emb.embed_query("a").tolist() == pytest.approx([0.6, 0.8]) and emb.info.dim == 2
