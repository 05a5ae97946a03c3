"""The nightly frees the GPU while the generation adapter trains (``[nightly] pause_units``) and
gives the node its vLLM back whatever happens, serving the adapter it served before.

vLLM is the STAND-IN (tests/lora/vllm_standin.py) running as its own process, and ``systemctl`` is
a stand-in over real processes (tests/lora/standin_units.py): stopping it really stops the server
(its runtime-loaded adapters are gone, as in vLLM), starting it really starts a fresh one. The
training is real (tiny Qwen2, CPU), so are PostgreSQL, the lock and the run record."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memoryctl.client import MemoryClient
from memoryctl.maintenance.gpu_pause import wait_until_ready
from memoryctl.maintenance.nightly import LOCK, Nightly
from memoryctl.maintenance.pgstate import OpsState
from memoryctl.model import Memory
from memoryctl.vllm import VLLMClient
from tests.conftest import cluster_settings, write_cluster_config

pytest.importorskip("torch", reason="memoryctl-lora's torch is not installed")

pytestmark = [pytest.mark.integration, pytest.mark.lora, pytest.mark.slow]

LORA_TESTS = Path(__file__).resolve().parents[1] / "lora"
UNIT = "vllm@generate"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _turns(start: datetime, step: timedelta, tag: str) -> list[Memory]:
    """Sixteen user/assistant pairs of ``tag`` (enough for a training set and a held-out slice), the
    k-th turn made at ``start + k * step``."""
    out = []
    for i in range(16):
        for j, (role, text) in enumerate(
            (("user", f"how do I restart service {tag}{i}?"), ("assistant", f"run systemctl restart {tag}{i}"))
        ):
            out.append(
                Memory(
                    agent_id="a1",
                    kind="dialogue",
                    created_at=start + (2 * i + j) * step,
                    text=text,
                    metadata={"role": role, "conversation_id": f"{tag}-{i}"},
                )
            )
    return out


def _journal(units: Path) -> list[list[str]]:
    return [line.split() for line in (units / "journal").read_text().splitlines()]


def test_the_gpu_is_freed_for_training_and_a_failed_night_serves_what_was_served(
    pg_dsn: str,
    neo4j_clean: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from memoryctl.cli.main import _invoke
    from memoryctl_lora.train_generation import build_tiny_qwen2

    base = tmp_path / "tiny-qwen"
    build_tiny_qwen2(base)
    port = _free_port()
    units = tmp_path / "units"
    units.mkdir()
    (units / f"{UNIT}.json").write_text(
        json.dumps(
            {
                "argv": [
                    sys.executable,
                    str(LORA_TESTS / "vllm_standin.py"),
                    "serve",
                    "Qwen/Qwen2.5-7B-Instruct",
                    "--port",
                    str(port),
                ],
                "env": {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
            }
        )
    )
    ctl = [sys.executable, str(LORA_TESTS / "standin_units.py"), "--dir", str(units)]
    subprocess.run([*ctl, "start", UNIT], check=True, timeout=60)
    url = f"http://127.0.0.1:{port}"
    nightly: dict[str, Any] = {
        "embedding": False,
        "generation_base_model": str(base),
        "adapters_dir": str(tmp_path / "adapters"),
        "generation_lora": {"steps": 20, "min_examples": 8, "min_heldout": 2},
        "pause_units": [UNIT],
        "unit_command": ctl,
        "vllm_ready_s": 120.0,
    }
    settings = cluster_settings(pg_dsn, neo4j_clean, tmp_path / "qdrant", vllm={"url": url}, nightly=nightly)
    client = MemoryClient(settings)
    try:
        with VLLMClient(url) as vllm:
            wait_until_ready(vllm, 120.0, interval_s=0.2)
        client.add(_turns(datetime.now(UTC) - timedelta(hours=1), timedelta(minutes=1), "a"), extract=False)

        first = Nightly(client.stack).run()
        gen = {s.name: s for s in first.steps}["generation"]
        assert not first.failed and gen.status == "ok", gen.detail
        pause = gen.detail["gpu_pause"]
        assert pause["units"] == [UNIT] and pause["stopped_at"] <= pause["started_at"], pause
        assert pause["restored"] == {"active": None, "loaded": False}  # nothing was served before
        (start0, stop1, start1) = _journal(units)
        assert (stop1[:2], start1[:2]) == (["stop", UNIT], ["start", UNIT])
        assert stop1[2] == start0[2] != start1[2]  # the server that trained beside it is gone: a new one
        served = gen.detail["swap"]["loaded"]
        with VLLMClient(url) as vllm:
            assert [a.id for a in vllm.models().adapters] == [served]
        night = client.health(deadline_s=30).components["nightly"]  # what an operator sees
        assert night["status"] == "ok" and night["generation_adapter"] == served, night
        assert night["steps"] == "embedding=skipped generation=ok reembed=ok reconcile=ok", night
        shown = {s["name"]: s for s in night["last_night"]["steps"]}
        assert shown["embedding"]["reason"] == "[nightly] embedding = false"
        assert shown["generation"]["figures"]["swap.loaded"] == served
        assert shown["generation"]["figures"]["gpu_pause.ready_s"] == pause["ready_s"]
        gate = gen.detail["gate_metrics"]
        assert shown["generation"]["figures"]["candidate_heldout_loss"] == gate["candidate_heldout_loss"]

        # A night whose training crashes (the base model's files are broken): the crash is the
        # run's outcome, and the restarted vLLM serves the adapter it served before.
        # made after the first night's window (which starts the second's), not in the future
        until = datetime.fromisoformat(str(first.window["until"]))
        client.add(_turns(until + timedelta(milliseconds=10), timedelta(milliseconds=10), "b"), extract=False)
        broken = tmp_path / "broken-qwen"
        broken.mkdir()
        (broken / "config.json").write_text("{ not json")
        crashed = cluster_settings(
            pg_dsn,
            neo4j_clean,
            tmp_path / "qdrant",
            vllm={"url": url},
            nightly={**nightly, "generation_base_model": str(broken)},
        )
        crash_client = MemoryClient(crashed)
        try:
            with pytest.raises(Exception) as crash:
                Nightly(crash_client.stack).run()
            assert "config" in str(crash.value).lower() or "json" in str(crash.value).lower(), crash.value
        finally:
            crash_client.close()
        stop2, start2 = _journal(units)[3:]
        assert (stop2[:2], start2[:2]) == (["stop", UNIT], ["start", UNIT]) and stop2[2] == start1[2] != start2[2]
        with VLLMClient(url) as vllm:
            assert [a.id for a in vllm.models().adapters] == [served]  # loaded again into the new server
        run = client.stack.runs.recent(command="nightly")[0]
        assert run["status"] == "failed", run
        night = client.health(deadline_s=30).components["nightly"]
        assert night["status"] == "degraded" and night["last_night_status"] == "failed", night
        assert night["error"].startswith("the last night failed: "), night
        assert night["generation_adapter"] == served  # the failed night left it served

        # vLLM restarted for another reason (a reboot): the unit's ExecStartPost loads it again
        subprocess.run([*ctl, "stop", UNIT], check=True, timeout=60)
        subprocess.run([*ctl, "start", UNIT], check=True, timeout=60)
        with VLLMClient(url) as vllm:
            wait_until_ready(vllm, 120.0, interval_s=0.2)
            assert vllm.models().adapters == ()
        night = client.health(deadline_s=30).components["nightly"]
        assert night["generation_adapter"] is None and "no adapter loaded" in night["generation_note"], night
        cfg = write_cluster_config(
            tmp_path / "gpu.toml", pg_dsn, neo4j_clean, tmp_path / "qdrant", vllm={"url": url}, nightly=nightly
        )
        monkeypatch.setenv("MEMORYCTL_CONFIG", str(cfg))
        assert _invoke(["adapters", "generation", "--serve-active"]) == 0
        with VLLMClient(url) as vllm:
            assert [a.id for a in vllm.models().adapters] == [served]
        assert _invoke(["adapters", "generation", "--serve-active"]) == 0  # idempotent
        assert _invoke(["adapters", "embedding", "--serve-active"]) != 0  # migrated, not loaded
        assert _invoke(["adapters", "generation", "--wait"]) != 0  # only with --serve-active
        assert "--wait is for --serve-active" in capsys.readouterr().err

        # The gpu node's memoryctl-adapter-serve unit runs this as vllm@generate starts (deploy/nightly.py):
        # it waits for vLLM to answer, up to [nightly] vllm_ready_s, then loads the adapter.
        subprocess.run([*ctl, "stop", UNIT], check=True, timeout=60)
        short = write_cluster_config(
            tmp_path / "short.toml",
            pg_dsn,
            neo4j_clean,
            tmp_path / "qdrant",
            vllm={"url": url},
            nightly={**nightly, "vllm_ready_s": 1.0},
        )
        monkeypatch.setenv("MEMORYCTL_CONFIG", str(short))
        assert _invoke(["adapters", "generation", "--serve-active", "--wait"]) != 0  # vLLM stays down
        assert "did not answer /health within 1 s" in capsys.readouterr().err
        # Nothing active (a fresh node): nothing to wait for, so vLLM being down is no failure.
        none_active = write_cluster_config(
            tmp_path / "none.toml",
            pg_dsn,
            neo4j_clean,
            tmp_path / "qdrant",
            vllm={"url": url},
            nightly={**nightly, "vllm_ready_s": 1.0, "adapters_dir": str(tmp_path / "no-adapters")},
        )
        monkeypatch.setenv("MEMORYCTL_CONFIG", str(none_active))
        assert _invoke(["adapters", "generation", "--serve-active", "--wait"]) == 0
        assert "no generation adapter is active" in capsys.readouterr().err
        monkeypatch.setenv("MEMORYCTL_CONFIG", str(cfg))
        subprocess.run([*ctl, "start", UNIT], check=True, timeout=60)
        # A night holds its lock: its own GPU pause restores the adapter, so the unit leaves it be.
        with OpsState(client.stack.pool).exclusive(LOCK) as got:
            assert got
            assert _invoke(["adapters", "generation", "--serve-active", "--wait"]) == 0
            assert "a night is running" in capsys.readouterr().err
            with VLLMClient(url) as vllm:
                assert vllm.models().adapters == ()
        assert _invoke(["adapters", "generation", "--serve-active", "--wait"]) == 0
        with VLLMClient(url) as vllm:
            assert [a.id for a in vllm.models().adapters] == [served]
    finally:
        subprocess.run([*ctl, "stop", UNIT], check=False, timeout=60)
        client.close()
