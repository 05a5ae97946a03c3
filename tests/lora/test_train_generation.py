"""Real LoRA training of a tiny randomly initialised Qwen2 causal LM (built from a config, no download)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memoryctl.errors import ConfigError
from memoryctl_lora.config import LoraTrainingConfig
from memoryctl_lora.datasets import GenerationDataset, build_generation_dataset
from memoryctl_lora.evaluate import generation_gate
from memoryctl_lora.manifest import sha256_file, verify_adapter
from tests.lora.conftest import RESULTS, Stopwatch
from tests.lora.synthetic import generation_rows

pytestmark = pytest.mark.lora


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory, timings: dict[str, float]) -> Path:
    from memoryctl_lora.train_generation import build_tiny_qwen2

    with Stopwatch(timings, "generation: build tiny Qwen2 (hidden 64, 2 layers)"):
        return build_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2"), seed=0)


@pytest.fixture(scope="module")
def dataset() -> GenerationDataset:
    ds = build_generation_dataset(generation_rows(), min_examples=32, min_heldout=8, heldout_fraction=0.2)
    assert isinstance(ds, GenerationDataset)
    return ds


@pytest.fixture(scope="module")
def config() -> LoraTrainingConfig:
    return LoraTrainingConfig.for_generation(steps=60, lr=3e-2, batch_size=8, seed=1)


@pytest.fixture(scope="module")
def trained(
    base_dir: Path,
    dataset: GenerationDataset,
    config: LoraTrainingConfig,
    tmp_path_factory: pytest.TempPathFactory,
    timings: dict[str, float],
) -> Any:
    from memoryctl_lora.train_generation import train_generation_adapter

    with Stopwatch(timings, "generation: train 60 steps (incl. load + eval)"):
        result = train_generation_adapter(
            dataset, tmp_path_factory.mktemp("gen-adapter"), config, base_model_dir=base_dir
        )
    timings["generation: train function total (load+eval+train+save)"] = result.metrics["seconds"]["total"]
    timings["generation: train loop only (60 steps, batch 8)"] = result.metrics["seconds"]["train"]
    return result


def test_tiny_base_is_reproducible(base_dir: Path, tmp_path: Path) -> None:
    from memoryctl_lora.train_generation import build_tiny_qwen2

    again = build_tiny_qwen2(tmp_path, seed=0)
    assert sha256_file(again / "model.safetensors") == sha256_file(base_dir / "model.safetensors")
    cfg = json.loads((base_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["hidden_size"] == 64 and cfg["num_hidden_layers"] == 2


@pytest.mark.slow
def test_adapter_saved_heldout_loss_improves_and_gate_promotes(trained: Any, dataset: GenerationDataset) -> None:
    m = verify_adapter(trained.adapter_dir)
    assert m["kind"] == "generation" and m["config"]["target_modules"] is None
    adapter_cfg = json.loads((trained.adapter_dir / "adapter_config.json").read_text())
    assert sorted(adapter_cfg["target_modules"]) == ["q_proj", "v_proj"] and adapter_cfg["r"] == 8
    metrics = trained.metrics
    assert metrics["heldout_loss_after"] < metrics["heldout_loss_base"]
    decision = generation_gate(metrics["heldout_loss_after"], metrics["heldout_loss_active"])
    assert decision.promote, decision.reason
    RESULTS["generation: held-out loss base"] = metrics["heldout_loss_base"]
    RESULTS["generation: held-out loss adapter"] = metrics["heldout_loss_after"]
    assert not generation_gate(metrics["heldout_loss_base"], metrics["heldout_loss_after"]).promote


@pytest.mark.slow
def test_reload_gives_identical_outputs(
    trained: Any, base_dir: Path, dataset: GenerationDataset, timings: dict[str, float]
) -> None:
    import torch

    from memoryctl_lora.train_generation import load_generation_model

    with Stopwatch(timings, "generation: load base + adapter"):
        a = load_generation_model(base_dir, trained.adapter_dir)
    b = load_generation_model(base_dir, trained.adapter_dir)
    base = load_generation_model(base_dir)
    prompt = dataset.heldout[0].instruction
    assert torch.equal(a.logits(prompt), b.logits(prompt))
    assert not torch.allclose(a.logits(prompt), base.logits(prompt))
    assert a.generate(prompt, 24) == b.generate(prompt, 24)
    # The reloaded adapter reproduces the loss measured on the in-memory model at the end of training.
    assert a.heldout_loss(list(dataset.heldout)) == pytest.approx(trained.metrics["heldout_loss_after"], abs=1e-5)


@pytest.mark.slow
def test_second_run_is_gated_against_the_active_adapter(
    trained: Any, base_dir: Path, dataset: GenerationDataset, config: LoraTrainingConfig, tmp_path: Path
) -> None:
    from memoryctl_lora.train_generation import train_generation_adapter

    cfg = config.model_copy(update={"steps": 5, "seed": 2})
    second = train_generation_adapter(
        dataset, tmp_path, cfg, base_model_dir=base_dir, active_adapter_dir=trained.adapter_dir
    )
    assert second.metrics["heldout_loss_active"] == pytest.approx(trained.metrics["heldout_loss_after"], abs=1e-5)
    d = generation_gate(second.metrics["heldout_loss_after"], second.metrics["heldout_loss_active"])
    # 5 steps from scratch cannot beat 60 steps: the gate keeps the active adapter.
    assert not d.promote and d.metrics["improvement"] < 0


def test_training_is_deterministic(base_dir: Path, dataset: GenerationDataset, tmp_path: Path) -> None:
    from memoryctl_lora.train_generation import train_generation_adapter

    cfg = LoraTrainingConfig.for_generation(steps=4, lr=1e-2, batch_size=4, seed=5)
    r1 = train_generation_adapter(dataset, tmp_path / "a", cfg, base_model_dir=base_dir)
    r2 = train_generation_adapter(dataset, tmp_path / "b", cfg, base_model_dir=base_dir)
    assert r1.manifest["checksum"]["files"] == r2.manifest["checksum"]["files"]
    assert r1.metrics["heldout_loss_after"] == r2.metrics["heldout_loss_after"]


def test_missing_base_model_is_a_config_error(dataset: GenerationDataset, tmp_path: Path) -> None:
    from memoryctl_lora.train_generation import train_generation_adapter

    with pytest.raises(ConfigError, match="no generation base model"):
        train_generation_adapter(dataset, tmp_path, LoraTrainingConfig.for_generation())
    with pytest.raises(ConfigError, match="not a model directory"):
        train_generation_adapter(dataset, tmp_path, LoraTrainingConfig.for_generation(base_model_path=str(tmp_path)))
