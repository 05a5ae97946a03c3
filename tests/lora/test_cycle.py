"""The nightly cycle glue end to end on real (tiny) training, with promotion into the vLLM STAND-IN."""

from __future__ import annotations

from pathlib import Path

import pytest

from memoryctl.vllm import VLLMClient
from memoryctl_lora.config import LoraTrainingConfig
from memoryctl_lora.cycle import embedding_cycle, generation_cycle, promote_generation, rollback_generation
from memoryctl_lora.registry import AdapterRegistry
from memoryctl_lora.serving import AdapterServing
from tests.lora.conftest import Stopwatch
from tests.lora.synthetic import embedding_rows, generation_rows
from tests.lora.vllm_standin import StandinState, VLLMStandin

pytestmark = pytest.mark.lora


def test_skipped_when_too_little_data(tmp_path: Path) -> None:
    reg = AdapterRegistry(tmp_path / "reg")
    out = generation_cycle(
        generation_rows(10),
        registry=reg,
        workdir=tmp_path,
        config=LoraTrainingConfig.for_generation(base_model_path=str(tmp_path)),
    )
    assert out.status == "skipped" and "minimum 32" in out.reason and out.version is None
    assert out.to_record()["status"] == "skipped"
    emb = embedding_cycle([], registry=reg, workdir=tmp_path)
    assert emb.status == "skipped" and reg.list("embedding") == []


def test_the_generation_gate_wants_more_than_min_improvement() -> None:
    """Issue 42 item 5: ``min_improvement`` was only ever 0 here (ignoring it passed every test).
    Losses in binary fractions, so the boundary is exact."""
    from memoryctl_lora.evaluate import generation_gate

    assert generation_gate(1.0, 1.5, min_improvement=0.25).promote  # 0.5 better: more than the floor
    exact = generation_gate(1.25, 1.5, min_improvement=0.25)
    assert not exact.promote and "needed > 0.25" in exact.reason  # exactly the floor is not more
    assert not generation_gate(1.375, 1.5, min_improvement=0.25).promote  # better, within the floor
    assert generation_gate(1.375, 1.5).promote  # without a floor any improvement promotes


def test_the_generation_cycle_gates_with_the_configured_min_loss_improvement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A night whose held-out loss improves by less than ``min_loss_improvement`` (the deploy sets
    0.01: deploy/night.py) registers nothing. Training is
    replaced by its measured outcome: what is under test is which floor the cycle gates with."""
    from memoryctl_lora import train_generation
    from memoryctl_lora._common import TrainResult

    def trained(dataset: object, output_dir: Path | str, config: object, **kw: object) -> TrainResult:
        metrics = {"heldout_loss_after": 5.745, "heldout_loss_active": 5.75}  # 0.005 better
        return TrainResult(Path(output_dir), {"metrics": metrics})

    monkeypatch.setattr(train_generation, "train_generation_adapter", trained)
    reg = AdapterRegistry(tmp_path / "reg")
    floor = LoraTrainingConfig.for_generation(base_model_path=str(tmp_path), min_loss_improvement=0.01)
    out = generation_cycle(generation_rows(), registry=reg, workdir=tmp_path / "w", config=floor)
    assert out.status == "rejected" and "needed > 0.01" in out.reason, out.to_record()
    assert reg.list("generation") == []
    assert out.decision is not None and out.decision.metrics["min_improvement"] == 0.01


@pytest.mark.slow
def test_generation_cycle_promote_second_run_and_rollback(tmp_path: Path, timings: dict[str, float]) -> None:
    from memoryctl_lora.train_generation import build_tiny_qwen2

    base = build_tiny_qwen2(tmp_path / "base", seed=0)
    reg = AdapterRegistry(tmp_path / "reg")
    cfg = LoraTrainingConfig.for_generation(steps=60, lr=3e-2, batch_size=8, base_model_path=str(base))
    with (
        VLLMStandin(StandinState(base_model="tiny-qwen2")) as server,
        VLLMClient(server.url) as client,
    ):
        serving = AdapterServing(client, verify_attempts=2, verify_interval=0.01)
        with Stopwatch(timings, "cycle: generation train+gate+register"):
            first = generation_cycle(generation_rows(), registry=reg, workdir=tmp_path / "w1", config=cfg)
        assert first.status == "registered", first.reason
        assert first.version is not None and first.version.version == "v0001"
        with Stopwatch(timings, "cycle: hot swap into vLLM stand-in"):
            promote_generation(reg, first.version, serving)
        assert client.models().adapter_names() == {"memoryctl-generation-v0001"}
        assert reg.active("generation") == first.version

        # Second night, more steps on the same data: better held-out loss than the active adapter.
        second = generation_cycle(
            generation_rows(),
            registry=reg,
            workdir=tmp_path / "w2",
            config=cfg.model_copy(update={"steps": 120, "seed": 1}),
        )
        rec = second.to_record()
        assert rec["gate_metrics"]["active_heldout_loss"] == pytest.approx(
            first.train_metrics["heldout_loss_after"], abs=1e-5
        )
        assert second.status == "registered", second.reason
        assert second.version is not None
        promote_generation(reg, second.version, serving)
        assert client.models().adapter_names() == {"memoryctl-generation-v0002"}

        # A weak candidate (3 steps) is rejected and not registered; serving is untouched.
        weak = generation_cycle(
            generation_rows(), registry=reg, workdir=tmp_path / "w3", config=cfg.model_copy(update={"steps": 3})
        )
        assert weak.status == "rejected" and weak.version is None
        assert [v.version for v in reg.list("generation")] == ["v0001", "v0002"]

        # Rollback: v0001 served again, v0002 unloaded; then back to the bare base model.
        back = rollback_generation(reg, serving)
        assert back is not None and back.version == "v0001"
        assert client.models().adapter_names() == {"memoryctl-generation-v0001"}
        assert rollback_generation(reg, serving) is None
        assert client.models().adapter_names() == set() and reg.active("generation") is None


def test_failed_hot_swap_keeps_active_version(tmp_path: Path) -> None:
    """Promotion that fails in vLLM leaves both vLLM and the registry's active version as they were."""
    from tests.lora.test_registry import _adapter

    reg = AdapterRegistry(tmp_path / "reg")
    v1 = reg.register("generation", _adapter(tmp_path, "a", b"1"))
    v2 = reg.register("generation", _adapter(tmp_path, "b", b"2"))
    with VLLMStandin() as server, VLLMClient(server.url) as client:
        serving = AdapterServing(client, verify_attempts=1)
        promote_generation(reg, v1, serving)
        server.state.fail_next_load = True
        with pytest.raises(Exception, match="HTTP 500"):
            promote_generation(reg, v2, serving)
        assert reg.active("generation") == v1
        assert client.models().adapter_names() == {v1.served_name}


@pytest.mark.slow
def test_embedding_cycle_registers_then_rejects_a_regression(tmp_path: Path, timings: dict[str, float]) -> None:
    """Both gate outcomes, each decided by the seeded data and training (not accepted either way).

    1. 8 seeded steps on the nickname data teach what the base model lacks: held-out recall@1
       rises (0.60 -> 0.87 here), the adapter is registered.
    2. One step from the base model, gated against that active adapter, is a regression: rejected,
       nothing registered, the active version untouched.
    """
    reg = AdapterRegistry(tmp_path / "reg")
    split = {"recall_k": 1, "min_heldout": 8, "heldout_fraction": 0.25, "batch_size": 16, "max_seq_length": 48}
    good = LoraTrainingConfig.for_embedding(steps=8, lr=3e-3, seed=7, **split)
    with Stopwatch(timings, "cycle: embedding train 8 steps + gate + register"):
        out = embedding_cycle(embedding_rows(), registry=reg, workdir=tmp_path / "1", config=good)
    assert out.decision is not None and out.status == "registered", out.to_record()
    gm = out.decision.metrics
    assert gm["candidate_recall_at_k"] > gm["active_recall_at_k"]
    assert out.version is not None and out.version.model_id == "sentence-transformers/all-MiniLM-L6-v2+lora-v0001"
    reg.set_active("embedding", out.version.version)

    weak = LoraTrainingConfig.for_embedding(steps=1, lr=1e-3, seed=7, **split)
    again = embedding_cycle(embedding_rows(), registry=reg, workdir=tmp_path / "2", config=weak)
    assert again.decision is not None and again.status == "rejected", again.to_record()
    assert "regressed" in again.reason and again.version is None
    assert again.decision.metrics["candidate_recall_at_k"] < again.decision.metrics["active_recall_at_k"]
    assert [v.version for v in reg.list("embedding")] == [out.version.version]
    assert reg.active("embedding") == out.version


def test_the_embedding_gate_promotes_only_a_candidate_that_beats_the_served_model() -> None:
    """Issue 28: a night that does not beat the served model changes nothing. A candidate that only
    matches would swap the served model for an equal one and cost a migrate of every vector."""
    from memoryctl_lora.evaluate import embedding_gate_from_metrics

    def gate(candidate: float, active: float, min_improvement: float = 0.0) -> tuple[bool, str]:
        decision = embedding_gate_from_metrics(
            {"recall_at_k": candidate}, {"recall_at_k": active}, k=1, min_improvement=min_improvement
        )
        return decision.promote, decision.reason

    assert gate(0.781, 0.688) == (True, "recall@1 0.781 improves on active 0.688 (needed > +0.0)")
    assert gate(0.781, 0.781) == (False, "recall@1 0.781 does not beat active 0.781 by more than 0.0")
    assert gate(0.688, 0.781)[0] is False and "regressed" in gate(0.688, 0.781)[1]
    assert gate(0.75, 0.72, min_improvement=0.05)[0] is False  # better, but within the noise floor
    assert gate(0.80, 0.72, min_improvement=0.05)[0] is True
