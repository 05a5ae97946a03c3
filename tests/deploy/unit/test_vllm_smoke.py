"""deploy/node/vllm_smoke.py against the vLLM STAND-IN in this process (our own fake of vLLM's
OpenAI-compatible server): the requests the deploy's success depends on, and the failures that stop it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.lora.vllm_standin import StandinState, VLLMStandin

SCRIPT = Path(__file__).resolve().parents[3] / "deploy" / "node" / "vllm_smoke.py"


def _smoke() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_smoke", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["vllm_smoke"] = module
    spec.loader.exec_module(module)
    return module


smoke = _smoke()


def test_a_generation_server_answers_a_chat_and_one_per_loaded_adapter() -> None:
    state = StandinState(api_key="k", loras={"gen-v3": "/var/lib/memoryctl/adapters/gen-v3"})
    with VLLMStandin(state) as server:
        client = smoke.Client(server.url, "k")
        lines = smoke.smoke_unit(client, "generate", smoke.wait_ready(client, 5))
    assert lines == [
        "chat completion from Qwen/Qwen2.5-7B-Instruct (1 tokens)",
        "chat completion from gen-v3 (1 tokens)",
    ]


def test_an_embedding_server_answers_one_embedding() -> None:
    with VLLMStandin(StandinState(base_model="BAAI/bge-m3", embedding_dim=16)) as server:
        client = smoke.Client(server.url, None)
        assert smoke.smoke_unit(client, "embed", smoke.wait_ready(client, 5)) == ["embedding of 16 dimensions"]


def test_a_score_server_answers_one_score_per_passage() -> None:
    """vllm@rerank's smoke: vLLM's score API, one score for each of two passages."""
    state = StandinState(
        base_model="BAAI/bge-reranker-v2-m3", score=lambda q, ps: [0.9 - 0.5 * i for i in range(len(ps))]
    )
    with VLLMStandin(state) as server:
        client = smoke.Client(server.url, None)
        lines = smoke.smoke_unit(client, "score", smoke.wait_ready(client, 5))
    assert lines == ["scores from BAAI/bge-reranker-v2-m3: 0.900, 0.400"]


def test_a_server_without_the_score_api_fails_the_score_smoke() -> None:
    with VLLMStandin(StandinState(base_model="BAAI/bge-m3", embedding_dim=16)) as server:
        client = smoke.Client(server.url, None)
        with pytest.raises(smoke.SmokeFailure):
            smoke.smoke_unit(client, "score", smoke.wait_ready(client, 5))


def test_a_server_answering_500_fails_the_smoke_and_the_journal_is_shown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(smoke, "journal", lambda unit: f"last lines of {unit}\n")
    monkeypatch.setattr(smoke, "unit_failed", lambda unit: False)
    with VLLMStandin(StandinState(fail_requests=True)) as server:
        code = smoke.main(["smoke", "--unit", f"vllm@generate={server.url}:generate", "--timeout", "5"])
    err = capsys.readouterr().err
    assert code == 1
    assert "vllm@generate: FAILED:" in err and "/v1/chat/completions: HTTP 500" in err
    assert "--- journalctl -u vllm@generate -n 30 ---\nlast lines of vllm@generate" in err


def test_the_wait_is_bounded_reports_progress_and_ends_when_the_unit_fails() -> None:
    now = [0.0]
    said: list[str] = []
    client = smoke.Client("http://127.0.0.1:9", None)  # discard port: nothing answers

    def pause(seconds: float) -> None:
        now[0] += seconds

    with pytest.raises(smoke.SmokeFailure, match="not ready after 40 s"):
        smoke.wait_ready(client, 40, say=said.append, clock=lambda: now[0], pause=pause)
    assert len(said) == 2 and said[0].startswith("http://127.0.0.1:9: not ready yet, 16 s")
    with pytest.raises(smoke.SmokeFailure, match="the unit failed while starting"):
        smoke.wait_ready(client, 40, failed=lambda: True, clock=lambda: now[0], pause=pause)


def test_a_wrong_shape_is_refused() -> None:
    with VLLMStandin(StandinState()) as server:
        client = smoke.Client(server.url, None)
        with pytest.raises(smoke.SmokeFailure, match="no base model"):
            smoke.smoke_unit(client, "generate", [{"id": "gen-v3", "parent": "Qwen"}])
        with pytest.raises(smoke.SmokeFailure, match="does not exist"):
            smoke.chat(client, "no-such-model")


def test_the_lora_round_trip_loads_uses_and_unloads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = StandinState(api_key="k")
    (tmp_path / "vllm.env").write_text("VLLM_ALLOW_RUNTIME_LORA_UPDATING=True\nVLLM_API_KEY=k\n")
    adapter = tmp_path / "generation" / "v3"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    with VLLMStandin(state) as server:
        argv = ["lora", "--url", server.url, "--adapter", str(adapter), "--env", str(tmp_path / "vllm.env")]
        assert smoke.main(argv) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"lora: ok: loaded {adapter} as gpu-check",
        "lora: ok: chat completion from gpu-check (1 tokens)",
        "lora: ok: unloaded gpu-check",
    ]
    assert state.loras == {}
