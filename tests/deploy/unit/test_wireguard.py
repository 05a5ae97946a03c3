"""wireguard/: keys, secrets on disk, the address plan and the live-interface fact (no nodes needed)."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from memoryctl.wgstatus import parse_dump
from wireguard import MeshNode, MeshPlan
from wireguard.facts import WireguardInterface
from wireguard.keys import KeyStore, SecretDir, generate_private_key, public_key_for


def test_public_key_matches_wg_pubkey() -> None:
    private = generate_private_key()
    if shutil.which("wg") is None:
        pytest.skip("wireguard-tools not installed")
    expected = subprocess.run(["wg", "pubkey"], input=private, capture_output=True, text=True, check=True)
    assert public_key_for(private) == expected.stdout.strip()


def test_secrets_are_created_once_with_mode_0600(tmp_path: Path) -> None:
    store = SecretDir(tmp_path / "secrets")
    first = store.get_or_create("wireguard/node1.key", generate_private_key)
    again = store.get_or_create("wireguard/node1.key", generate_private_key)
    assert first == again
    path = tmp_path / "secrets" / "wireguard" / "node1.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "secrets").stat().st_mode) == 0o700


def test_key_pair_repr_hides_the_private_key(tmp_path: Path) -> None:
    pair = KeyStore(SecretDir(tmp_path)).pair("node1")
    assert pair.private not in repr(pair)
    assert pair.public in repr(pair)


def _plan() -> MeshPlan:
    return MeshPlan(
        "10.77.0.0/24",
        [MeshNode(f"node{i}", f"203.0.113.{i}", f"10.77.0.{i}") for i in (1, 2, 3)],
    )


def test_full_mesh_peer_table(tmp_path: Path) -> None:
    keys = KeyStore(SecretDir(tmp_path))
    plan = _plan()
    peers = plan.peers("node2", keys)
    assert [p.name for p in peers] == ["node1", "node3"]
    assert [p.allowed_ips for p in peers] == ["10.77.0.1/32", "10.77.0.3/32"]
    assert peers[0].endpoint == "203.0.113.1:51820"
    assert peers[0].public_key == keys.pair("node1").public
    assert plan.interface_address("node2") == "10.77.0.2/24"


@pytest.mark.parametrize(
    ("addresses", "message"),
    [
        (["10.77.0.1", "10.77.0.1"], "share mesh address"),
        (["10.77.0.1", "10.78.0.2"], "outside"),
        (["10.77.0.0", "10.77.0.2"], "network or broadcast"),
    ],
)
def test_plan_rejects_bad_addresses(addresses: list[str], message: str) -> None:
    nodes = [MeshNode(f"n{i}", "198.51.100.1", a) for i, a in enumerate(addresses)]
    with pytest.raises(ValueError, match=message):
        MeshPlan("10.77.0.0/24", nodes)


DUMP = (
    "-\tPUBKEYSELF=\t51820\toff\n"
    "PEERA=\t(none)\t10.78.0.2:51820\t10.77.0.2/32\t1700000000\t628\t892\t25\n"
    "PEERB=\t(none)\t(none)\t10.77.0.3/32\t0\t0\t0\toff\n"
)


def test_parse_dump_and_handshake_ages() -> None:
    status = parse_dump(DUMP)
    assert status is not None
    assert status.listen_port == 51820
    a, b = status.peers
    assert a.handshake_age(1_700_000_030) == 30
    assert a.is_up(1_700_000_030)
    assert not a.is_up(1_700_001_000)
    assert b.handshake_age(1_700_000_030) is None and b.endpoint is None
    assert parse_dump("") is None


def test_fact_blanks_the_private_key_on_the_node(tmp_path: Path) -> None:
    """The fact's shell command run for real on a dump whose first field is a private key.

    ``wg`` is replaced by a STAND-IN script on PATH that prints such a dump (the real one needs an
    interface); ``date``, ``sed`` and the shell are the node's own tools, as in the deploy.
    """
    private = generate_private_key()
    dump = private + DUMP[1:]  # the interface line starts with the private key
    fake = tmp_path / "bin" / "wg"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\n[ \"$*\" = 'show wg0 dump' ] || exit 1\nprintf '%s' '{dump}'\n")
    fake.chmod(0o755)
    fact = WireguardInterface()
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin"}
    proc = subprocess.run(["sh", "-c", fact.command("wg0")], capture_output=True, text=True, env=env, check=True)
    assert private not in proc.stdout and proc.stdout.splitlines()[1].startswith("-\tPUBKEYSELF=")
    result = fact.process(proc.stdout.splitlines())
    assert result is not None and private not in repr(result)
    now = int(proc.stdout.splitlines()[0])
    assert [p["handshake_age_s"] for p in result["peers"]] == [float(now - 1_700_000_000), None]
    assert fact.process(["1700000030"]) is None
