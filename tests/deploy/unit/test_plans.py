"""Operation plans from fact fixtures, in pairs: what a fresh node gets, and the no-op on a node
that already has it. Rendered files are validated with their own tools where the host has them."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

import deploy.memoryctl
from deploy.firewall import firewall
from deploy.memoryctl import memoryctl
from deploy.neo4j import neo4j
from deploy.postgres import postgresql
from deploy.qdrant import qdrant
from deploy.vllm import vllm
from deploy.wireguard import wireguard
from tests.deploy.unit.plans import Plan, plan


def _present(uploads: Plan, services: list[str], packages: list[str]) -> dict[str, Any]:
    """Facts of a node that already has everything ``uploads`` would write."""
    files = {dest: content for op in uploads.ops for dest, content in op.uploads.items()}
    attributes: dict[str, dict[str, Any]] = {path: {"mode": 644, "user": "root", "group": "root"} for path in files}
    for command in (c for op in uploads.ops for c in op.commands):
        words = command.split()
        if words[0] == "chmod" and words[-1] in attributes:
            attributes[words[-1]]["mode"] = int(words[1])
        if words[0] == "chown" and words[-1] in attributes:
            user, _, group = words[1].partition(":")
            attributes[words[-1]].update(user=user, group=group or None)
    return {
        "File": lambda path, **_: attributes.get(path),
        "Sha1File": lambda path, **_: hashlib.sha1(files[path].encode()).hexdigest() if path in files else None,
        "DebPackages": {p: {"1.0"} for p in packages},
        "SystemdStatus": {f"{s}.service": True for s in services},
        "SystemdEnabled": {f"{s}.service": True for s in services},
        "Directory": {"mode": 755, "user": "root", "group": "root"},
    }


def _no_commands(p: Plan) -> None:
    assert p.changing() == [], p.changing()


# -- firewall -------------------------------------------------------------------------------------


def test_firewall_plan_and_no_op() -> None:
    fresh = plan(firewall, "node1")
    rules = fresh.upload("/etc/nftables.conf")
    assert "policy drop" in rules and "tcp dport { 5432 }" in rules
    assert fresh.op("Check the ruleset").conditional
    again = plan(firewall, "node1", _present(fresh, ["nftables"], ["nftables"]))
    _no_commands(again)


@pytest.mark.parametrize("node", ["node1", "node2", "node3"])
def test_nftables_ruleset_is_valid(node: str, tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("unshare") is None:
        pytest.skip("needs root and nft (checked in a throwaway network namespace)")
    path = tmp_path / "nftables.conf"
    path.write_text(plan(firewall, node).upload("/etc/nftables.conf"))
    subprocess.run(["unshare", "--net", "nft", "-c", "-f", str(path)], check=True)


def test_index_node_opens_qdrant_and_neo4j_on_the_mesh_only() -> None:
    rules = plan(firewall, "node2").upload("/etc/nftables.conf")
    line = next(line for line in rules.splitlines() if "services over the mesh" in line)
    assert 'iifname "wg0"' in line and "{ 6333, 6334, 6335, 7474, 7687 }" in line


# -- wireguard ------------------------------------------------------------------------------------


def test_wireguard_config_is_mode_0600_with_two_peers() -> None:
    fresh = plan(wireguard, "node1")
    op = fresh.op("Render /etc/wireguard/wg0.conf")
    assert "chmod 600 /etc/wireguard/wg0.conf" in op.commands
    conf = fresh.upload("/etc/wireguard/wg0.conf")
    assert conf.count("[Peer]") == 2
    assert "Address = 10.77.0.1/24" in conf
    sync = fresh.op("without dropping it")
    assert sync.conditional and "wg syncconf wg0 <(wg-quick strip wg0)" in sync.commands[0]


def test_wireguard_keys_are_reused_between_runs() -> None:
    first = plan(wireguard, "node1").upload("/etc/wireguard/wg0.conf")
    second = plan(wireguard, "node1").upload("/etc/wireguard/wg0.conf")
    assert first == second


# -- postgres -------------------------------------------------------------------------------------


def test_postgres_fresh_node_creates_role_with_hidden_password(secrets_dir: Path) -> None:
    fresh = plan(postgresql, "node1")
    conf = fresh.upload("/etc/postgresql/15/main/conf.d/memoryctl.conf")
    assert "listen_addresses = 'localhost,10.77.0.1'" in conf
    assert "shared_preload_libraries" not in conf  # TimescaleDB is off on the local nodes
    first_install = fresh.op("first install")
    password = (secrets_dir / "postgres" / "memoryctl").read_text().strip()
    assert password not in " ".join(first_install.commands)
    hba = fresh.upload("/etc/postgresql/15/main/pg_hba.conf")
    assert "10.77.0.0/24" in hba and "0.0.0.0/0" not in hba


def test_postgres_existing_node_uses_fact_driven_role() -> None:
    facts = {
        "Users": {"postgres": {}},
        "PostgresRoles": {"memoryctl": {"login": True}},
        "PostgresDatabases": {"memoryctl": {"owner": "memoryctl", "encoding": "UTF8"}},
    }
    existing = plan(postgresql, "node1", facts)
    assert existing.op("Role memoryctl").commands == []
    assert existing.op("Database memoryctl").commands == []


def test_postgres_with_timescaledb_plans_repo_package_and_preload() -> None:
    p = plan(postgresql, "node1", components={"timescaledb": {"enabled": True}})
    assert "timescaledb apt repository" in " ".join(p.names())
    assert any("timescaledb-2-postgresql-15" in c for c in p.op("PostgreSQL | TimescaleDB").commands)
    assert "shared_preload_libraries = 'timescaledb'" in p.upload("/etc/postgresql/15/main/conf.d/memoryctl.conf")
    assert p.op("TimescaleDB extension").conditional


# -- qdrant ---------------------------------------------------------------------------------------

QDRANT_URL = {"url": "https://example.invalid/qdrant.tar.gz", "sha256": "0" * 64}


def test_qdrant_without_source_installs_nothing() -> None:
    assert plan(qdrant, "node2").ops == []


def test_qdrant_from_url_downloads_verifies_and_binds_to_mesh(secrets_dir: Path) -> None:
    p = plan(qdrant, "node2", components={"qdrant": {"source": QDRANT_URL}})
    download = p.op("Download qdrant")
    assert any("0" * 64 in c for c in download.commands)
    config = yaml.safe_load(p.upload("/etc/qdrant/config.yaml"))
    assert config["service"]["host"] == "10.77.0.2"
    assert config["service"]["api_key"] == (secrets_dir / "qdrant" / "api_key").read_text().strip()
    assert p.op("Restart qdrant").conditional


def test_qdrant_from_local_file(tmp_path: Path) -> None:
    archive = tmp_path / "qdrant.tar.gz"
    archive.write_bytes(b"not really")
    p = plan(qdrant, "node2", components={"qdrant": {"source": {"file": str(archive)}}})
    assert p.op("Upload qdrant").commands


def test_qdrant_source_is_validated() -> None:
    with pytest.raises(ValueError, match="sha256"):
        plan(qdrant, "node2", components={"qdrant": {"source": {"url": "https://example.invalid/q"}}})


# -- neo4j / vllm ---------------------------------------------------------------------------------


def test_neo4j_plan_binds_to_mesh_and_hides_password(secrets_dir: Path) -> None:
    p = plan(neo4j, "node2", components={"neo4j": {"enabled": True}})
    conf = p.upload("/etc/neo4j/neo4j.conf")
    assert "server.bolt.listen_address=10.77.0.2:7687" in conf
    assert "server.memory.heap.max_size=512m" in conf
    password = (secrets_dir / "neo4j" / "password").read_text().strip()
    assert password not in " ".join(p.op("Initial neo4j password").commands)


def test_vllm_plan_two_instances_with_lora(secrets_dir: Path) -> None:
    p = plan(vllm, "node3", components={"vllm": {"enabled": True, "source": "vllm==0.6.6"}})
    generate = p.upload("/etc/vllm/generate.args")
    assert "--enable-lora" in generate and "MODEL=Qwen/Qwen2.5-7B-Instruct" in generate
    assert "--task embed" in p.upload("/etc/vllm/embed.args")
    env = p.upload("/etc/vllm/vllm.env")
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in env
    assert "--host 10.77.0.3" in p.upload("/etc/systemd/system/vllm@.service")


def test_disabled_components_plan_nothing() -> None:
    assert plan(neo4j, "node2").ops == []
    assert plan(vllm, "node3").ops == []


# -- units ----------------------------------------------------------------------------------------


def _verify_unit(tmp_path: Path, name: str, content: str, executables: list[str]) -> None:
    """``systemd-analyze verify`` in a scratch root holding the unit and stand-in executables."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed")
    root = tmp_path / "root"
    # The distribution's units (targets the unit depends on), as on a node.
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "lib").symlink_to("usr/lib")
    for exe in executables:
        stub = root / exe.lstrip("/")
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    unit = root / "etc/systemd/system" / name
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(content)
    result = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    problems = [line for line in result.stderr.splitlines() if name.split("@")[0] in line]
    assert result.returncode == 0 and not problems, result.stderr


def test_qdrant_unit_verifies(tmp_path: Path) -> None:
    p = plan(qdrant, "node2", components={"qdrant": {"source": QDRANT_URL}})
    _verify_unit(tmp_path, "qdrant.service", p.upload("/etc/systemd/system/qdrant.service"), ["/opt/qdrant/qdrant"])


def test_vllm_unit_verifies(tmp_path: Path) -> None:
    p = plan(vllm, "node3", components={"vllm": {"enabled": True}})
    unit = p.upload("/etc/systemd/system/vllm@.service")
    _verify_unit(tmp_path, "vllm@generate.service", unit, ["/opt/vllm/venv/bin/vllm"])


# -- memoryctl ------------------------------------------------------------------------------------


@pytest.fixture
def no_wheel_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """No wheels are built; the wheelhouse directory exists (empty), as files.sync checks it."""

    def ensure_wheelhouse(path: Path) -> str:
        path.mkdir(parents=True, exist_ok=True)
        return "digest"

    monkeypatch.setattr(deploy.memoryctl, "ensure_wheelhouse", ensure_wheelhouse)


def test_memoryctl_config_matches_the_settings_model(no_wheel_build: None, tmp_path: Path) -> None:
    text = plan(memoryctl, "node1").upload("/etc/memoryctl/memoryctl.toml")
    data = tomllib.loads(text)
    assert data["postgres"]["dsn"] == "postgresql://memoryctl@10.77.0.1:5432/memoryctl"
    assert data["neo4j"]["uri"] == "bolt://10.77.0.2:7687"
    config = pytest.importorskip("memoryctl.config")
    path = tmp_path / "memoryctl.toml"
    path.write_text(text)
    settings = config.load_settings(path)
    assert settings.profile == "cluster"
    assert settings.embedder.kind == "http"


def test_memoryctl_install_runs_only_when_the_wheelhouse_changed(no_wheel_build: None) -> None:
    fresh = plan(memoryctl, "node1")
    install = fresh.op("Install memoryctl from the wheelhouse")
    assert any("--no-index --find-links /opt/memoryctl/wheelhouse" in c for c in install.commands)
    installed = plan(memoryctl, "node1", {"FileContents": lambda path, **_: ["digest"]})
    assert "Install memoryctl from the wheelhouse" not in " ".join(installed.names())


def test_memoryctl_cron_locks_and_logs(no_wheel_build: None) -> None:
    cron = plan(memoryctl, "node1").upload("/etc/cron.d/memoryctl")
    jobs = [line for line in cron.splitlines() if "/opt/memoryctl/venv/bin/memoryctl" in line]
    assert len(jobs) == 3
    for line in jobs:
        fields = line.split()
        assert fields[5] == "memoryctl" and fields[6:8] == ["flock", "-n"]
        assert line.endswith(".log 2>&1")


def test_memoryctl_serve_unit_on_the_mesh_and_restart_gating(no_wheel_build: None, tmp_path: Path) -> None:
    fresh = plan(memoryctl, "node1")
    unit = fresh.upload("/etc/systemd/system/memoryctl-serve.service")
    assert "ExecStart=/opt/memoryctl/venv/bin/memoryctl serve" in unit
    assert "User=memoryctl" in unit and "Environment=MEMORYCTL_CONFIG=/etc/memoryctl/memoryctl.toml" in unit
    assert "RuntimeDirectory=memoryctl" in unit and "ReadWritePaths=/var/lib/memoryctl /var/log/memoryctl" in unit
    text = fresh.upload("/etc/memoryctl/memoryctl.toml")
    serve = tomllib.loads(text)["serve"]
    assert serve == {"socket": "/run/memoryctl/serve.sock", "http": "10.77.0.1:8765", "required": True}
    # the rendered section is valid for the service: a mesh address, never every interface
    config = pytest.importorskip("memoryctl.config")
    server = pytest.importorskip("memoryctl.serve.server")
    path = tmp_path / "memoryctl.toml"
    path.write_text(text)
    settings = config.load_settings(path)
    assert server.parse_bind(settings.serve.http) == ("10.77.0.1", 8765)
    assert settings.serve_socket == Path("/run/memoryctl/serve.sock") and settings.serve.required
    assert fresh.op("Reload systemd units").conditional
    assert fresh.op("Restart memoryctl-serve").conditional
    assert fresh.op("memoryctl-serve running and enabled").commands
    # a node that has the unit running, enabled and the same files: nothing changes
    present = _present(fresh, ["memoryctl-serve"], ["python3-venv", "cron", "logrotate", "util-linux"])
    again = plan(memoryctl, "node1", {**present, "FileContents": lambda path, **_: ["digest"]})
    assert not again.op("memoryctl-serve running and enabled").commands
