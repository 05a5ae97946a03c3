"""The Patroni cluster's plan (deploy/patroni.py, deploy/etcd.py) on the local inventory: what each
node gets, in which order, and what a second run leaves alone. The drills: tests/deploy/test_ha.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.patroni import PatroniSettingsError, members
from deploy.roles import everything
from tests.deploy.unit.plans import Plan
from tests.deploy.unit.plans import plan as plan_of

SINGLE = {"postgres": {"members": ["node1"]}}
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKx8x3zVXQ6o3rA5vN0o4Yl6vJq0b1Zc9w8a2b3c4d5e test@controller"


_admin_key: list[str] = []


@pytest.fixture(autouse=True)
def admin_key(tmp_path: Path) -> None:
    """The admin key the base system installs, so that these plans need no ``scripts/cluster up``
    (inventory/local.yaml names the key the cluster script generates)."""
    path = tmp_path / "admin.pub"
    path.write_text(KEY + "\n")
    _admin_key[:] = [str(path)]


def plan(
    fn: Callable[[], object], node: str, components: dict[str, Any] | None = None, facts: dict[str, Any] | None = None
) -> Plan:
    components = {"base": {"admin_keys": list(_admin_key)}, **(components or {})}
    return plan_of(fn, node, facts=facts, components=components)  # type: ignore[arg-type]


def _config(p: object, dest: str) -> dict[str, object]:
    return dict(yaml.safe_load(p.upload(dest)))  # type: ignore[attr-defined]


def test_etcd_runs_on_every_node_on_the_mesh_with_client_and_peer_tls(secrets_dir: Path) -> None:
    for node, address in (("node1", "10.77.0.1"), ("node2", "10.77.0.2"), ("node3", "10.77.0.3")):
        env = plan(everything, node).upload("/etc/default/etcd")
        assert f'ETCD_LISTEN_CLIENT_URLS="https://{address}:2379"' in env
        assert f'ETCD_LISTEN_PEER_URLS="https://{address}:2380"' in env
        assert 'ETCD_CLIENT_CERT_AUTH="true"' in env and 'ETCD_PEER_CLIENT_CERT_AUTH="true"' in env
        cluster = "node1=https://10.77.0.1:2380,node2=https://10.77.0.2:2380,node3=https://10.77.0.3:2380"
        assert f'ETCD_INITIAL_CLUSTER="{cluster}"' in env
        assert "127.0.0.1" not in env and "0.0.0.0" not in env


def test_the_db_node_is_handed_to_patroni_after_its_database_exists(secrets_dir: Path) -> None:
    p = plan(everything, "node1")
    names = p.names()
    config = _config(p, "/etc/patroni/config.yml")
    dcs = config["bootstrap"]["dcs"]  # type: ignore[index]
    assert dcs["synchronous_mode"] is True and dcs["synchronous_mode_strict"] is False
    assert (dcs["ttl"], dcs["loop_wait"], dcs["retry_timeout"]) == (20, 3, 7)  # 20: Patroni 4's smallest ttl
    assert dcs["ttl"] >= dcs["loop_wait"] + 2 * dcs["retry_timeout"]  # what Patroni accepts
    assert dcs["postgresql"]["use_pg_rewind"] is True
    assert config["postgresql"]["data_dir"] == "/var/lib/postgresql/17/main"  # type: ignore[index]
    assert config["restapi"]["listen"] == "10.77.0.1:8008"  # type: ignore[index]
    # Debian's cluster first (role, database, extension), then the takeover, then the other members.
    order = [
        "PostgreSQL | Database memoryctl (first install)",
        "PostgreSQL | Replication and pg_rewind roles (SCRAM verifiers read from a file)",
        "PostgreSQL | Hand postgresql@17-main over to Patroni (stop and disable the Debian unit)",
        "PostgreSQL | Patroni running and enabled",
        "PostgreSQL | Wait until this member leads the cluster (Patroni /primary answers 200)",
    ]
    assert [names.index(name) for name in order] == sorted(names.index(name) for name in order)
    hba = p.upload("/etc/postgresql/17/main/pg_hba.conf")
    assert "host    replication     replicator      10.77.0.0/24       scram-sha-256" in hba
    toml = p.upload("/etc/memoryctl/memoryctl.toml")
    assert 'hosts = ["10.77.0.1:5432", "10.77.0.2:5432"]' in toml


def test_a_standby_member_starts_only_after_the_barrier_and_only_once_another_member_leads(
    secrets_dir: Path,
) -> None:
    p = plan(everything, "node2")
    names = p.names()
    barrier = names.index("Wait for every node: the PostgreSQL primary runs under Patroni")
    handover = p.op("Hand postgresql@17-main over to Patroni (its fresh cluster emptied")
    assert names.index(handover.name) > barrier
    guard, _, wipe = handover.commands[0], handover.commands[1], handover.commands[2]
    assert "/memoryctl/memoryctl-local/leader" in guard and "exit 1" in guard
    # Only a cluster that holds nothing but the template databases is ever emptied.
    assert "-le 3" in wipe and "holds databases of its own" in wipe
    assert "Database memoryctl" not in " ".join(names)  # the data comes from the primary
    assert "/etc/patroni/config.yml" in {d for op in p.ops for d in op.uploads}


def test_one_member_is_the_single_server_without_etcd_or_patroni(secrets_dir: Path) -> None:
    p = plan(everything, "node1", components=SINGLE)
    assert not any("atroni" in name or "etcd" in name for name in p.names())
    assert "hosts =" not in p.upload("/etc/memoryctl/memoryctl.toml")
    assert not any("PostgreSQL standby" in name for name in plan(everything, "node2", components=SINGLE).names())


@pytest.mark.parametrize(
    ("stated", "message"),
    [
        (["node2", "node1"], "must start with the db node"),
        (["node1", "node9"], "unknown nodes"),
        (["node1", "node1"], "twice"),
    ],
)
def test_members_that_cannot_be_deployed_are_refused(stated: list[str], message: str) -> None:
    with pytest.raises(PatroniSettingsError, match=message):
        plan(members, "node1", components={"postgres": {"members": stated}})  # type: ignore[arg-type]


def test_a_converting_member_restarts_for_wal_archiving_through_patroni(secrets_dir: Path) -> None:
    """Backups come after Patroni in the run, so even the run that converts a member (no Patroni
    configuration yet when it was planned) restarts it through Patroni, never the Debian unit."""
    for node in ("node1", "node2"):
        restart = plan(everything, node).op("Backups | Restart PostgreSQL (WAL archiving changed)")
        assert restart.conditional and "patronictl" in " ".join(restart.commands), (node, restart.commands)
    single = plan(everything, "node1", components=SINGLE).op("Backups | Restart PostgreSQL (WAL archiving changed)")
    assert single.conditional and "patronictl" not in " ".join(single.commands)


def test_a_running_cluster_is_given_the_declared_timing_and_then_left_alone(secrets_dir: Path) -> None:
    """bootstrap.dcs reaches etcd only when the cluster is formed: a cluster formed with other
    values (an earlier release's, Patroni's defaults) is edited to the declared ones, once."""
    name = "PostgreSQL | Patroni's cluster timing as declared (patronictl edit-config)"
    formed = {"ttl": 20, "loop_wait": 5, "retry_timeout": 7, "maximum_lag_on_failover": 1048576, "postgresql": {}}
    edit = plan(everything, "node1", facts={"PatroniDynamicConfig": {**formed, "ttl": 30}}).op(name)
    assert edit.commands == [
        "patronictl -c /etc/patroni/config.yml edit-config memoryctl-local --force --quiet -s loop_wait=3 -s ttl=20"
    ]
    declared = {**formed, "loop_wait": 3}
    assert name not in plan(everything, "node1", facts={"PatroniDynamicConfig": declared}).names()
    assert name not in plan(everything, "node1").names()  # not answering: formed from bootstrap.dcs
    assert name not in plan(everything, "node2", facts={"PatroniDynamicConfig": formed}).names()  # the first member's


def test_members_keep_etcds_leader_off_the_primary_from_a_callback_and_a_timer(secrets_dir: Path) -> None:
    for node, address in (("node1", "10.77.0.1"), ("node2", "10.77.0.2")):
        p = plan(everything, node)
        config = _config(p, "/etc/patroni/config.yml")
        script = p.upload("/usr/local/sbin/memoryctl-etcd-leader-away")
        assert config["postgresql"]["callbacks"] == {  # type: ignore[index]
            "on_role_change": "/usr/local/sbin/memoryctl-etcd-leader-away"
        }
        compile(script, "etcd-leader-away", "exec")  # the rendered script is Python that parses
        assert script.startswith("#!/usr/bin/python3\n")
        assert f'LOCAL = "https://{address}:2379"' in script
        assert f'PRIMARY_CHECK = "http://{address}:8008/primary"' in script
        assert "https://10.77.0.3:2379" in script  # every member is asked who leads
        timer = p.upload("/etc/systemd/system/etcd-leader-away.timer")
        assert "OnUnitActiveSec=10s" in timer
        assert "User=postgres" in p.upload("/etc/systemd/system/etcd-leader-away.service")
    third = plan(everything, "node3")
    with pytest.raises(AssertionError, match="no upload"):  # etcd only: no PostgreSQL there to keep apart from
        third.upload("/usr/local/sbin/memoryctl-etcd-leader-away")
