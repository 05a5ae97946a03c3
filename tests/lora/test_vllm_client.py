"""memoryctl.vllm.VLLMClient and the adapter promotion (memoryctl_lora.serving) against the vLLM STAND-IN
(tests/lora/vllm_standin.py), a real HTTP server on 127.0.0.1. vLLM itself needs a GPU and is not available
in CI."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from memoryctl.errors import StoreError, StoreUnavailable
from memoryctl.vllm import VLLMClient
from memoryctl_lora.serving import AdapterRef, AdapterServing
from tests.lora.vllm_standin import StandinState, VLLMStandin

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
    with pytest.raises(StoreError, match="max_lora_rank"):
        client.load_lora_adapter("big", _adapter_dir(tmp_path, "big", rank=64))
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
