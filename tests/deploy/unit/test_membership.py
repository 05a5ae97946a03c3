"""Declared membership (issue 39): the inventory's etcd members, and the planners of the scripts the
deploy runs on the nodes -- Qdrant's replica placement and etcd's member pruning -- on layouts as
Qdrant's and etcd's APIs return them. The scripts run for real in tests/deploy/test_reshape.py."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.common import render
from deploy.settings import InventoryError, load_inventory

A = "Active"


def _script(src: str, **context: Any) -> types.ModuleType:
    module = types.ModuleType(src.replace("/", "_"))
    exec(compile(render(src, **context), src, "exec"), module.__dict__)
    return module


@pytest.fixture(scope="module")
def replicas() -> types.ModuleType:
    return _script(
        "qdrant/replicas.py.j2", mesh_address="10.77.0.1", config_path="/etc/qdrant/config.yaml", declared_uris=[]
    )


def _step(
    replicas: types.ModuleType, live: set[int], others: set[int], shards: dict[int, dict[int, str]], **kw: Any
) -> Any:
    collections = {"memories_x": (kw.get("factor", 2), shards, kw.get("transfers", []))}
    return replicas.next_step(live, others, collections, kw.get("missing", []), kw.get("patience", True))


def test_a_layout_that_cannot_be_read_is_due_not_done(
    replicas: types.ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The deploy runs the placement when ``--check`` says a step is due: an unreadable layout (a
    peer that just rejoined, a timeout on a busy node) must not read as "every replica placed"."""

    def unreadable() -> None:
        raise OSError("timed out")

    monkeypatch.setattr(replicas, "api_key", lambda: "key")
    monkeypatch.setattr(replicas, "layout", unreadable)
    monkeypatch.setattr(replicas.sys, "argv", ["memoryctl-qdrant-replicas", "--check"])
    assert replicas.main() == 0
    assert "cannot read the layout" in capsys.readouterr().err


def test_a_replaced_peer_gets_the_shards_that_lost_a_replica(replicas: types.ModuleType) -> None:
    # Peer 2 was lost and removed; peer 4 is its blank successor: shards 0 and 2 have one replica left.
    shards = {0: {1: A}, 1: {1: A, 3: A}, 2: {3: A}}
    description, collection, body = _step(replicas, {1, 3, 4}, set(), shards)
    assert collection == "memories_x"
    assert body == {"replicate_shard": {"shard_id": 0, "from_peer_id": 1, "to_peer_id": 4}}, description
    shards[0][4] = A
    assert _step(replicas, {1, 3, 4}, set(), shards)[2]["replicate_shard"] == {
        "shard_id": 2,
        "from_peer_id": 3,
        "to_peer_id": 4,
    }
    shards[2][4] = A
    assert _step(replicas, {1, 3, 4}, set(), shards) is None  # 2 replicas each, 2 per peer


def test_a_new_peer_gets_replicas_moved_onto_it_until_even_within_one(replicas: types.ModuleType) -> None:
    shards = {0: {1: A, 2: A}, 1: {2: A, 3: A}, 2: {3: A, 1: A}}
    moves = 0
    while (step := _step(replicas, {1, 2, 3, 4}, set(), shards)) is not None:
        move = step[2]["move_shard"]
        assert move["to_peer_id"] not in shards[move["shard_id"]]
        shards[move["shard_id"]][move["to_peer_id"]] = shards[move["shard_id"]].pop(move["from_peer_id"])
        moves += 1
        assert moves < 10
    load = [sum(peer in r for r in shards.values()) for peer in (1, 2, 3, 4)]
    assert max(load) - min(load) <= 1 and sum(load) == 6 and moves == 1, (load, shards)
    assert all(len(r) == 2 for r in shards.values())  # moved, never copied or lost


def test_a_peer_the_inventory_dropped_is_drained_then_removed(replicas: types.ModuleType) -> None:
    shards = {0: {1: A, 4: A}, 1: {2: A, 3: A}, 2: {3: A, 1: A}}
    step = _step(replicas, {1, 2, 3}, {4}, shards)
    # Shard 0 has one Active replica on a declared peer: a new one first, the drop after it.
    assert step[2] == {"replicate_shard": {"shard_id": 0, "from_peer_id": 1, "to_peer_id": 2}}, step[0]
    shards[0][2] = A
    assert _step(replicas, {1, 2, 3}, {4}, shards)[2] == {"drop_replica": {"shard_id": 0, "peer_id": 4}}
    del shards[0][4]
    description, collection, peer = _step(replicas, {1, 2, 3}, {4}, shards)
    assert collection is None and peer == 4, description


def test_transfers_recoveries_and_joining_peers_are_waited_for(replicas: types.ModuleType) -> None:
    shards = {0: {1: A}, 1: {1: A, 2: A}}
    assert _step(replicas, {1, 2}, set(), shards, transfers=[{"shard_id": 0}]) == "wait"
    assert _step(replicas, {1, 2}, set(), {0: {1: A, 2: "Partial"}}) == "wait"
    assert _step(replicas, {1, 2}, set(), shards, missing=["http://10.77.0.3:6335"]) == "wait"
    # A declared peer that does not join in time: the replicas go to the peers there are.
    late = _step(replicas, {1, 2}, set(), shards, missing=["http://10.77.0.3:6335"], patience=False)
    assert late[2]["replicate_shard"]["to_peer_id"] == 2


def test_etcd_prune_names_only_members_the_inventory_no_longer_declares() -> None:
    membership = _script(
        "etcd/membership.py.j2",
        member="node1",
        peer_url="https://10.77.0.1:2380",
        client_url="https://10.77.0.1:2379",
        other_client_urls=[],
        declared_peer_urls=["https://10.77.0.1:2380", "https://10.77.0.2:2380"],
        declared_client_urls=[],
        data_dir="/var/lib/etcd/memoryctl",
        join_env="/var/lib/etcd/memoryctl-join.env",
        pki_dir="/etc/etcd/pki",
    )
    listed = [
        {"ID": 1, "name": "node1", "peerURLs": ["https://10.77.0.1:2380"]},
        {"ID": 2, "name": "node2", "peerURLs": ["https://10.77.0.2:2380"]},
        {"ID": 3, "name": "node4", "peerURLs": ["https://10.77.0.4:2380"]},
        {"ID": 4, "name": "", "peerURLs": ["https://10.77.0.5:2380"]},  # added, never started
    ]
    assert [m["ID"] for m in membership.undeclared(listed)] == [3, 4]


def _inventory(tmp_path: Path, nodes: int, etcd: list[str] | None = None) -> Any:
    doc = yaml.safe_load((Path(__file__).parents[3] / "inventory" / "local.yaml").read_text())
    for n in range(4, nodes + 1):
        doc["nodes"][f"node{n}"] = {"public": f"10.78.0.{n}", "mesh": f"10.77.0.{n}", "roles": []}
    if etcd is not None:
        doc["components"]["etcd"] = {"members": etcd}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_inventory(path)


def test_etcd_stays_three_members_as_nodes_are_added(tmp_path: Path) -> None:
    assert _inventory(tmp_path, 3).etcd_members() == ["node1", "node2", "node3"]
    assert _inventory(tmp_path, 4).etcd_members() == ["node1", "node2", "node3"]
    assert _inventory(tmp_path, 5, etcd=["node1", "node2", "node3", "node4", "node5"]).etcd_members()[-1] == "node5"


@pytest.mark.parametrize(
    ("members", "message"),
    [(["node1", "node2"], "odd number"), (["node1", "node1", "node2"], "odd number"), (["node9"], "unknown nodes")],
)
def test_etcd_members_that_cannot_keep_a_quorum_are_refused(tmp_path: Path, members: list[str], message: str) -> None:
    with pytest.raises(InventoryError, match=message):
        _inventory(tmp_path, 4, etcd=members)
