"""``memoryctl health``'s nightly component: the last night's steps with their seconds, the adapter
registry's active versions next to what vLLM has loaded, in the text table and in ``--json``; and a
slow vLLM costs a note, not the component (issue 28 item 4).

Real PostgreSQL (the night's run record), the vLLM stand-in (tests/lora/vllm_standin.py: vLLM's
``/v1/models`` with adapter cards whose ``parent`` is the base model), and a registry made by
memoryctl-lora's own ``AdapterRegistry`` in a temporary directory.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memoryctl.cli import render
from memoryctl.config import load_settings
from memoryctl.health.nightly import nightly_probe
from memoryctl.health.probes import PROBE_TIMEOUT_S, run_probes
from memoryctl.maintenance.nightly import NightlyReport, StepOutcome
from memoryctl.maintenance.runs import recorded_run
from memoryctl.stack import Stack
from memoryctl.stores.schema import apply_schema
from tests.lora.vllm_standin import StandinState, VLLMStandin

pytestmark = pytest.mark.integration

HEALTH_DEADLINE_S = 1.8
BASE = "Qwen/Qwen2.5-7B-Instruct"


def _adapter(tmp: Path, name: str, payload: bytes, kind: str) -> Path:
    from memoryctl_lora.manifest import write_manifest

    d = tmp / name
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    (d / "adapter_model.safetensors").write_bytes(payload)
    write_manifest(d, {"kind": kind, "base_model_id": "tiny/base", "metrics": {}, "data_window": {}})
    return d


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    """Generation v0001 then v0002 promoted (v0001 is the rollback target), embedding v0001 promoted."""
    from memoryctl_lora.registry import AdapterRegistry

    root = tmp_path / "adapters"
    reg = AdapterRegistry(root)
    for i, payload in enumerate((b"one", b"two")):
        reg.set_active(
            "generation", reg.register("generation", _adapter(tmp_path, f"g{i}", payload, "generation")).version
        )
    reg.set_active("embedding", reg.register("embedding", _adapter(tmp_path, "e0", b"emb", "embedding")).version)
    return root


@pytest.fixture
def vllm() -> Iterator[VLLMStandin]:
    with VLLMStandin(StandinState(base_model=BASE)) as server:
        yield server


def _stack(pg_dsn: str, vllm_url: str, adapters_dir: Path) -> Stack:
    settings: dict[str, Any] = {
        "profile": "cluster",
        "postgres": {"dsn": pg_dsn},
        "embedder": {"kind": "hash"},
        "vllm": {"url": vllm_url, "model": BASE},
        "nightly": {"adapters_dir": str(adapters_dir)},
    }
    stack = Stack(load_settings(Path(os.devnull), **settings))
    apply_schema(stack.pool)
    return stack


def _record_night(stack: Stack) -> None:
    report = NightlyReport(
        steps=[
            StepOutcome("embedding", "rejected", {"reason": "recall@1 regressed: 0.500 < active 0.600"}, 30.25),
            StepOutcome("generation", "ok", {"swap": {"loaded": "memoryctl-generation-v0002"}}, 61.5),
            StepOutcome("reembed", "ok", {"scanned": 40, "changed": 3}, 2.0),
            StepOutcome("reconcile", "ok", {"drift": 0}, 1.25),
        ],
        seconds=95.0,
    )
    with recorded_run(stack.runs, "nightly") as rec:
        rec.details = report.as_dict()


def _nightly(stack: Stack) -> tuple[dict[str, Any], dict[str, Any]]:
    report = run_probes(
        {"nightly": lambda: nightly_probe(stack, timeout_s=PROBE_TIMEOUT_S)}, deadline_s=HEALTH_DEADLINE_S
    )
    as_json = json.loads(json.dumps(report.as_dict(), default=str))  # what --json prints
    return report.components["nightly"], as_json


def test_health_shows_the_night_and_the_served_adapters(
    pg_dsn: str, vllm: VLLMStandin, registry: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vllm.state.loras["memoryctl-generation-v0002"] = str(registry / "generation" / "v0002")
    stack = _stack(pg_dsn, vllm.url, registry)
    try:
        _record_night(stack)
        component, as_json = _nightly(stack)
        capsys.readouterr()
        render.health(as_json, {})
        text = capsys.readouterr().out
    finally:
        stack.close()
    assert component["status"] == "ok", component
    assert component["steps"] == "embedding=rejected generation=ok reembed=ok reconcile=ok"
    assert [(s["name"], s["seconds"]) for s in component["last_night"]["steps"]] == [
        ("embedding", 30.25),
        ("generation", 61.5),
        ("reembed", 2.0),
        ("reconcile", 1.25),
    ]
    adapters = as_json["components"]["nightly"]["adapters"]
    assert adapters["vllm_loaded"] == [{"id": "memoryctl-generation-v0002", "base": BASE}]
    generation, embedding = adapters["generation"], adapters["embedding"]
    assert (generation["active"], generation["previous"], generation["versions"]) == ("v0002", "v0001", 2)
    assert generation["served_name"] == "memoryctl-generation-v0002" and generation["loaded"] is True
    assert "note" not in generation
    assert (embedding["active"], embedding["previous"], embedding["versions"]) == ("v0001", None, 1)
    assert embedding["base_model"] == "tiny/base" and len(embedding["checksum"]) == 12
    # the text table: a row per step (status, seconds, why) and per adapter kind
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert any("embedding │ rejected │ │ 30.2 s; recall@1 regressed" in line for line in lines), text
    assert any("reconcile │ ok │ │ 1.2 s" in line for line in lines), text
    assert any(
        "generation adapter │ │ │ registry: active v0002 (previous v0001), 2 version(s); served:"
        " memoryctl-generation-v0002" in line
        for line in lines
    ), text


def test_an_active_adapter_vllm_forgot_gets_a_note(pg_dsn: str, vllm: VLLMStandin, registry: Path) -> None:
    """vLLM restarted: nothing loaded, the registry still says v0002."""
    stack = _stack(pg_dsn, vllm.url, registry)
    try:
        component, _ = _nightly(stack)
    finally:
        stack.close()
    assert component["status"] == "ok"  # a note, not a status
    assert component["detail"] == "no `memoryctl nightly` recorded yet"
    generation = component["adapters"]["generation"]
    assert generation["loaded"] is False
    assert "--serve-active" in generation["note"] and "memoryctl-generation-v0002" in generation["note"]
    assert component["adapters"]["vllm_loaded"] == []


def test_a_silent_vllm_costs_a_note_not_the_component(pg_dsn: str, registry: Path) -> None:
    """A vLLM that accepts the connection and never answers (a hung server)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        stack = _stack(pg_dsn, url, registry)
        try:
            _record_night(stack)
            component, _ = _nightly(stack)
        finally:
            stack.close()
    assert component["status"] == "ok", component  # not `timeout`: answered within the deadline, the night shown
    assert component["steps"] == "embedding=rejected generation=ok reembed=ok reconcile=ok"
    assert component["generation_adapter"] is None
    assert "vLLM did not answer" in component["generation_note"], component
    assert "vllm_loaded" not in component["adapters"]
    assert component["adapters"]["generation"]["active"] == "v0002"
    assert "loaded" not in component["adapters"]["generation"]  # unknown, not False


def test_without_a_registry_on_this_host(pg_dsn: str, vllm: VLLMStandin, tmp_path: Path) -> None:
    stack = _stack(pg_dsn, vllm.url, tmp_path / "nowhere")
    try:
        component, _ = _nightly(stack)
    finally:
        stack.close()
    adapters = component["adapters"]
    assert "no adapter registry on this host" in adapters["registry_note"]
    assert "generation" not in adapters and "embedding" not in adapters
