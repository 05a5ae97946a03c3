"""Day-two changes on the deployed cluster: a rolling Qdrant restart, a TimescaleDB minor upgrade,
and a reboot of every node. Runs after the other deploy tests (file order), on the imported data.

- **Rolling Qdrant restart.** Only one Qdrant version exists here (1.19.0, the release artefact), so
  the roll is triggered by a change that needs a restart (``qdrant.log_level``, through an inventory
  overlay): it takes the same operation a version bump takes (a new version is a new unit, which
  changes, like the config here). A loop on the gpu node asks every peer for the exact point count
  twice a second throughout; every answer must be whole and at most one peer may be away at once.
- **TimescaleDB 2.28.3 -> 2.29.2** (both in the stand-in repository): the deploy moves the pin,
  refreshes the lists, upgrades the package, restarts PostgreSQL and runs ``ALTER EXTENSION
  timescaledb UPDATE``; every row of ``memories`` survives (count and a hash of the rows), and a
  further run changes nothing.
- **Reboot.** Every node rebooted at once: every service comes back, bound to its mesh address
  (the units are ordered after ``wg-quick@wg0``), and memoryctl's health is whole again.
"""

from __future__ import annotations

import itertools
import json
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.versions import TIMESCALEDB
from tests.deploy.cluster import (
    BASE_OVERLAYS,
    MESH,
    NODES,
    REPO,
    node,
    peer_api,
    put,
    run_deploy,
    wait_for,
    wait_healthy,
)
from tests.deploy.conftest import Deployed, record
from tests.deploy.e2e_data import DataSet

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

NEXT_TIMESCALEDB = "2.29.2"  # the newer of the two .debs in ../shared/artefacts
ROLL = {"qdrant": {"log_level": "WARN"}}  # a change every peer must restart for
LOOP = "/root/qdrant-answers.py"
LOOP_OUT = "/root/qdrant-answers.jsonl"
LOOP_SCRIPT = """
import json, re, sys, time, urllib.request
key = json.loads(re.search(r"api_key: (\\S+)", open("/etc/qdrant/config.yaml").read()).group(1))
peers, deadline = sys.argv[1].split(","), time.monotonic() + float(sys.argv[2])
with open(sys.argv[3], "a") as out:
    while time.monotonic() < deadline:
        for peer in peers:
            body = json.dumps({"exact": True}).encode()
            request = urllib.request.Request(f"http://{peer}:6333/collections/memories/points/count", body,
                                             {"api-key": key, "Content-Type": "application/json"})
            try:
                count = json.loads(urllib.request.urlopen(request, timeout=2).read())["result"]["count"]
            except Exception as exc:
                count = f"{type(exc).__name__}"
            out.write(json.dumps({"t": time.time(), "peer": peer, "count": count}) + "\\n")
            out.flush()
        time.sleep(0.5)
"""


def overlay(tmp: Path, components: dict[str, Any]) -> Path:
    path = tmp / "overlay.yaml"
    path.write_text(yaml.safe_dump({"cluster": "local", "components": components}))
    return path


def _restart_windows(since: str) -> dict[str, tuple[float, float]]:
    """Per node, (stopping, started) of qdrant.service since ``since`` (epoch seconds, from the journal)."""
    windows = {}
    for name in NODES:
        lines = node(name).check_output(
            f"journalctl -u qdrant.service --since @{since} -o json --no-pager | "
            'python3 -c \'import sys, json; [print(e["__REALTIME_TIMESTAMP"], e.get("MESSAGE", "")) '
            "for e in map(json.loads, sys.stdin)]'"
        )
        events = [line.partition(" ") for line in lines.splitlines()]
        stops = [int(ts) / 1e6 for ts, _, message in events if "Stopping" in message]
        starts = [int(ts) / 1e6 for ts, _, message in events if message.startswith("Started")]
        assert len(stops) == 1 and len(starts) == 1, (name, lines[-2000:])
        windows[name] = (stops[0], starts[0])
    return windows


def test_a_restart_rolls_through_the_qdrant_peers_and_the_cluster_keeps_answering(
    deployed: Deployed, imported: DataSet, tmp_path: Path
) -> None:
    # Every memory so far (the data set and what the fault tests wrote), counted exactly.
    expected = peer_api("node1", "/collections/memories/points/count", method="POST", body={"exact": True})["count"]
    assert expected >= len(imported.records)
    since = str(int(time.time()))
    put("node3", LOOP_SCRIPT, LOOP)
    peers = ",".join(MESH.values())
    node("node3").run(f"rm -f {LOOP_OUT}; nohup python3 {LOOP} {peers} 900 {LOOP_OUT} >/dev/null 2>&1 &")
    wait_for("the answer loop runs", lambda: node("node3").run(f"test -s {LOOP_OUT}").rc == 0, timeout=30)
    started = time.monotonic()
    run = run_deploy(REPO / ".cache" / "deploy-roll.log", overlay=overlay(tmp_path, ROLL))
    node("node3").run(f"pkill -f {shlex.quote(LOOP)}")
    assert run.returncode == 0 and run.errors == 0, run.output[-3000:]
    # pyinfra's results table cuts long names: the operation's name starts so.
    assert any(op.startswith("Qdrant | Restart qdrant, one peer at a time") for op in run.changed_operations())
    answers = [json.loads(line) for line in node("node3").check_output(f"cat {LOOP_OUT}").splitlines()]
    windows = _restart_windows(since)
    order = sorted(windows, key=lambda name: windows[name][0])
    for before, after in itertools.pairwise(order):
        assert windows[after][0] > windows[before][1], f"{after} stopped before {before} was back: {windows}"
    # Every answer is whole; a peer that does not answer is the one being restarted, never two at once.
    wrong = [a for a in answers if isinstance(a["count"], int) and a["count"] != expected]
    assert wrong == [], wrong[:5]
    rounds: dict[int, list[dict[str, Any]]] = {}
    for index, answer in enumerate(answers):
        rounds.setdefault(index // len(MESH), []).append(answer)
    away = [r for r in rounds.values() if sum(not isinstance(a["count"], int) for a in r) > 1]
    assert away == [], away[:3]
    assert len(rounds) > 20 and all(isinstance(a["count"], int) for a in answers[-3:])
    record(
        "rolling_qdrant_restart",
        {
            "seconds": round(time.monotonic() - started, 1),
            "deploy_seconds": round(run.seconds, 1),
            "order": order,
            "restart_windows_s": {n: round(w[1] - w[0], 1) for n, w in windows.items()},
            "answers": len(answers),
            "answered": sum(isinstance(a["count"], int) for a in answers),
            "refused_while_restarting": {
                peer: sum(1 for a in answers if a["peer"] == peer and not isinstance(a["count"], int))
                for peer in MESH.values()
            },
        },
    )


ROWS = "SELECT count(*), md5(string_agg(m::text, '|' ORDER BY m.id)) FROM memories m"


def _psql(sql: str) -> str:
    return node("node1").check_output(f"sudo -u postgres psql -XAtd memoryctl -c {shlex.quote(sql)}")


def test_a_timescaledb_minor_upgrade_updates_the_extension_and_keeps_every_row(
    deployed: Deployed, imported: DataSet, tmp_path: Path
) -> None:
    assert _psql("SELECT extversion FROM pg_extension WHERE extname = 'timescaledb'") == TIMESCALEDB
    rows = _psql(ROWS)
    assert int(rows.split("|")[0]) >= len(imported.records), rows
    upgrade = overlay(tmp_path, {**ROLL, "timescaledb": {"version": NEXT_TIMESCALEDB}})
    run = run_deploy(REPO / ".cache" / "deploy-timescaledb.log", overlay=upgrade)
    assert run.returncode == 0 and run.errors == 0, run.output[-3000:]
    changed = [op.split(" | ", 1)[-1] for op in run.changed_operations()]  # without the role's prefix
    assert f"TimescaleDB {NEXT_TIMESCALEDB}" in changed
    assert f"ALTER EXTENSION timescaledb UPDATE ({TIMESCALEDB} -> {NEXT_TIMESCALEDB})" in changed
    assert node("node1").package("timescaledb-2-postgresql-17").version == f"{NEXT_TIMESCALEDB}~source1"
    assert _psql("SELECT extversion FROM pg_extension WHERE extname = 'timescaledb'") == NEXT_TIMESCALEDB
    assert _psql(ROWS) == rows
    again = run_deploy(REPO / ".cache" / "deploy-timescaledb-again.log", overlay=upgrade)
    # The stack is at these versions now: every later deploy of the session keeps them (the
    # conversion to the Patroni cluster in test_ha.py would otherwise ask for a downgrade).
    BASE_OVERLAYS.append(upgrade)
    assert again.returncode == 0 and again.changed == 0, again.changed_operations()
    health, reruns = wait_healthy("memoryctl health after the upgrade", timeout=120)
    record(
        "timescaledb_upgrade",
        {
            "from": TIMESCALEDB,
            "to": NEXT_TIMESCALEDB,
            "deploy_seconds": round(run.seconds, 1),
            "changed": changed,
            "rows": rows.split("|")[0],
            "no_op_after": {"seconds": round(again.seconds, 1), "changed": again.changed},
            "health": health.get("status"),
            "jobs_run_again": reruns,
        },
    )


def test_after_a_reboot_every_service_is_up_and_bound_to_its_mesh_address(deployed: Deployed) -> None:
    """Each node rebooted in turn (as an operator does: the backup node stays up while the database
    node shuts down and archives its last WAL): back ``running``, exactly its services listening on
    its mesh address; then memoryctl's health is whole."""
    from tests.deploy.test_deploy import SERVICES, _listening

    marker = "/run/memoryctl-before-reboot"  # /run is a fresh tmpfs on every boot
    figures = {}
    for name in ("node2", "node3", "node1"):
        started = time.monotonic()
        node(name).check_output(f"touch {marker} && systemd-run --on-active=1 systemctl reboot")
        wait_for(f"{name} rebooted", lambda n=name: _answers(n, f"test ! -e {marker}"), timeout=240)
        state = wait_for(
            f"{name} running",
            lambda n=name: _answers(n, "systemctl is-system-running --wait || true") and _state(n),
            timeout=300,
        )
        failed = node(name).run("systemctl --failed --no-legend --plain").stdout.strip()
        assert state == "running", f"{name}: {state}; failed units: {failed}"
        want = {("0.0.0.0", 22), ("::", 22), *((MESH[name], port) for port in SERVICES[name])}
        want |= {("127.0.0.1", 5432)} if name == "node1" else set()
        listens = f"{name} listens on its mesh address"
        wait_for(listens, lambda n=name, w=want: _listening(n) == w, timeout=300, interval=3)
        figures[name] = round(time.monotonic() - started, 1)
    started = time.monotonic()
    health, reruns = wait_healthy("memoryctl health after the reboots", timeout=300)
    assert health["status"] == "healthy", health
    record(
        "reboot",
        {
            "seconds_until_listening": figures,
            "then_healthy_after_s": round(time.monotonic() - started, 1),
            "jobs_run_again": reruns,
        },
    )


def _answers(name: str, command: str) -> bool:
    """``command`` exits 0 on the node; False while the node does not answer SSH (rebooting)."""
    try:
        return bool(node(name).run(command).rc == 0)
    except RuntimeError:  # testinfra: ssh could not connect
        return False


def _state(name: str) -> str:
    return str(node(name).run("systemctl is-system-running").stdout.strip())
