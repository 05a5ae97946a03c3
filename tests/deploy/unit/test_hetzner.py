"""The production path: ``inventory/hetzner.example.yaml`` planned as a new operator would run it.

A temporary home directory holds the keys the example names with ``~`` (expanded on the
controller); the sha256 the operator copies from Qdrant's release page is filled in. Then every
node's whole plan (deploy/roles.py) is built from fact fixtures of fresh Debian 12 servers, and
each property the production path needs is checked on it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

import pytest
import yaml

import deploy.wheelhouse
from deploy import versions
from deploy.artefacts import ArtefactSourceError
from deploy.neo4j import neo4j
from deploy.postgres import PostgresSettingsError, postgresql
from deploy.qdrant import qdrant
from deploy.roles import everything
from deploy.settings import REPO, load_inventory
from deploy.vllm import vllm
from tests.deploy.unit.plans import LOCAL, Plan, plan

EXAMPLE = REPO / "inventory" / "hetzner.example.yaml"
NODES = ("mem-db", "mem-index", "mem-gpu")
OPERATOR_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVvcGVyYXRvcmtleWZvcnRlc3Rpbmdvbmx5MTIzNDU2 operator@laptop"
RELEASE_SHA256 = "5" * 64


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The operator's home directory with the key pair the example names as ``~/.ssh/id_ed25519``."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("(the private key: never read at plan time)\n")
    (home / ".ssh" / "id_ed25519.pub").write_text(OPERATOR_KEY + "\n")
    monkeypatch.setenv("HOME", str(home))
    return home


def _example(tmp_path: Path, edit: Any = None) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    if edit is not None:
        edit(doc)
    path = tmp_path / "hetzner.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _fill_sha256(doc: dict[str, Any]) -> None:
    doc["components"]["qdrant"]["source"]["sha256"] = RELEASE_SHA256


@pytest.fixture
def inventory(tmp_path: Path, home: Path) -> Path:
    """The example as an operator completes it: the release's sha256 filled in."""
    return _example(tmp_path, _fill_sha256)


def _commands(p: Plan) -> list[str]:
    return [c for op in p.ops for c in op.commands]


@pytest.fixture
def plans(inventory: Path) -> dict[str, Plan]:
    return {name: plan(everything, name, inventory=inventory) for name in NODES}


def test_example_plans_clean_with_keys_from_the_operators_home(
    plans: dict[str, Plan], inventory: Path, home: Path
) -> None:
    assert all(p.ops for p in plans.values())
    host = load_inventory(inventory).host_data("mem-db")
    assert host["ssh_key"] == str(home / ".ssh" / "id_ed25519")  # `~` expanded on the controller
    for p in plans.values():
        admin = p.op("Admin user ops")
        assert any(OPERATOR_KEY in c for c in admin.commands), admin.commands


def test_a_missing_admin_key_is_named_at_plan_time(tmp_path: Path, home: Path) -> None:
    (home / ".ssh" / "id_ed25519.pub").unlink()
    with pytest.raises(ValueError, match=r"base.admin_keys: ~/.ssh/id_ed25519.pub .* cannot be read"):
        plan(everything, "mem-db", inventory=_example(tmp_path, _fill_sha256))


def test_the_placeholder_sha256_is_refused_before_anything_runs(tmp_path: Path, home: Path) -> None:
    with pytest.raises(ArtefactSourceError, match=r"'REPLACE-WITH-THE-RELEASE-SHA256' is not a sha256 .*release page"):
        plan(qdrant, "mem-index", inventory=EXAMPLE)

    def no_sha256(doc: dict[str, Any]) -> None:
        del doc["components"]["qdrant"]["source"]["sha256"]

    with pytest.raises(ArtefactSourceError, match=r"needs its sha256"):
        plan(qdrant, "mem-index", inventory=_example(tmp_path, no_sha256))


def test_versions_come_from_one_place_and_match_the_local_nodes(plans: dict[str, Plan]) -> None:
    download = plans["mem-index"].op("Download qdrant")
    url = (
        f"https://github.com/qdrant/qdrant/releases/download/v{versions.QDRANT}/qdrant-x86_64-unknown-linux-gnu.tar.gz"
    )
    joined = " ".join(download.commands)
    assert url in joined and RELEASE_SHA256 in joined, download.commands
    neo = " ".join(plans["mem-index"].op(f"Neo4j {versions.NEO4J} and Java 17").commands)
    assert f"neo4j=1:{versions.NEO4J}" in neo
    timescale = " ".join(plans["mem-db"].op(f"TimescaleDB {versions.TIMESCALEDB}").commands)
    pin = f"{versions.TIMESCALEDB}~debian12"
    assert (
        f"timescaledb-2-postgresql-17={pin}" in timescale and f"timescaledb-2-loader-postgresql-17={pin}" in timescale
    )
    # Neither inventory restates a version (the PostgreSQL major is a choice, not a pin).
    for path in (EXAMPLE, LOCAL):
        components = yaml.safe_load(path.read_text())["components"]
        assert [name for name, c in components.items() if "version" in c and name != "postgres"] == [], path
    # The local nodes' artefacts and the Maven build carry the same versions.
    local = yaml.safe_load(LOCAL.read_text())["components"]
    assert "{version}" in local["qdrant"]["source"]["artefact"] and "{version}" in local["neo4j"]["source"]["artefact"]
    pom = (REPO / "scripts" / "neo4j" / "pom.xml").read_text()
    assert f"<neo4j.version>{versions.NEO4J}</neo4j.version>" in pom


def test_postgres_major_is_a_setting(plans: dict[str, Plan], tmp_path: Path) -> None:
    db = plans["mem-db"]
    assert db.op("PostgreSQL | PostgreSQL").commands[-1].endswith("postgresql-17")
    assert "shared_preload_libraries = 'timescaledb'" in db.upload("/etc/postgresql/17/main/conf.d/memoryctl.conf")
    assert "Restart postgresql@17-main" in " ".join(db.names())
    local = plan(postgresql, "node1")
    assert local.op("PostgreSQL | PostgreSQL").commands[-1].endswith("postgresql-15")
    assert not any("pgdg" in name for name in local.names())

    def too_old(doc: dict[str, Any]) -> None:
        doc["components"]["postgres"]["version"] = 14

    with pytest.raises(PostgresSettingsError, match=r"TimescaleDB 2\.28\.3 supports PostgreSQL 15, 16, 17, 18"):
        plan(postgresql, "mem-db", inventory=_example(tmp_path, too_old))


@pytest.mark.parametrize(
    ("node", "name", "line"),
    [
        ("mem-db", "pgdg", "https://apt.postgresql.org/pub/repos/apt bookworm-pgdg main"),
        ("mem-db", "timescaledb", "https://packagecloud.io/timescale/timescaledb/debian/ bookworm main"),
        ("mem-index", "neo4j", "https://debian.neo4j.com stable 5"),
    ],
)
def test_third_party_repositories_are_signed_by_their_own_dearmored_key(
    plans: dict[str, Plan], node: str, name: str, line: str
) -> None:
    p = plans[node]
    keyring = f"/etc/apt/keyrings/{name}.gpg"
    key = " ".join(p.op(f"{name} apt key (dearmored keyring)").commands)
    assert "gpg" in key and "--dearmor" in key and keyring in key, key
    repo = " ".join(p.op(f"{name} apt repository").commands)
    assert f"deb [signed-by={keyring}] {line}" in repo and f"/etc/apt/sources.list.d/{name}.list" in repo
    assert p.op(f"Refresh apt lists ({name} added)").conditional


def test_no_plan_uses_apt_key(plans: dict[str, Plan]) -> None:
    for name, p in plans.items():
        assert not [c for c in _commands(p) if "apt-key" in c], name


def test_one_shot_steps_are_checked_every_run(inventory: Path) -> None:
    """Installed packages, but what their first run should have done is missing: planned again."""
    neo = plan(neo4j, "mem-index", {"DebPackages": {"neo4j": {f"1:{versions.NEO4J}"}}}, inventory=inventory)
    assert not neo.op("Initial neo4j password").conditional
    pin = f"{versions.TIMESCALEDB}~debian12"
    packages = {
        "postgresql-17": {"17.7"},
        "timescaledb-2-postgresql-17": {pin},
        "timescaledb-2-loader-postgresql-17": {pin},
    }
    facts = {"DebPackages": packages, "Users": {"postgres": {}}, "PostgresRoles": {"memoryctl": {}}}
    pg = plan(
        postgresql,
        "mem-db",
        {**facts, "PostgresExtensions": {}, "PostgresPreloaded": ["timescaledb"]},
        inventory=inventory,
    )
    assert not pg.op("TimescaleDB extension").conditional
    marker = f"/opt/qdrant/{versions.QDRANT}/.memoryctl-installed"
    installed = plan(
        qdrant, "mem-index", {"File": lambda path, **_: {"mode": 644} if path == marker else None}, inventory=inventory
    )
    assert not any("Download qdrant" in name or "Unpack" in name for name in installed.names())


def test_the_wheelhouse_is_built_for_the_nodes_platform_whatever_the_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller on another OS, architecture and Python still fetches Debian 12 / CPython 3.11 /
    x86_64 wheels; only the pure-Python memoryctl wheel is built locally."""
    commands: list[list[str]] = []
    real_run = subprocess.run

    def run(command: list[str], *args: Any, **kwargs: Any) -> Any:
        if command[:3] != [sys.executable, "-m", "pip"]:
            return real_run(command, *args, **kwargs)  # git archive, tar: the real source export
        commands.append(command)
        if command[3] == "wheel":
            (Path(command[command.index("--wheel-dir") + 1]) / "memoryctl-0.1.0-py3-none-any.whl").write_bytes(b"w")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(deploy.wheelhouse.subprocess, "run", run)
    monkeypatch.setattr(sys, "platform", "darwin")
    deploy.wheelhouse._build(tmp_path / "wheelhouse")
    build, download = commands
    assert build[3] == "wheel" and "--no-deps" in build
    assert download[3] == "download" and "--only-binary=:all:" in download and download[-1] == "memoryctl"
    platforms = [download[i + 1] for i, arg in enumerate(download) if arg == "--platform"]
    assert platforms[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in platforms
    assert "manylinux2014_x86_64" in platforms and not [p for p in platforms if "macosx" in p or "aarch64" in p]
    assert download[download.index("--python-version") + 1] == "3.11"
    assert download[download.index("--implementation") + 1] == "cp"
    assert [download[i + 1] for i, arg in enumerate(download) if arg == "--abi"] == ["cp311", "abi3", "none"]


def test_the_gpu_node_gets_its_driver_once_and_vllm_in_a_venv(inventory: Path) -> None:
    p = plan(vllm, "mem-gpu", inventory=inventory)
    assert any("python3 -m venv /opt/vllm/venv" in c for c in p.op("Python venv (venv module)").commands)
    sources = p.upload("/etc/apt/sources.list.d/debian-non-free.sources")
    assert "Components: contrib non-free non-free-firmware" in sources
    driver = " ".join(p.op("NVIDIA driver (non-free)").commands)
    assert all(pkg in driver for pkg in ("nvidia-driver", "linux-headers-amd64", "firmware-misc-nonfree"))
    assert all(
        pkg in " ".join(p.op("C compiler and Python headers").commands) for pkg in ("build-essential", "python3-dev")
    )
    assert any(
        f"vllm=={versions.VLLM}" in c and "/opt/vllm/venv/bin/pip" in c for c in p.op(f"vLLM {versions.VLLM}").commands
    )
    names = p.names()
    reboot = names.index("vLLM | Reboot to load the NVIDIA driver (once: it is not loaded yet)")
    assert names.index(next(n for n in names if "NVIDIA driver (non-free)" in n)) < reboot
    assert reboot < names.index("vLLM | Render /etc/vllm/vllm.env")
    loaded = plan(
        vllm,
        "mem-gpu",
        {"NvidiaDriver": "NVRM version: NVIDIA UNIX x86_64 Kernel Module 535.216.01"},
        inventory=inventory,
    )
    assert not any("Reboot" in name for name in loaded.names())


def test_without_leave_to_reboot_the_gpu_node_stops_and_says_why(tmp_path: Path, home: Path) -> None:
    def no_reboot(doc: dict[str, Any]) -> None:
        _fill_sha256(doc)
        doc["components"]["vllm"]["gpu"]["reboot"] = False

    p = plan(vllm, "mem-gpu", inventory=_example(tmp_path, no_reboot))
    stop = p.op("Stop: the NVIDIA driver needs a reboot")
    assert "reboot the node, then deploy again" in stop.commands[0] and stop.commands[0].endswith("exit 1")
    assert not any(name.endswith("Reboot to load the NVIDIA driver (once: it is not loaded yet)") for name in p.names())


def test_vllm_models_fit_the_gex44(inventory: Path) -> None:
    """Both instances share one 20 GB GPU (docs/deploy.md has the arithmetic)."""
    p = plan(vllm, "mem-gpu", inventory=inventory)
    generate, embed = p.upload("/etc/vllm/generate.args"), p.upload("/etc/vllm/embed.args")
    assert "MODEL=Qwen/Qwen2.5-7B-Instruct-AWQ" in generate and "MODEL=BAAI/bge-m3" in embed
    shares = [
        float(share) for args in (generate, embed) for share in re.findall(r"--gpu-memory-utilization ([0-9.]+)", args)
    ]
    assert len(shares) == 2 and sum(shares) <= 0.9, shares  # room for two CUDA contexts
    assert "--max-model-len 8192" in generate and "--max-lora-rank 16" in generate and "--max-loras 2" in generate


def test_pyinfra_is_pinned_to_the_tested_range() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"pyinfra>=3.10,<3.11"' in pyproject
    major, minor = (int(x) for x in installed_version("pyinfra").split(".")[:2])
    assert (major, minor) == (3, 10)
