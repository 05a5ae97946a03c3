"""The Patroni cluster's plan (deploy/patroni.py, deploy/etcd.py) on the local inventory: what each
node gets, in which order, and what a second run leaves alone. The drills: tests/deploy/test_ha.py."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyinfra.api.host import Host

from deploy.common import render
from deploy.components import InventoryError, parse
from deploy.patroni import PatroniSettingsError, members
from deploy.patroni_settings import differences, needs_restart
from deploy.roles import everything
from tests.deploy.unit.plans import FRESH_DEBIAN, Plan, cluster_order
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
        assert restart.serial  # never both members at once
    single = plan(everything, "node1", components=SINGLE).op("Backups | Restart PostgreSQL (WAL archiving changed)")
    assert single.conditional and "patronictl" not in " ".join(single.commands)


# Patroni's GET /config of a cluster formed from this release's bootstrap.dcs on the local
# inventory, as Patroni returns it: the template's strings, edit-config's YAML ints and booleans.
FORMED_PARAMETERS = {
    "wal_level": "replica",
    "hot_standby": True,
    "wal_log_hints": "on",
    "max_wal_senders": 10,
    "max_replication_slots": "10",
    "wal_keep_size": "256MB",
    "max_connections": 50,
    "max_worker_processes": "8",
    "max_locks_per_transaction": 64,
}
FORMED = {
    "ttl": 20,
    "loop_wait": 3,
    "retry_timeout": 7,
    "maximum_lag_on_failover": 1048576,
    "postgresql": {"use_pg_rewind": True, "parameters": FORMED_PARAMETERS},
}
EDIT = "PostgreSQL | Patroni's cluster settings as declared (patronictl edit-config)"
ROLL = "Restart members pending a restart, one at a time, the leader last"
PATRONICTL = "patronictl -c /etc/patroni/config.yml"


def test_a_running_cluster_is_given_the_declared_timing_and_then_left_alone(secrets_dir: Path) -> None:
    """bootstrap.dcs reaches etcd only when the cluster is formed: a cluster formed with other
    values (an earlier release's, Patroni's defaults) is edited to the declared ones, once."""
    edit = plan(everything, "node1", facts={"PatroniDynamicConfig": {**FORMED, "ttl": 30, "loop_wait": 5}}).op(EDIT)
    assert edit.commands == [f"{PATRONICTL} edit-config memoryctl-local --force --quiet -s loop_wait=3 -s ttl=20"]
    second = plan(everything, "node1", facts={"PatroniDynamicConfig": FORMED})
    assert EDIT not in second.names()  # strings and ints, "on" and true: the same values
    assert second.op(ROLL).commands == []  # nothing pending, nothing edited: no roll
    assert EDIT not in plan(everything, "node1").names()  # not answering: formed from bootstrap.dcs
    assert EDIT not in plan(everything, "node2", facts={"PatroniDynamicConfig": FORMED}).names()  # the first member's


def test_postmaster_settings_patroni_owns_are_in_its_dcs_and_not_in_the_conf_file(secrets_dir: Path) -> None:
    """Patroni passes these on postgres' command line from the DCS: a conf.d value would lie."""
    raised = {"postgres": {"max_worker_processes": 16, "max_locks_per_transaction": 256}}
    p = plan(everything, "node1", components=raised)
    parameters = _config(p, "/etc/patroni/config.yml")["bootstrap"]["dcs"]["postgresql"]["parameters"]  # type: ignore[index]
    assert parameters == {**FORMED_PARAMETERS, "hot_standby": "on", "max_replication_slots": 10, **raised["postgres"]}
    conf = p.upload("/etc/postgresql/17/main/conf.d/memoryctl.conf")
    assert not any(f"{name} =" in conf for name in ("max_connections", "max_worker_processes", "max_locks_per"))
    # A single server keeps them in its file; the optional ones only when the inventory names them.
    single = plan(everything, "node1", components=SINGLE).upload("/etc/postgresql/17/main/conf.d/memoryctl.conf")
    assert "\nmax_connections = 50\nshared_buffers" in single and "max_worker_processes" not in single
    single = plan(everything, "node1", components={**SINGLE, "postgres": {**SINGLE["postgres"], **raised["postgres"]}})
    conf = single.upload("/etc/postgresql/17/main/conf.d/memoryctl.conf")
    assert "max_worker_processes = 16\nmax_locks_per_transaction = 256\n" in conf


def test_a_raised_max_connections_is_edited_into_the_dcs_and_rolled_out(secrets_dir: Path) -> None:
    p = plan(
        everything, "node1", components={"postgres": {"max_connections": 200}}, facts={"PatroniDynamicConfig": FORMED}
    )
    edit = p.op(EDIT)
    assert edit.commands == [
        f"{PATRONICTL} edit-config memoryctl-local --force --quiet -s postgresql.parameters.max_connections=200"
    ]
    roll = p.op(ROLL)  # only if the edit ran, and after the members took it up (within Patroni's ttl)
    assert roll.commands == ["/usr/local/sbin/memoryctl-patroni-restart-pending --settle 20"] and roll.conditional
    assert p.names().index(roll.name) > p.names().index(
        "Wait for every node: the PostgreSQL primary runs under Patroni"
    )


def test_a_pending_restart_is_rolled_once_from_the_first_member_after_every_member_started(secrets_dir: Path) -> None:
    cluster = {
        "members": [
            {"name": "node1", "role": "leader", "state": "running", "pending_restart": True},
            {"name": "node2", "role": "sync_standby", "state": "streaming", "pending_restart": True},
        ]
    }
    facts = {"PatroniDynamicConfig": FORMED, "PatroniCluster": cluster}
    roll = plan(everything, "node1", facts=facts).op(ROLL)
    assert roll.commands == ["/usr/local/sbin/memoryctl-patroni-restart-pending"] and not roll.conditional
    assert plan(everything, "node2", facts=facts).op(ROLL).commands == []  # the cluster's roll: one member runs it
    steps = cluster_order(everything, facts=facts, components={"base": {"admin_keys": list(_admin_key)}})
    standby_up = "Patroni standby | Wait until this member streams from the primary (Patroni /replica answers 200)"
    assert steps.index(("node1", ROLL)) > steps.index(("node2", standby_up))
    # The members never restart Patroni themselves, whatever changed: Patroni would fail over.
    assert not any(
        "systemctl restart patroni" in " ".join(op.commands) for op in plan(everything, "node1", facts=facts).ops
    )


@pytest.mark.parametrize(
    ("facts", "says"),
    [
        (
            {
                "MaintenanceMarker": lambda path: (
                    "point-in-time restore, alice" if path == "/etc/memoryctl/maintenance" else None
                )
            },
            "maintenance marker /etc/memoryctl/maintenance set by point-in-time restore, alice",
        ),
        (
            {"PatroniCluster": {"pause": True, "members": []}},
            "memoryctl-local is paused (patronictl pause; resume it to let the deploy act)",
        ),
    ],
)
def test_a_paused_cluster_or_a_maintenance_marker_keeps_the_deploy_from_starting_patroni(
    secrets_dir: Path, facts: dict[str, Any], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    said: list[str] = []
    monkeypatch.setattr(Host, "noop", lambda self, description: said.append(description))
    postgres = {"home": "/var/lib/postgresql", "group": "postgres", "groups": [], "shell": "/bin/bash"}
    handed_over = {"mode": 600, "mtime": None}
    installed = {
        "Users": {**FRESH_DEBIAN["Users"], "postgres": postgres},
        "File": lambda path: handed_over if path == "/etc/patroni/config.yml" else None,
    }
    for node in ("node1", "node2"):
        p = plan(everything, node, facts={**installed, **facts})
        names = " ".join(p.names())
        for step in (
            "Patroni running and enabled",
            "Hand postgresql@17-main over",
            "Wait until this member",
            "Restart PostgreSQL",
        ):
            assert step not in names, (node, step)
        assert p.op(ROLL).commands == []
        assert f"{says}: not starting or restarting Patroni" in said, said
        assert "memoryctl-wireguard-metrics" in names  # the rest of the run goes on
        said.clear()


@pytest.mark.parametrize("value", [10, "many", 1.5, True])
def test_postmaster_settings_patroni_would_refuse_or_raise_are_refused(value: object) -> None:
    with pytest.raises(InventoryError, match=r"^local.yaml: components.postgres.max_connections: "):
        parse({"postgres": {"max_connections": value}}, "local.yaml")


def test_values_compare_as_patroni_returns_them() -> None:
    wanted = {"ttl": 20, "postgresql": {"parameters": {"hot_standby": "on", "max_connections": 200}}}
    current = {
        "ttl": "20",
        "postgresql": {"parameters": {"hot_standby": True, "max_connections": "100"}},
        "pause": True,
    }
    assert differences(wanted, current) == {"postgresql.parameters.max_connections": 200}
    assert differences(wanted, {}) == {
        "ttl": 20,
        "postgresql.parameters.hot_standby": "on",
        "postgresql.parameters.max_connections": 200,
    }
    assert needs_restart(["postgresql.parameters.max_connections"]) and not needs_restart(["ttl"])
    assert not needs_restart(["postgresql.parameters.wal_keep_size"])


def test_the_restart_script_is_python_that_knows_every_member(secrets_dir: Path) -> None:
    script = plan(everything, "node1").upload("/usr/local/sbin/memoryctl-patroni-restart-pending")
    compile(script, "restart-pending", "exec")
    assert 'CLUSTER_URLS = ["http://10.77.0.1:8008/cluster", "http://10.77.0.2:8008/cluster"]' in script
    assert '"--pending", "--force"' in script


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


def test_the_clusters_packages_are_never_upgraded_unattended() -> None:
    """Debian's patroni postinst restarts Patroni (a failover on the primary's node) and a
    PostgreSQL update replaces binaries under a running server: they are upgraded in a roll."""
    rendered = render("base/50unattended-upgrades-memoryctl.j2")
    block = rendered.split("Unattended-Upgrade::Package-Blacklist {", 1)[1].split("};", 1)[0]
    patterns = re.findall(r'"([^"]+)";', block)
    held = lambda package: any(re.match(pattern, package) for pattern in patterns)  # noqa: E731  as unattended-upgrades matches
    for package in (
        "patroni",
        "etcd-server",
        "etcd-client",
        "postgresql-17",
        "postgresql-client-17",
        "postgresql-common",
        "timescaledb-2-postgresql-17",
        "timescaledb-2-loader-postgresql-17",
    ):
        assert held(package), package
    for package in ("patroni-doc", "prometheus-postgres-exporter", "libpq5", "openssl", "etcd-serverx"):
        assert not held(package), package


FAKE_PATRONICTL = """#!/usr/bin/python3
import json, sys
state_file, log_file = sys.argv[0] + ".state", sys.argv[0] + ".log"
name = sys.argv[sys.argv.index("restart") + 2]
members = json.load(open(state_file))
with open(log_file, "a") as log:
    log.write(name + "\\n")
leader = next(m for m in members if m["role"] == "leader")
for m in members:
    if m["name"] == name:
        # A replica restarted before its primary keeps the primary's larger value (Patroni), when lowered.
        m["pending_restart"] = m is not leader and LOWERED and leader["pending_restart"]
json.dump(members, open(state_file, "w"))
"""


@pytest.mark.parametrize(("lowered", "restarts"), [(False, ["node2", "node1"]), (True, ["node2", "node1", "node2"])])
def test_the_restart_script_rolls_replicas_then_the_leader_then_replicas_still_pending(
    tmp_path: Path, lowered: bool, restarts: list[str]
) -> None:
    """The roll against a stand-in Patroni (GET /cluster from a file) and a stand-in patronictl."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    patronictl = bin_dir / "patronictl"
    patronictl.write_text(FAKE_PATRONICTL.replace("LOWERED", str(lowered)))
    patronictl.chmod(0o755)
    state = Path(f"{patronictl}.state")
    state.write_text(
        json.dumps(
            [
                {"name": "node1", "role": "leader", "state": "running", "pending_restart": True},
                {"name": "node2", "role": "sync_standby", "state": "streaming", "pending_restart": True},
            ]
        )
    )

    class Cluster(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"members": json.loads(state.read_text())}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Cluster)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        script = tmp_path / "restart-pending"
        script.write_text(
            render(
                "patroni/restart-pending.py.j2",
                cluster_urls=[f"http://127.0.0.1:{server.server_port}/cluster"],
                config="/etc/patroni/config.yml",
                scope="memoryctl-local",
                wait_s=5,
                loop_s=0.1,
            )
        )
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        run = subprocess.run(["python3", str(script)], env=env, capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert run.returncode == 0, run.stdout + run.stderr
    assert Path(f"{patronictl}.log").read_text().split() == restarts
