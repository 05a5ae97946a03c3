"""One path to production: the local nodes run the operations a Hetzner deploy runs.

Both inventories are planned whole (deploy/roles.py) from fact fixtures of fresh Debian 13 servers,
node for node by role (db, index, gpu). The operations of the Hetzner plan that the local plan does
not have are printed, and must be exactly the reviewed list in docs/deploy.md ("One path"): the
GPU's driver and the GPU start, and the alert receiver's secret file. The reverse list — what only
the local nodes run — is the named vLLM stand-in and the nightly's CPU torch and tiny model,
reviewed the same way. Anything else
that differs must differ in data only (URLs, fingerprints, sha256s, versions), never in which
operations run.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from deploy.roles import everything
from deploy.settings import REPO
from tests.deploy.unit.plans import EXAMPLE, LOCAL, OPERATOR_DOWNLOADS, plan

DOCS = REPO / "docs" / "deploy.md"
PAIRS = {"mem-db": "node1", "mem-index": "node2", "mem-gpu": "node3"}


def reviewed(marker: str) -> set[str]:
    """The operation names listed under ``<!-- one-path: MARKER -->`` in docs/deploy.md."""
    text = DOCS.read_text()
    start = text.index(f"<!-- one-path: {marker} -->")
    block = text[start:].split("\n\n", 1)[0]
    return set(re.findall(r"^- `([^`]+)`", block, flags=re.MULTILINE))


@pytest.fixture
def production(inventory: Path) -> Path:
    """The Hetzner example as its operator completes it (tests/deploy/unit/conftest.py)."""
    return inventory


def differences(production: Path) -> tuple[set[str], set[str]]:
    only_production, only_local = set(), set()
    # inventory/local.yaml names the admin key `scripts/cluster up` generates: the operator's key
    # stands in for it, so that this plan needs no local nodes (a fresh clone's `-m "not deploy"`).
    admin = {"base": {"admin_keys": [str(Path(os.environ["HOME"]) / ".ssh" / "id_ed25519.pub")]}}
    for hetzner, local in PAIRS.items():
        remote = set(plan(everything, hetzner, facts=OPERATOR_DOWNLOADS, inventory=production).names())
        here = set(plan(everything, local, components=admin, inventory=LOCAL).names())
        only_production |= remote - here
        only_local |= here - remote
    return only_production, only_local


def test_the_local_nodes_run_every_production_operation_but_the_reviewed_ones(
    production: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    only_production, only_local = differences(production)
    with capsys.disabled():
        print("\nHetzner operations the local deploy does not run (docs/deploy.md, 'One path'):")
        for name in sorted(only_production):
            print(f"  - {name}")
        print("Local operations the Hetzner deploy does not run:")
        for name in sorted(only_local):
            print(f"  - {name}")
    assert only_production == reviewed("production-only"), "update the reviewed list in docs/deploy.md, or the deploy"
    assert only_local == reviewed("local-only"), "update the reviewed list in docs/deploy.md, or the deploy"
    # Only what a GPU changes: vLLM itself, what the night trains with on a node without one, and
    # what answers the GPU collector there; and the production receiver's secret files (the local
    # receiver is a webhook without one).
    receiver_secrets = {name for name in only_production if name.startswith("Monitoring | Receiver secret ")}
    nvidia_smi_standin = {"Monitoring | Render /usr/local/sbin/memoryctl-nvidia-smi-standin"}
    assert all(
        name.startswith(("vLLM | ", "Nightly LoRA cycle | "))
        for name in (only_production - receiver_secrets) | (only_local - nvidia_smi_standin)
    )


def test_production_slots_serve_the_base_under_the_configured_name(production: Path) -> None:
    """A stack that ran one ``vllm@embed`` keeps its recorded model (``http:BAAI/bge-m3``) and its
    collections when the embedding slots replace it: slot a serves the operator's download under
    the configured name, memoryctl.toml names the same, and both slots fit beside the generation
    server and the reranker on the GEX44's GPU (0.64 + 2 x 0.08 + 0.08)."""

    configured = yaml.safe_load(EXAMPLE.read_text())["components"]["vllm"]["embedding_model"]
    gpu = plan(everything, "mem-gpu", facts=OPERATOR_DOWNLOADS, inventory=production)
    db = plan(everything, "mem-db", facts=OPERATOR_DOWNLOADS, inventory=production)
    assert tomllib.loads(db.upload("/etc/memoryctl/memoryctl.toml"))["embedder"]["model"] == configured
    night = tomllib.loads(gpu.upload("/etc/memoryctl/memoryctl.toml"))["nightly"]
    base_link = night["embedding_base_model"]
    assert base_link.endswith("/BAAI--bge-m3")
    dropin = gpu.upload("/etc/systemd/system/vllm@embed-a.service.d/model-link.conf")
    assert f'[ "$$to" = "{base_link}" ] && name="{configured}"' in dropin
    shares = [
        float(re.findall(r"--gpu-memory-utilization ([0-9.]+)", gpu.upload(f"/etc/vllm/{unit}.args"))[0])
        for unit in ("generate", "embed-a", "embed-b", "rerank")
    ]
    assert shares == [0.64, 0.08, 0.08, 0.08] and sum(shares) <= 0.9
