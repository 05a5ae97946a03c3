"""The nightly's embedding step where the embedder is an HTTP pooling server (the deployed stack:
vLLM 0.19.1 serving BGE-M3, which takes no LoRA): the promoted adapter becomes a merged model
version, served by the idle one of two embedding slots, and ``migrate`` moves the vectors to it
(verification, alias swap); ``migrate --rollback`` goes back to the old slot and collection.

The embedding servers are the vLLM STAND-IN (tests/lora/vllm_standin.py, ``--runner pooling`` on a
model directory: real embeddings through sentence-transformers) as separate processes, each one a
"unit" of the systemctl STAND-IN (tests/lora/standin_units.py) started by the same shell line the
deploy's unit would run (the served name is the linked directory's name). MiniLM plays BGE-M3: the
weights the servers serve and the nightly trains on. PostgreSQL, Qdrant, training, merge are real."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from memoryctl.client import MemoryClient
from memoryctl.config import Settings
from memoryctl.maintenance.adapters import list_adapters
from memoryctl.maintenance.embedding_version import wait_until_served
from memoryctl.maintenance.model_migration import run_model_migration
from memoryctl.maintenance.models import effective_embedder_settings
from memoryctl.maintenance.nightly import Nightly
from memoryctl.vllm import VLLMClient
from memoryctl_lora.night import open_registry, serve_merged
from tests.conftest import cluster_settings, write_cluster_config
from tests.integration.test_nightly import EMBEDDING_LORA, seed_useful_recalls
from tests.integration.test_nightly_gpu import LORA_TESTS, _free_port, _journal

pytest.importorskip("torch", reason="memoryctl-lora's torch is not installed")

pytestmark = [pytest.mark.integration, pytest.mark.lora, pytest.mark.slow]

BASE = "all-MiniLM-L6-v2"  # the served name of the base model: the directory's name
# The slot unit's command line: the model is the link, served under the linked directory's name.
SERVE = 'exec "$0" "$1" serve "$2" --served-model-name "$(basename "$(readlink "$2")")" --runner pooling --port "$3"'


def _embed(url: str, model: str, text: str) -> list[float]:
    with VLLMClient(url) as client:
        return list(client.embeddings(model, [text])["data"][0]["embedding"])


@dataclass
class TwoSlots:
    """A stack whose embedder is slot a of two embedding slots, both serving the base model."""

    client: MemoryClient
    settings: Settings
    a: str
    b: str
    models: Path  # [nightly] embedding_versions_dir; the base model is a symlink in it
    units: Path  # the systemctl stand-in's journal
    config: dict[str, Any]  # cluster_settings' keywords, for write_cluster_config (the CLI)


@contextmanager
def two_slots(pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path) -> Iterator[TwoSlots]:
    from memoryctl_lora.train_embedding import minilm_model_dir

    models, units = tmp_path / "models", tmp_path / "units"
    models.mkdir()
    units.mkdir()
    base = models / BASE
    base.symlink_to(minilm_model_dir(), target_is_directory=True)
    slots = []
    for name in ("embed-a", "embed-b"):
        port, link = _free_port(), tmp_path / f"{name}.model"
        link.symlink_to(base)
        argv = ["sh", "-c", SERVE, sys.executable, str(LORA_TESTS / "vllm_standin.py"), str(link), str(port)]
        (units / f"vllm@{name}.json").write_text(json.dumps({"argv": argv}))
        slots.append({"url": f"http://127.0.0.1:{port}", "link": str(link), "unit": f"vllm@{name}"})
    ctl = [sys.executable, str(LORA_TESTS / "standin_units.py"), "--dir", str(units)]
    subprocess.run([*ctl, "start", "vllm@embed-a", "vllm@embed-b"], check=True, timeout=60)
    a, b = slots[0]["url"], slots[1]["url"]
    nightly = {
        "generation": False,
        "adapters_dir": str(tmp_path / "adapters"),
        "embedding_lora": EMBEDDING_LORA,
        "embedding_base_model": str(base),
        "embedding_slots": slots,
        "embedding_versions_dir": str(models),
        "unit_command": ctl,
        "vllm_ready_s": 180.0,
    }
    config: dict[str, Any] = {
        "embedder": {"kind": "http", "url": a, "model": BASE},
        "nightly": nightly,
        "query": {"store_timeout_s": 30.0},
    }
    settings = cluster_settings(pg_dsn, neo4j_clean, tmp_path / "qdrant", **config)
    client = MemoryClient(settings)
    try:
        for url in (a, b):
            wait_until_served(settings, url, BASE)
        yield TwoSlots(client, settings, a, b, models, units, config)
    finally:
        subprocess.run([*ctl, "stop", "vllm@embed-a", "vllm@embed-b"], check=False, timeout=60)
        client.close()


def test_a_promoted_embedding_adapter_is_served_as_a_new_version_and_migrated_to(
    pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path
) -> None:
    with two_slots(pg_dsn, neo4j_clean, tmp_path) as stack:
        client, settings, a, b = stack.client, stack.settings, stack.a, stack.b
        models, units = stack.models, stack.units
        notes = seed_useful_recalls(client, datetime.now(UTC))
        before = client.stack.require_vectors().active_model()
        assert before is not None and before.model_id == f"http:{BASE}"
        probe = notes[0].text
        base_vector = _embed(a, BASE, probe)

        night = Nightly(client.stack).run()
        emb = {s.name: s for s in night.steps}["embedding"]
        assert not night.failed and emb.status == "ok", emb.detail
        gate = emb.detail["gate_metrics"]
        assert gate["candidate_recall_at_k"] > gate["active_recall_at_k"], gate
        version = f"{BASE}+lora-v0001"
        assert emb.detail["serve"]["slot"] == b and emb.detail["serve"]["served_name"] == version, emb.detail
        assert (models / version / "memoryctl-merged.json").is_file()  # the merged model directory
        journal = _journal(units)
        assert [line[:2] for line in journal[2:]] == [["restart", "vllm@embed-b"]]  # the active slot untouched
        migrate = emb.detail["migrate"]
        assert migrate["status"] == "swapped" and migrate["target"] == f"http:{version}", migrate
        assert migrate["verify"], migrate
        after = client.stack.require_vectors().active_model()
        assert after is not None and after.model_id == f"http:{version}"
        active = effective_embedder_settings(client.stack.pool, settings.embedder)
        assert (active.url, active.model) == (b, version)  # every process now embeds with the new version
        assert _embed(b, version, probe) != base_vector
        assert _embed(a, BASE, probe) == base_vector  # the old version still served, for a rollback
        found = client.query(text=probe, agent_id="a1", limit=3, decay=False)  # embedded by slot b
        assert found.degraded == [] and notes[0].id in [h.id for h in found.hits], found.degraded

        back = run_model_migration(client.stack, "rollback")
        assert back.status == "rolled-back" and back.target_model == f"http:{BASE}", back.as_dict()
        rolled = client.stack.require_vectors().active_model()
        assert rolled is not None and rolled.model_id == f"http:{BASE}"  # the old collection, kept
        assert effective_embedder_settings(client.stack.pool, settings.embedder).url == a
        # The adapter registry follows (the nightly's gate baseline, `memoryctl adapters embedding`).
        assert open_registry(settings).active("embedding") is None  # the base model's vectors again
        followed = back.adapter_registry
        assert followed is not None and followed["active"] is None, followed
        assert followed["changed"]["from"] == "v0001" and followed["changed"]["reason"] == "migrate --rollback"


def test_rollback_takes_the_adapter_registry_along_and_a_night_removes_superseded_versions(
    pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """`migrate --rollback` (twice: back, then forth again) and `adapters embedding --rollback` leave
    the registry's active embedding version the one in the aliased collection, recorded as rollbacks;
    with three promoted versions a successful night removes the oldest merged directory and its
    registry entry, keeping the active one and the one `--rollback` goes to; with nothing to roll
    back to, `migrate --rollback` says so (exit 2), no traceback."""
    from memoryctl.cli.main import _invoke

    def cli(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = _invoke(list(argv))
        out = capsys.readouterr()
        return code, out.out + out.err

    with two_slots(pg_dsn, neo4j_clean, tmp_path) as stack:
        client, settings, a, b, models = stack.client, stack.settings, stack.a, stack.b, stack.models
        cfg = write_cluster_config(tmp_path / "slots.toml", pg_dsn, neo4j_clean, tmp_path / "qdrant", **stack.config)
        monkeypatch.setenv("MEMORYCTL_CONFIG", str(cfg))
        vectors = client.stack.require_vectors

        def served() -> str | None:
            model = vectors().active_model()
            return model.model_id if model else None

        seed_useful_recalls(client, datetime.now(UTC))
        code, said = cli("migrate", "--rollback")
        assert code == 2 and "nothing to roll back to" in said and "Traceback" not in said, said

        night = Nightly(client.stack).run()
        assert {s.name: s.status for s in night.steps}["embedding"] == "ok", night.as_dict()
        registry = open_registry(settings)
        v1, v2, v3 = (f"{BASE}+lora-v000{n}" for n in (1, 2, 3))
        assert served() == f"http:{v1}" and registry.active("embedding").version == "v0001"  # type: ignore[union-attr]

        code, said = cli("migrate", "--rollback")
        assert code == 0, said
        assert served() == f"http:{BASE}" and registry.active("embedding") is None
        assert not any(v["active"] for v in list_adapters(settings, "embedding"))  # `memoryctl adapters embedding`
        code, said = cli("migrate", "--rollback")  # the rollback of the rollback: v0001 again
        assert code == 0, said
        assert served() == f"http:{v1}" and registry.active("embedding").version == "v0001"  # type: ignore[union-attr]
        back_and_forth = [(r["from"], r["to"], r["reason"]) for r in registry.rollbacks("embedding")]
        assert back_and_forth == [("v0001", None, "migrate --rollback"), (None, "v0001", "migrate --rollback")]

        # Two more promoted versions, made as a night makes them (the same adapter registered again):
        # merged, put on the idle slot, migrated to, set active.
        for slot in (a, b):
            version = registry.register("embedding", registry.get("embedding", "v0001").path)
            target, record = serve_merged(client.stack, version)
            assert record["slot"] == slot, record
            assert run_model_migration(client.stack, "migrate", target=target).status == "swapped"
            registry.set_active("embedding", version.version)
        client.stack.reload_embedder()
        assert served() == f"http:{v3}" and {d.name for d in models.iterdir()} == {BASE, v1, v2, v3}

        second = Nightly(client.stack).run()  # no new feedback: nothing trained, a successful night
        assert not second.failed, second.as_dict()
        pruned = second.as_dict()["pruned"]
        assert pruned["removed"] == [{"version": v1, "adapter": "v0001"}], pruned
        assert {k["version"]: k["why"] for k in pruned["kept"]} == {v2: "rollback target", v3: "active"}, pruned
        assert {d.name for d in models.iterdir()} == {BASE, v2, v3} and (models / BASE).is_symlink()
        assert [v.version for v in registry.list("embedding")] == ["v0002", "v0003"]

        code, said = cli("adapters", "embedding", "--rollback")  # the kept previous version is served again
        assert code == 0, said
        assert served() == f"http:{v2}" and registry.active("embedding").version == "v0002"  # type: ignore[union-attr]
        assert registry.rollbacks("embedding")[-1]["from"] == "v0003"
