"""The deployed cluster, verified on the three local nodes over SSH (pytest-testinfra)."""

from __future__ import annotations

import json
import socket
import tomllib

import pytest

from tests.deploy.cluster import MESH, NODES, node
from tests.deploy.conftest import Deployed
from wireguard.facts import WireguardInterface

pytestmark = pytest.mark.deploy


def _listening(name: str) -> set[tuple[str, int]]:
    """(address, port) pairs from ``ss -ltnH`` on a node."""
    pairs = set()
    for line in node(name).check_output("ss -ltnH").splitlines():
        local = line.split()[3]
        address, _, port = local.rpartition(":")
        pairs.add((address.strip("[]"), int(port)))
    return pairs


def _reachable(address: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def test_second_deploy_changes_nothing(deployed: Deployed) -> None:
    second = deployed.second
    assert second.returncode == 0 and second.errors == 0
    assert second.operations > 0, "could not read pyinfra's results table"
    assert second.changed == 0, f"second run changed: {second.changed_operations()}"
    assert second.unchanged == second.operations


@pytest.mark.parametrize("name", list(NODES))
def test_mesh_peers_and_handshakes(deployed: Deployed, name: str) -> None:
    host = node(name)
    fact = WireguardInterface()
    status = fact.process(host.check_output(fact.command("wg0")).splitlines())
    assert status is not None
    peers = status["peers"]
    assert len(peers) == len(NODES) - 1
    assert {p["allowed_ips"][0] for p in peers} == {f"{MESH[n]}/32" for n in NODES if n != name}
    # Ping first: a peer that has not spoken since the deploy may not have handshaken yet.
    for other in NODES:
        if other != name:
            assert host.run(f"ping -c 2 -W 2 {MESH[other]}").rc == 0, f"{name} cannot reach {other} over the mesh"
    status = fact.process(host.check_output(fact.command("wg0")).splitlines())
    assert status is not None
    assert all(p["up"] for p in status["peers"]), status["peers"]
    assert "private" not in json.dumps(status).lower()


def test_postgres_listens_on_mesh_and_loopback_only(deployed: Deployed) -> None:
    host = node("node1")
    assert host.service("postgresql@15-main").is_running
    addresses = {address for address, port in _listening("node1") if port == 5432}
    assert addresses == {"127.0.0.1", MESH["node1"]}


def test_postgres_reachable_over_the_mesh_only(deployed: Deployed) -> None:
    probe = "python3 -c 'import socket,sys; socket.create_connection((sys.argv[1], 5432), timeout=2)' {}"
    assert node("node2").run(probe.format(MESH["node1"])).rc == 0
    assert node("node2").run(probe.format(NODES["node1"])).rc != 0
    assert not _reachable(NODES["node1"], 5432)  # from the controller, the public side


@pytest.mark.parametrize("name", list(NODES))
def test_firewall_public_side_ssh_and_wireguard_only(deployed: Deployed, name: str) -> None:
    host = node(name)
    assert host.service("nftables").is_enabled
    ruleset = host.check_output("nft list chain inet memoryctl input")
    assert "policy drop" in ruleset
    assert 'tcp dport 22 accept comment "ssh"' in ruleset
    assert 'udp dport 51820 accept comment "wireguard"' in ruleset
    services = [line for line in ruleset.splitlines() if "services over the mesh" in line]
    assert all('iifname "wg0"' in line and "10.77.0.0/24" in line for line in services)
    assert _reachable(NODES[name], 22)


def test_memoryctl_installed_configured_and_scheduled(deployed: Deployed) -> None:
    host = node("node1")
    assert host.file("/opt/memoryctl/venv/bin/memoryctl").is_file
    config = host.file("/etc/memoryctl/memoryctl.toml")
    assert (config.user, config.group, config.mode) == ("root", "memoryctl", 0o640)
    settings = tomllib.loads(host.check_output("cat /etc/memoryctl/memoryctl.toml"))
    assert settings["profile"] == "cluster"
    assert settings["postgres"]["dsn"] == f"postgresql://memoryctl@{MESH['node1']}:5432/memoryctl"
    assert settings["qdrant"]["url"] == f"http://{MESH['node2']}:6333"
    assert settings["vllm"]["url"] == f"http://{MESH['node3']}:8000"
    cron = host.file("/etc/cron.d/memoryctl").content_string
    for job in ("sync", "reconcile", "nightly"):
        line = next(line for line in cron.splitlines() if f"memoryctl {job} " in line)
        assert f"flock -n /run/lock/memoryctl-{job}.lock" in line
        assert f">> /var/log/memoryctl/{job}.log 2>&1" in line
    assert host.service("cron").is_running
    assert host.run("logrotate --debug /etc/logrotate.d/memoryctl").rc == 0
    cli = host.run("memoryctl --help")
    assert cli.rc == 0, f"memoryctl does not start on the node: {cli.stderr[-600:]}"


def test_memoryctl_health_reaches_postgres_over_the_mesh(deployed: Deployed) -> None:
    host = node("node1")
    cli = host.run("memoryctl --help")
    assert cli.rc == 0, f"memoryctl does not start on the node: {cli.stderr[-600:]}"
    if host.run("memoryctl health --help").rc != 0:
        pytest.skip("`memoryctl health` is not in this memoryctl build yet")
    result = host.run("memoryctl health --json")
    report = json.loads(result.stdout)
    # Qdrant, Neo4j and vLLM are not installed on the local nodes: judge PostgreSQL, not the exit code.
    assert report["components"]["postgres"]["status"] == "ok", report
