"""memoryctl.vllm.VLLMClient and the adapter promotion (memoryctl_lora.serving) against the vLLM STAND-IN
(tests/lora/vllm_standin.py), a real HTTP server on 127.0.0.1. vLLM itself needs a GPU and is not available
in CI."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from memoryctl.config import ExtractorSettings, VllmSettings
from memoryctl.errors import StoreError, StoreUnavailable
from memoryctl.extract import make_extractor
from memoryctl.extract.llm import LlmExtractor
from memoryctl.vllm import VLLMClient
from memoryctl_lora.serving import AdapterRef, AdapterServing
from tests.lora.vllm_standin import LORA_ANSWERS, StandinState, VLLMStandin

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.19.1"

KEY = "s3cret"


@pytest.fixture
def standin() -> Iterator[VLLMStandin]:
    with VLLMStandin(StandinState(api_key=KEY)) as server:
        yield server


@pytest.fixture
def client(standin: VLLMStandin) -> Iterator[VLLMClient]:
    with VLLMClient(standin.url, api_key=KEY, timeout_s=5) as c:
        yield c


@pytest.fixture
def serving(client: VLLMClient) -> AdapterServing:
    return AdapterServing(client, verify_attempts=2, verify_interval=0.01)


def _adapter_dir(tmp: Path, name: str, rank: int = 8) -> str:
    d = tmp / name
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    (d / "adapter_model.safetensors").write_bytes(b"\0")
    return str(d)


def test_health_models_load_unload(client: VLLMClient, tmp_path: Path) -> None:
    assert client.health() is True
    models = client.models()
    assert [m.id for m in models.base] == ["Qwen/Qwen2.5-7B-Instruct"] and models.adapters == ()
    path = _adapter_dir(tmp_path, "a1")
    client.load_lora_adapter("a1", path)
    client.load_lora_adapter("a1", path)  # idempotent for the same name + path
    models = client.models()
    assert models.has_adapter("a1", path) and models.adapters[0].parent == "Qwen/Qwen2.5-7B-Instruct"
    with pytest.raises(StoreError, match="already been loaded"):
        client.load_lora_adapter("a1", _adapter_dir(tmp_path, "other"))
    client.unload_lora_adapter("a1")
    assert client.models().adapters == ()
    with pytest.raises(StoreError, match="cannot be found"):
        client.unload_lora_adapter("a1")
    client.unload_lora_adapter("a1", missing_ok=True)


def test_load_errors_are_mapped(client: VLLMClient, standin: VLLMStandin, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="No adapter found") as e:
        client.load_lora_adapter("x", str(tmp_path / "nope"))
    assert not isinstance(e.value, StoreUnavailable)
    with pytest.raises(StoreError, match="LoRA rank 64 is greater than max_lora_rank 16") as e:
        client.load_lora_adapter("big", _adapter_dir(tmp_path, "big", rank=64))
    assert not isinstance(e.value, StoreUnavailable)  # vLLM's 500 here is a refusal, not an outage
    assert e.value.hint is not None and "--max-lora-rank" in e.value.hint
    standin.state.fail_next_load = True
    with pytest.raises(StoreUnavailable, match="HTTP 500"):
        client.load_lora_adapter("y", _adapter_dir(tmp_path, "y"))


def test_runtime_lora_updating_disabled_gives_hint(tmp_path: Path) -> None:
    with VLLMStandin(StandinState(allow_runtime_lora_updating=False)) as server, VLLMClient(server.url) as c:
        with pytest.raises(StoreError) as e:
            c.load_lora_adapter("a", _adapter_dir(tmp_path, "a"))
        assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in str(e.value)


def test_auth_and_unreachable(standin: VLLMStandin) -> None:
    with VLLMClient(standin.url, api_key="wrong") as c:
        assert c.health() is True  # /health is not behind the key, as in vLLM
        with pytest.raises(StoreError, match="401") as e:
            c.models()
        assert "api_key" in str(e.value)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed port: connection refused
    with VLLMClient(f"http://127.0.0.1:{port}", timeout_s=1) as c, pytest.raises(StoreUnavailable):
        c.health()


def test_hot_swap_and_rollback(
    client: VLLMClient, serving: AdapterServing, standin: VLLMStandin, tmp_path: Path
) -> None:
    v1 = AdapterRef("memoryctl-generation-v0001", _adapter_dir(tmp_path, "v1"))
    v2 = AdapterRef("memoryctl-generation-v0002", _adapter_dir(tmp_path, "v2"))
    r1 = serving.hot_swap(v1)
    assert r1.loaded == v1.name and r1.unloaded is None
    r2 = serving.hot_swap(v2, previous=v1.name)
    assert r2.previous_unloaded and r2.unloaded == v1.name
    assert client.models().adapter_names() == {v2.name}
    rb = serving.rollback(v2.name, v1)
    assert rb.loaded == v1.name and rb.unloaded == v2.name
    assert client.models().adapter_names() == {v1.name}
    serving.rollback(v1.name, None)  # back to the base model
    assert client.models().adapter_names() == set()


def test_hot_swap_failure_leaves_serving_state_unchanged(
    client: VLLMClient, serving: AdapterServing, standin: VLLMStandin, tmp_path: Path
) -> None:
    v1 = AdapterRef("v1", _adapter_dir(tmp_path, "v1"))
    v2 = AdapterRef("v2", _adapter_dir(tmp_path, "v2"))
    serving.hot_swap(v1)
    # 1) load fails outright
    standin.state.fail_next_load = True
    with pytest.raises(StoreUnavailable):
        serving.hot_swap(v2, previous=v1.name)
    assert client.models().adapter_names() == {v1.name}
    # 2) load accepted but the adapter never shows in /v1/models → unloaded again, v1 still serving
    standin.state.hide_adapters.add(v2.name)
    with pytest.raises(StoreError, match="not listed"):
        serving.hot_swap(v2, previous=v1.name)
    assert set(standin.state.loras) == {v1.name}
    standin.state.hide_adapters.clear()
    # 3) new adapter verified but the old one refuses to unload → promotion stands, reported in notes
    standin.state.fail_unload.add(v1.name)
    r = serving.hot_swap(v2, previous=v1.name)
    assert not r.previous_unloaded and r.notes and set(standin.state.loras) == {v1.name, v2.name}


def test_embeddings(client: VLLMClient) -> None:
    rows = sorted(client.embeddings("Qwen/Qwen2.5-7B-Instruct", ["a", "b", "a"])["data"], key=lambda d: d["index"])
    vecs = [r["embedding"] for r in rows]
    assert len(vecs) == 3 and len(vecs[0]) == 1024 and vecs[0] == vecs[2] and vecs[0] != vecs[1]
    assert abs(sum(x * x for x in vecs[0]) - 1.0) < 1e-9
    with pytest.raises(StoreError, match="does not exist"):
        client.embeddings("unknown", ["a"])


def test_the_standin_answers_as_vllm_0_19_does(standin: VLLMStandin, tmp_path: Path) -> None:
    """Every runtime-LoRA answer of the stand-in is vLLM 0.19.1's (the version the product deploys), as
    read from its source into tests/fixtures/vllm-0.19.1/lora_adapter_api.json (status, error type,
    message)."""
    fixture = json.loads((FIXTURES / "lora_adapter_api.json").read_text())
    assert LORA_ANSWERS == fixture["answers"]  # the stand-in's own copy (deployed as one file)
    answers = fixture["answers"]
    headers = {"Authorization": f"Bearer {KEY}"}

    def post(route: str, body: dict[str, object], key: str, **fields: object) -> httpx.Response:
        resp = httpx.post(f"{standin.url}{route}", json=body, headers=headers, timeout=5)
        want = answers[key]
        assert resp.status_code == want["code"], (key, resp.text)
        if want["code"] == 200:
            assert resp.text == want["text"].format(**fields)
            return resp
        error = resp.json()["error"]
        assert (error["type"], error["code"]) == (want["type"], want["code"]), key
        if "message" in want:
            assert error["message"] == want["message"].format(**fields), key
        for part in want.get("message_contains", []):
            assert part.format(**fields) in error["message"], (key, part)
        return resp

    load, unload = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
    path = _adapter_dir(tmp_path, "a")
    assert fixture["load_request_fields"] == ["lora_name", "lora_path", "load_inplace"]
    post(load, {"lora_name": "a"}, "request_field_absent", field="lora_path")
    post(load, {"lora_name": "a", "lora_path": ""}, "load_missing_field")
    post(load, {"lora_name": "a", "lora_path": path}, "loaded", name="a")
    post(load, {"lora_name": "a", "lora_path": path}, "load_already_loaded", name="a")
    post(load, {"lora_name": "a", "lora_path": path, "load_inplace": True}, "loaded", name="a")
    post(load, {"lora_name": "b", "lora_path": "/srv/nowhere"}, "load_not_found", name="b", path="/srv/nowhere")
    big = _adapter_dir(tmp_path, "big", rank=32)
    post(load, {"lora_name": "big", "lora_path": big}, "load_rank_too_large", rank=32, max_rank=16)
    post(unload, {}, "request_field_absent", field="lora_name")
    post(unload, {"lora_name": ""}, "unload_missing_field")
    post(unload, {"lora_name": "a"}, "unloaded", name="a")
    post(unload, {"lora_name": "a"}, "unload_not_found", name="a")
    missing = httpx.post(f"{standin.url}/v1/chat/completions", json={"model": "zz"}, headers=headers, timeout=5)
    want = fixture["model_not_found"]
    assert missing.status_code == want["code"]
    assert missing.json()["error"] == {**want, "message": want["message"].format(name="zz")}


def test_an_adapter_named_like_the_base_model_is_refused_by_the_client(
    client: VLLMClient, standin: VLLMStandin, tmp_path: Path
) -> None:
    """vLLM 0.19.1 accepts an adapter named like the served base model (0.33.0 refuses it) and then
    serves every request naming the base model with that adapter; the client refuses to ask."""
    base = standin.state.base_model
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"lora_name": base, "lora_path": _adapter_dir(tmp_path, "shadow")}
    with pytest.raises(StoreError, match="base model") as e:
        client.load_lora_adapter(base, body["lora_path"])
    assert e.value.hint is not None and standin.state.loras == {}
    # what the client prevents: the stand-in, like 0.19.1, takes it and answers the base's name with it
    assert httpx.post(f"{standin.url}/v1/load_lora_adapter", json=body, headers=headers, timeout=5).status_code == 200
    chat = httpx.post(f"{standin.url}/v1/chat/completions", json={"model": base}, headers=headers, timeout=5)
    assert json.loads(chat.json()["choices"][0]["message"]["content"])["entities"] == [{"type": "Topic", "name": base}]


def test_the_llm_extractor_names_the_served_adapter_through_a_swap_and_rollbacks(
    standin: VLLMStandin, serving: AdapterServing, tmp_path: Path
) -> None:
    """``[vllm] use_served_adapter``: requests name the adapter the nightly hot-loaded, and the
    stand-in's answer (a Topic named after the model that answered) shows which one did."""
    base = standin.state.base_model
    text = "Alice restarted the payments service."

    def answered_by(extractor: LlmExtractor) -> list[tuple[str, str]]:
        out = extractor.extract(text)
        assert out.degraded is None, out.degraded
        return [(e.type, e.name) for e in out.entities]

    llm = LlmExtractor(standin.url, base, api_key=KEY, merge_fallback=False, use_served_adapter=True, adapter_check_s=0)
    plain = LlmExtractor(standin.url, base, api_key=KEY, merge_fallback=False)
    assert answered_by(llm) == []  # no adapter loaded: the base model answers
    v1, v2 = AdapterRef("gen-v1", _adapter_dir(tmp_path, "v1")), AdapterRef("gen-v2", _adapter_dir(tmp_path, "v2"))
    serving.hot_swap(v1)
    assert answered_by(llm) == [("Topic", "gen-v1")]
    assert answered_by(plain) == []  # not configured: always the base model
    serving.hot_swap(v2, previous="gen-v1")
    assert answered_by(llm) == [("Topic", "gen-v2")]
    serving.rollback("gen-v2", v1)
    assert answered_by(llm) == [("Topic", "gen-v1")]
    serving.rollback("gen-v1", None)
    assert answered_by(llm) == []
    llm.close()
    plain.close()


def test_the_served_adapter_is_looked_up_at_most_every_adapter_check_s(standin: VLLMStandin, tmp_path: Path) -> None:
    base = standin.state.base_model
    llm = LlmExtractor(standin.url, base, api_key=KEY, use_served_adapter=True, adapter_check_s=3600)
    assert llm.served_model() == standin.state.base_model
    standin.state.loras["gen-v1"] = _adapter_dir(tmp_path, "v1")
    assert llm.served_model() == standin.state.base_model  # cached until adapter_check_s passes
    assert [p for m, p in standin.state.requests if p == "/v1/models"] == ["/v1/models"]
    llm.close()


def test_make_extractor_passes_the_served_adapter_setting() -> None:
    settings = VllmSettings(url="http://127.0.0.1:9", use_served_adapter=True, adapter_check_s=5)
    llm = make_extractor(ExtractorSettings(kind="llm"), settings)
    assert isinstance(llm, LlmExtractor)
    assert (llm._use_served_adapter, llm._adapter_check_s) == (True, 5)
    llm.close()


def _samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value, from Prometheus text (comments skipped)."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            found[series] = float(value)
    return found


def test_the_standin_exports_vllms_engine_metrics_counted_from_what_it_answered(standin: VLLMStandin) -> None:
    """The deploy scrapes every vLLM instance (deploy/monitoring.py): the stand-in answers with vLLM
    0.19.1's names and labels, not behind the key, and counts only the engine requests it answered."""
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=standin.url, timeout=10) as http:
        assert (
            http.post("/v1/embeddings", json={"input": ["one two three", "four"]}, headers=headers).status_code == 200
        )
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        assert http.post("/v1/chat/completions", json=chat, headers=headers).status_code == 200
        assert http.post("/v1/chat/completions", json={**chat, "model": "nope"}, headers=headers).status_code == 404
        answer = http.get("/metrics")  # no key: vLLM's /metrics is not behind --api-key
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    samples = _samples(answer.text)
    labels = f'engine="0",model_name="{standin.state.base_model}"'
    assert samples[f'vllm:request_success_total{{{labels},finished_reason="stop"}}'] == 2  # the 404 is not one
    assert samples[f"vllm:prompt_tokens_total{{{labels}}}"] == 4 + 1  # 4 words embedded, 1 chat prompt token
    assert samples[f"vllm:generation_tokens_total{{{labels}}}"] == 1
    assert samples[f"vllm:e2e_request_latency_seconds_count{{{labels}}}"] == 2
    assert samples[f'vllm:e2e_request_latency_seconds_bucket{{{labels},le="+Inf"}}'] == 2
    assert samples[f"vllm:num_requests_running{{{labels}}}"] == 0
    assert samples[f"vllm:num_requests_waiting{{{labels}}}"] == 0
    assert samples[f"vllm:kv_cache_usage_perc{{{labels}}}"] == 0
    # Buckets are cumulative and end at the count.
    buckets = [v for k, v in samples.items() if k.startswith("vllm:e2e_request_latency_seconds_bucket")]
    assert buckets == sorted(buckets) and buckets[-1] == 2


def test_a_scrape_is_answered_while_a_request_holds_the_standin(standin: VLLMStandin) -> None:
    """One request at a time holds the server: a scrape during it still answers, and counts it."""
    with standin.lock, standin.state.metrics.lock:
        standin.state.metrics.running = 1  # as a request holding the server has it
        standin.state.metrics.waiting = 3
    with standin.lock, httpx.Client(base_url=standin.url, timeout=5) as http:
        text = http.get("/metrics").text
    samples = _samples(text)
    labels = f'engine="0",model_name="{standin.state.base_model}"'
    assert samples[f"vllm:num_requests_running{{{labels}}}"] == 1
    assert samples[f"vllm:num_requests_waiting{{{labels}}}"] == 3
