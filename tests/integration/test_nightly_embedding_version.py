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
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memoryctl.client import MemoryClient
from memoryctl.ops.embedding_version import wait_until_served
from memoryctl.ops.model_migration import run_model_migration
from memoryctl.ops.models import effective_embedder_settings
from memoryctl.ops.nightly import Nightly
from memoryctl.vllm import VLLMClient
from tests.conftest import cluster_settings
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


def test_a_promoted_embedding_adapter_is_served_as_a_new_version_and_migrated_to(
    pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path
) -> None:
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
    settings = cluster_settings(
        pg_dsn,
        neo4j_clean,
        tmp_path / "qdrant",
        embedder={"kind": "http", "url": a, "model": BASE},
        nightly=nightly,
        query={"store_timeout_s": 30.0},
    )
    client = MemoryClient(settings)
    try:
        for url in (a, b):
            wait_until_served(settings, url, BASE)
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
    finally:
        subprocess.run([*ctl, "stop", "vllm@embed-a", "vllm@embed-b"], check=False, timeout=60)
        client.close()
