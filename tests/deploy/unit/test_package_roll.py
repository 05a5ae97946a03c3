"""The held packages' roll (deploy/package_roll.py, templates/patroni/package-roll.py.j2): its plan on
the local inventory, and the node script against stand-ins of apt, systemctl, patronictl and Patroni's
REST API. The drill on the nodes: tests/deploy/test_reshape.py (a rolled upgrade under writers)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.common import render
from deploy.roles import everything
from deploy.settings import InventoryError
from tests.deploy.unit.test_patroni import plan

ROLL = {"upgrades": {"held": "roll"}}
UPGRADE = "Upgrade the held packages, one node at a time, the Patroni leader's node last"
HAND_OVER = "Switch over from the Patroni leader when its own packages wait"
FORMER = "Upgrade the held packages on the former leader's node"
SCRIPT = "/usr/local/sbin/memoryctl-package-roll"


def test_the_roll_is_planned_only_when_the_inventory_asks_for_it(secrets_dir: Path) -> None:
    for node in ("node1", "node2", "node3"):
        assert not any("held packages" in name for name in plan(everything, node).names())
        p = plan(everything, node, components=ROLL)
        upgrade, hand_over, former = p.op(UPGRADE), p.op(HAND_OVER), p.op(FORMER)
        assert upgrade.serial and former.serial and not hand_over.serial  # one node at a time
        assert upgrade.conditional and hand_over.conditional and former.conditional  # decided when it runs
        assert upgrade.commands == [f"{SCRIPT} upgrade"] == former.commands
        names = p.names()
        assert names.index(UPGRADE) < names.index(HAND_OVER) < names.index(FORMER)
        script = p.upload(SCRIPT)
        compile(script, SCRIPT, "exec")
        rolled = next(line for line in script.splitlines() if line.startswith("ROLLED = "))
        assert "|postgresql-17|postgresql-client-17|" in rolled and "timescaledb" not in rolled  # its own step
    # node3 has an etcd member and no Patroni member: it upgrades, and never hands over.
    assert plan(everything, "node3", components=ROLL).op(HAND_OVER).commands == []
    assert plan(everything, "node1", components=ROLL).op(HAND_OVER).commands == [f"{SCRIPT} hand-over"]


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(InventoryError, match=r"components\.upgrades\.held: Input should be 'hold' or 'roll'"):
        plan(everything, "node1", components={"upgrades": {"held": "always"}})


FAKE_APT = """#!/bin/sh
echo "Listing..."
cat "$0.upgradable"
"""
# apt-get install: the policy must forbid restarts while the packages install; what it installed is logged.
FAKE_APT_GET = """#!/bin/sh
"$POLICY_RC_D" patroni restart; echo "policy=$?" >> "$0.log"
echo "$@" >> "$0.log"
: > "$(dirname "$0")/apt.upgradable"
"""
FAKE_LOGGING = """#!/bin/sh
echo "$@" >> "$0.log"
"""


@pytest.fixture
def patroni_api() -> Iterator[tuple[str, dict[str, Any]]]:
    """GET /patroni and /cluster answered from a dict the test changes."""
    state: dict[str, Any] = {"patroni": {}, "cluster": {"members": []}, "config": {"synchronous_mode": True}}

    class Api(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            value = state[self.path.strip("/")]
            body = json.dumps(value() if callable(value) else value).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", state
    finally:
        server.shutdown()


def _script(tmp_path: Path, url: str | None, upgradable: str) -> tuple[Path, dict[str, str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (
        ("apt", FAKE_APT),
        ("apt-get", FAKE_APT_GET),
        ("systemctl", FAKE_LOGGING),
        ("patronictl", FAKE_LOGGING),
    ):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "apt.upgradable").write_text(upgradable)
    policy = tmp_path / "policy-rc.d"
    script = tmp_path / "package-roll"
    script.write_text(
        render(
            "patroni/package-roll.py.j2",
            rolled=["patroni", "etcd-server", "etcd-client", "postgresql-17", "postgresql-client-17"],
            postgres=17,
            patroni_url=url,
            config="/etc/patroni/config.yml",
            scope="memoryctl-local",
            etcd_health="true",
            marker=str(tmp_path / "maintenance"),
            wait_s=5,
            settle_s=0,
            policy_rc_d=str(policy),
        )
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "POLICY_RC_D": str(policy)}
    return script, env


def _run(script: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["python3", str(script), *args], env=env, capture_output=True, text=True, timeout=60)


UPGRADABLE = (
    "patroni/trixie 4.0.6-1+roll1 all [upgradable from: 4.0.6-1]\n"
    "postgresql-17/trixie 17.6-0+deb13u1+roll1 amd64 [upgradable from: 17.6-0+deb13u1]\n"
    "etcd-server/trixie 3.5.16-4+roll1 amd64 [upgradable from: 3.5.16-4]\n"
    "curl/trixie 8.14.1-3 amd64 [upgradable from: 8.14.1-2]\n"
)
REPLICA = {"role": "replica", "state": "running", "replication_state": "streaming", "patroni": {"name": "node2"}}
LEADER = {"role": "primary", "state": "running", "patroni": {"name": "node1"}}


def test_a_replica_installs_with_restarts_forbidden_then_restarts_etcd_and_patroni_itself(
    tmp_path: Path, patroni_api: tuple[str, dict[str, Any]]
) -> None:
    url, state = patroni_api
    state["patroni"] = REPLICA
    script, env = _script(tmp_path, url, UPGRADABLE)
    assert _run(script, env, "pending", "--role", "replica").returncode == 0
    assert _run(script, env, "pending", "--role", "leader").returncode == 1
    run = _run(script, env, "upgrade")
    assert run.returncode == 0, run.stdout + run.stderr
    bin_dir = tmp_path / "bin"
    installed = (bin_dir / "apt-get.log").read_text().splitlines()
    assert installed[0] == "policy=101"  # a maintainer script's restart was refused while installing
    assert installed[1].endswith("etcd-server patroni postgresql-17")  # curl is not the roll's
    assert not (tmp_path / "policy-rc.d").exists()  # and allowed again afterwards
    assert (bin_dir / "systemctl.log").read_text().splitlines() == ["restart etcd.service", "restart patroni.service"]
    assert _run(script, env, "pending").returncode == 1  # nothing left


def test_an_etcd_member_without_patroni_counts_as_a_replica_and_restarts_etcd_only(tmp_path: Path) -> None:
    """The gpu node of the reference layout: an etcd member, no PostgreSQL. Its script is rendered
    with no Patroni URL (the drill found it failing every step: a JSON null pasted into Python)."""
    script, env = _script(
        tmp_path, None, UPGRADABLE.replace("patroni/", "x-patroni/").replace("postgresql-17/", "x-pg/")
    )
    pending = _run(script, env, "pending", "--role", "replica")
    assert pending.returncode == 0, pending.stdout + pending.stderr
    assert _run(script, env, "pending", "--role", "leader").returncode == 1
    run = _run(script, env, "upgrade")
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "bin" / "apt-get.log").read_text().splitlines()[1].endswith("etcd-server")
    assert (tmp_path / "bin" / "systemctl.log").read_text().splitlines() == ["restart etcd.service"]


def test_the_leader_refuses_to_upgrade_and_hands_over_to_the_synchronous_standby(
    tmp_path: Path, patroni_api: tuple[str, dict[str, Any]]
) -> None:
    url, state = patroni_api
    state["patroni"] = LEADER
    state["cluster"] = {
        "members": [
            {"name": "node1", "role": "leader", "state": "running"},
            {"name": "node3", "role": "replica", "state": "streaming"},
            {"name": "node2", "role": "sync_standby", "state": "streaming"},
        ]
    }
    script, env = _script(tmp_path, url, UPGRADABLE)
    assert _run(script, env, "pending", "--role", "leader").returncode == 0
    refused = _run(script, env, "upgrade")
    assert refused.returncode != 0 and "this member leads: hand over first" in refused.stderr
    assert not (tmp_path / "bin" / "apt-get.log").exists()

    # The fake switchover: once patronictl was asked, this member answers as a streaming replica
    # (an event, not a timer: a 0.5 s timer fired before a loaded machine's script had asked).
    switched = tmp_path / "bin" / "patronictl.log"
    state["patroni"] = lambda: REPLICA if switched.exists() else LEADER
    run = _run(script, env, "hand-over")
    assert run.returncode == 0, run.stdout + run.stderr
    switchover = (tmp_path / "bin" / "patronictl.log").read_text().split()
    assert switchover[switchover.index("--leader") + 1] == "node1"
    assert switchover[switchover.index("--candidate") + 1] == "node2"


def test_a_maintenance_marker_or_a_paused_cluster_holds_the_roll_back(
    tmp_path: Path, patroni_api: tuple[str, dict[str, Any]]
) -> None:
    url, state = patroni_api
    state["patroni"] = REPLICA
    script, env = _script(tmp_path, url, UPGRADABLE)
    (tmp_path / "maintenance").write_text("PITR by alice")
    assert _run(script, env, "pending").returncode == 1
    held = _run(script, env, "upgrade")
    assert held.returncode != 0 and "PITR by alice" in held.stderr
    (tmp_path / "maintenance").unlink()
    state["cluster"] = {"pause": True, "members": []}
    paused = _run(script, env, "upgrade")
    assert paused.returncode != 0 and "memoryctl-local is paused" in paused.stderr
    assert not (tmp_path / "bin" / "apt-get.log").exists()
