"""PostgreSQL as a Patroni cluster on the local nodes (issue 26, docs/ha.md): the drills.

Runs after every other deploy test (tests/deploy/conftest.py orders it last), which all run on a
single PostgreSQL server as every install before issue 26: the ``ha`` fixture converts that server
in place to the inventory's Patroni cluster (every memory's id and text compared before and after;
a second run changes nothing). Then, in this order, each drill with
writers adding memories through the service (``memoryctl add`` on the db node, which goes through
``memoryctl serve``) and every acknowledged id (exit 0, or 3: stored, a store behind) compared with
what PostgreSQL holds afterwards:

1. the cluster as deployed: node1 leads, node2 is its synchronous standby, streaming;
2. a planned switchover to node2: no request fails;
3. the primary's node (node2 now) loses its power: node1 is promoted; the time from the cut to the
   leader change and to the first write that succeeds again; 0 acknowledged writes lost;
4. node2 boots again and rejoins as a standby by itself (pg_rewind when its timeline diverged);
5. the standby lost (Patroni stopped on node2): writes continue on the primary alone, health says
   so; back, it is the synchronous standby again. Then reconcile finds no drift.
6. pgBackRest archives from the primary and backs up from the standby;
7. the derived stores' restore drill of test_restore_drills.py, on the cluster;
8. point-in-time restore of the cluster (docs/ha.md): the database dropped, restored to a time T
   on the first member, Patroni takes it over, the standby cloned again; reconcile drops the rest.

Transcripts (timestamps of every event) go to the deploy report (.cache/deploy-report.json).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from deploy.osrelease import DEFAULT, RELEASES
from memoryctl.errors import ExitCode
from memoryctl.health.postgres import NO_SYNC_STANDBY
from memoryctl.stores import names
from tests.deploy import e2e_data
from tests.deploy.cluster import BASE_OVERLAYS, CLUSTER, MESH, REPO, memoryctl, node, put, run_deploy, wait_for
from tests.deploy.conftest import SINGLE_SERVER, record
from tests.deploy.test_monitoring import DB, OPS, prometheus, psql, sh, timed
from tests.deploy.test_upgrades import overlay

pytestmark = pytest.mark.deploy
MEMBERS = ("node1", "node2")
WRITER = "/usr/local/sbin/memoryctl-ha-writer"
PATRONICTL = "patronictl -c /etc/patroni/config.yml"
PG_VERSION = RELEASES[DEFAULT].postgres
WRITES_BACK_WITHIN_S = 30  # issue 26's target for a hard primary loss: a product promise, asserted
# One memory every 0.5 s through the service; each line: start (epoch s), id, exit code, seconds.
WRITER_SCRIPT = """#!/bin/sh
label=$1; seconds=$2; log=/var/lib/memoryctl/ha-$label.log
: > "$log"; end=$(( $(date +%s) + seconds )); n=0
while [ "$(date +%s)" -lt "$end" ]; do
  n=$((n+1)); id=$(cat /proc/sys/kernel/random/uuid); t=$(date +%s.%N)
  cd /var/lib/memoryctl && sudo -u memoryctl OMP_NUM_THREADS=1 timeout 120 memoryctl add --id "$id" \
    "ha drill $label write $n" >/dev/null 2>>"/var/lib/memoryctl/ha-$label.err"
  rc=$?; echo "$t $id $rc $(echo "$(date +%s.%N) - $t" | bc)" >> "$log"; sleep 0.5
done
echo done >> "$log"
"""


def cluster_view(via: str = "node3") -> dict[str, Any]:
    """Patroni's view of the cluster (``GET /cluster`` of any member), asked from ``via`` over the mesh."""
    for member in MEMBERS:
        result = node(via).run(f"curl -s -m 3 http://{MESH[member]}:8008/cluster")
        if result.rc == 0 and result.stdout.strip():
            return dict(json.loads(result.stdout))
    return {"members": []}


def roles() -> dict[str, str]:
    return {
        m["name"]: m["role"] for m in cluster_view().get("members", []) if m.get("state") in ("running", "streaming")
    }


def leader() -> str | None:
    return next((name for name, role in roles().items() if role == "leader"), None)


def etcd_leader(via: str = "node3") -> str | None:
    """The node whose etcd member leads etcd (asked with ``via``'s etcd client certificate)."""
    pki = "/etc/etcd/pki"
    endpoints = ",".join(f"https://{address}:2379" for address in MESH.values())
    result = node(via).run(
        f"etcdctl --endpoints={endpoints} --cacert={pki}/ca.crt --cert={pki}/node.crt --key={pki}/node.key"
        " --dial-timeout=1s --command-timeout=3s endpoint status -w json"
    )
    try:
        answers = json.loads(result.stdout or "[]")
    except ValueError:
        return None
    by_id = {entry["Status"]["header"]["member_id"]: entry["Endpoint"] for entry in answers}
    leaders = {entry["Status"]["leader"] for entry in answers}
    if len(leaders) != 1:
        return None
    endpoint = by_id.get(leaders.pop(), "")
    return next((name for name, address in MESH.items() if f"//{address}:" in endpoint), None)


def sync_standby() -> str | None:
    return next((name for name, role in roles().items() if role == "sync_standby"), None)


def streaming_sync(standby: str) -> bool:
    members = {m["name"]: m for m in cluster_view().get("members", [])}
    member = members.get(standby, {})
    return member.get("role") == "sync_standby" and member.get("state") == "streaming"


@contextmanager
def writers(label: str, seconds: int) -> Iterator[list[tuple[float, str, int, float]]]:
    """Writers on the db node for ``seconds``; yields the list their log is read into at the end."""
    put("node1", WRITER_SCRIPT, WRITER)
    node("node1").run(f"chmod 755 {WRITER}; command -v bc >/dev/null || apt-get install -y -qq bc >/dev/null")
    node("node1").run(f"nohup {WRITER} {label} {seconds} >/dev/null 2>&1 &")
    rows: list[tuple[float, str, int, float]] = []
    try:
        yield rows
    finally:
        log = f"/var/lib/memoryctl/ha-{label}.log"
        wait_for(
            f"the {label} writers finished",
            lambda: node("node1").run(f"tail -1 {log}").stdout.strip() == "done",
            timeout=seconds + 300,
            interval=2,
        )
        for line in node("node1").check_output(f"cat {log}").splitlines():
            fields = line.split()
            if len(fields) == 4:
                rows.append((float(fields[0]), fields[1], int(fields[2]), float(fields[3])))


def stored(ids: list[str]) -> set[str]:
    """Which of ``ids`` the current primary holds (every drill write's text starts "ha drill")."""
    primary = leader()
    assert primary is not None, cluster_view()
    sql = "SELECT id FROM memories WHERE text LIKE 'ha drill %'"
    out = node(primary).check_output(f"sudo -u postgres psql -XAtd memoryctl -c {shlex.quote(sql)}")
    return set(out.split()) & set(ids)


def acknowledged(rows: list[tuple[float, str, int, float]]) -> list[str]:
    return [row[1] for row in rows if row[2] in (0, 3)]


def check_nothing_lost(label: str, rows: list[tuple[float, str, int, float]]) -> dict[str, Any]:
    acked = acknowledged(rows)
    held = stored(acked)
    lost = sorted(set(acked) - held)
    figures = {
        "requests": len(rows),
        "acknowledged": len(acked),
        "exit_codes": {str(rc): sum(1 for r in rows if r[2] == rc) for rc in sorted({r[2] for r in rows})},
        "stored_of_acknowledged": len(held),
        "lost": lost,
    }
    assert rows and not lost, (label, figures)
    return figures


# The conversion's result, once per session (the fixture is module-scoped, and test_reshape.py uses it too).
CONVERTED: dict[str, Any] = {}
SEED = "SELECT count(*), md5(string_agg(id::text || text, ',' ORDER BY id)) FROM memories"


def fingerprint() -> dict[str, Any]:
    """Every memory's id and text, as one count and one hash (read on node1, the first member)."""
    out = node("node1").check_output(f"sudo -u postgres psql -XAtd memoryctl -F ' ' -c {shlex.quote(SEED)}")
    count, digest = out.split()
    return {"memories": int(count), "md5": digest}


@pytest.fixture(scope="module")
def ha(request: pytest.FixtureRequest) -> dict[str, Any]:
    return convert(request)


def convert(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The single server (with the end-to-end data set and whatever the other tests wrote) converted
    in place to the inventory's Patroni cluster; then a second run that must change nothing.

    ``MEMORYCTL_DEPLOY_REUSE=1`` runs the drills on the nodes as they are (a developer's loop on an
    already converted cluster: CI never sets it).
    """
    if os.environ.get("MEMORYCTL_DEPLOY_REUSE") == "1":
        return {}
    if CONVERTED:  # test_reshape.py's drills, after these, on the cluster this module converted
        return CONVERTED
    request.getfixturevalue("imported")
    memoryctl("sync")
    before = fingerprint()
    # From here on: the inventory's Patroni cluster (an upgrade test's versions, if it ran, stay).
    BASE_OVERLAYS[:] = [path for path in BASE_OVERLAYS if path != SINGLE_SERVER]
    logs = REPO / ".cache"
    converted = run_deploy(logs / "deploy-convert.log")
    assert converted.returncode == 0 and converted.errors == 0, converted.output[-4000:]
    after = fingerprint()
    again = run_deploy(logs / "deploy-convert-second.log")
    figures = {
        "conversion": {**converted.figures(), "before": before, "after": after},
        "second_run": {**again.figures(), "changed_operations": again.changed_operations()},
    }
    record("ha_conversion", figures)
    assert again.returncode == 0 and again.changed_operations() == [], figures["second_run"]
    CONVERTED.update(before=before, after=after)
    return CONVERTED


def test_conversion_kept_the_single_servers_data(ha: dict[str, Any]) -> None:
    if not ha:  # says so instead of passing: only MEMORYCTL_DEPLOY_REUSE gets here (CI never sets it)
        pytest.skip("MEMORYCTL_DEPLOY_REUSE=1: no conversion ran in this session, nothing to compare")
    assert ha["after"] == ha["before"] and ha["before"]["memories"] > 1000, ha


def test_the_cluster_leads_from_the_db_node_with_a_synchronous_standby(ha: dict[str, Any]) -> None:
    wait_for("node2 is the streaming synchronous standby", lambda: streaming_sync("node2"), timeout=300)
    assert leader() == "node1", cluster_view()
    health = memoryctl("health", "--json")
    assert health.returncode == 0, health.stdout + health.stderr

    # Prometheus scrapes what the conversion added: every etcd member's metrics listener and both
    # Patroni members (issue 40 item 4), and every etcd member sees a leader.
    def scraped() -> dict[str, list[str]] | None:
        targets = [
            t for t in prometheus("/api/v1/targets")["activeTargets"] if t["labels"]["job"] in ("etcd", "patroni")
        ]
        up = {
            job: sorted(t["labels"]["node"] for t in targets if t["labels"]["job"] == job and t["health"] == "up")
            for job in ("etcd", "patroni")
        }
        return up if up == {"etcd": sorted(MESH), "patroni": ["node1", "node2"]} else None

    def with_leader() -> list[str] | None:
        found = prometheus("/api/v1/query?query=etcd_server_has_leader")["result"]
        nodes = sorted(r["metric"]["node"] for r in found if r["value"][1] == "1")
        return nodes if nodes == sorted(MESH) else None

    targets = lambda: prometheus("/api/v1/targets")["activeTargets"]  # noqa: E731
    jobs = wait_for("etcd and Patroni scraped on every member", scraped, timeout=180, interval=5, describe=targets)
    wait_for("every etcd member sees a leader", with_leader, timeout=60, interval=5)
    record("ha_cluster", {**cluster_view(), "scraped": jobs})


# On demand (`scripts/test --drills`): three deploy runs with two rolls, 9 minutes of CI's 60; it passed
# in the fresh-clone rehearsal of 2026-12-04 (50 -> 60 on both members, 388 writes, none failed).
@pytest.mark.drill
def test_max_connections_from_the_inventory_is_rolled_onto_every_member(ha: dict[str, Any], tmp_path: Path) -> None:
    """docs/ha.md "Settings Patroni owns": a raised ``max_connections`` reaches etcd through
    ``patronictl edit-config`` and both members through the roll (the standby first); the run
    after changes nothing; the inventory's own value back (a lowered one: primary, then standby)."""
    wait_for("node2 streams in sync", lambda: streaming_sync("node2"), timeout=300)

    def shown() -> dict[str, str]:
        return {m: node(m).check_output("sudo -u postgres psql -XAtc 'SHOW max_connections'").strip() for m in MEMBERS}

    before = shown()
    raised = int(before["node1"]) + 10
    logs = REPO / ".cache"
    bigger = overlay(tmp_path, {"postgres": {"max_connections": raised}})
    with writers("max-connections", 300) as rows:  # the roll comes at the end of the run
        rolled = run_deploy(logs / "deploy-max-connections.log", overlay=bigger)
    writes = check_nothing_lost("max-connections", rows)
    after = shown()
    again = run_deploy(logs / "deploy-max-connections-again.log", overlay=bigger)
    back = run_deploy(logs / "deploy-max-connections-back.log")
    record(
        "ha_max_connections",
        {
            "before": before,
            "after": after,
            "rolled": rolled.figures(),
            "writes": writes,  # a failed request: the primary's restart in place (docs/ha.md)
            "failed_requests": [row for row in rows if row[2] not in (0, 3)],
            "second_run": {**again.figures(), "changed_operations": again.changed_operations()},
            "back": {**back.figures(), "shown": shown()},
            "leader": leader(),
        },
    )
    assert rolled.returncode == 0 and rolled.errors == 0, rolled.output[-4000:]
    assert after == {m: str(raised) for m in MEMBERS}, after
    assert again.returncode == 0 and again.changed_operations() == [], again.changed_operations()
    assert back.returncode == 0 and shown() == before
    assert leader() == "node1"  # restarted in place: no switchover


def test_a_planned_switchover_fails_no_request(ha: dict[str, Any]) -> None:
    wait_for("node2 streams in sync", lambda: streaming_sync("node2"), timeout=300)
    events: dict[str, float] = {}
    with writers("switchover", 40) as rows:
        time.sleep(8)
        events["switchover"] = time.time()
        out = node("node1").check_output(
            "patronictl -c /etc/patroni/config.yml switchover --leader node1 --candidate node2 --force"
        )
        wait_for("node2 leads", lambda: leader() == "node2", timeout=120, interval=0.5)
        events["leader_changed"] = time.time()
    figures = check_nothing_lost("switchover", rows)
    failed = [row for row in rows if row[2] not in (0, 3)]
    # The new primary's node must not lead etcd too (deploy/patroni.py, etcd_leader_away): losing
    # both leaders at once costs an etcd election and a fresh lock ttl (the drill below).
    wait_for("etcd's leader is off the primary's node", lambda: etcd_leader() not in (None, "node2"), timeout=60)
    events["etcd_leader_apart"] = time.time()
    record(
        "ha_switchover",
        {**figures, "events": events, "etcd_leader": etcd_leader(), "patronictl": out[-500:], "requests_log": rows},
    )
    assert not failed, failed


def test_the_primary_loses_its_power_writes_come_back_and_it_rejoins(ha: dict[str, Any]) -> None:
    if leader() != "node2":  # the switchover above is what puts the primary on node2
        node("node1").check_output(
            "patronictl -c /etc/patroni/config.yml switchover --leader node1 --candidate node2 --force"
        )
        wait_for("node2 leads", lambda: leader() == "node2", timeout=120, interval=0.5)
    wait_for("node1 streams in sync", lambda: streaming_sync("node1"), timeout=300)
    events: dict[str, float] = {}
    wait_for("etcd's leader is off the primary's node", lambda: etcd_leader() not in (None, "node2"), timeout=60)
    with writers("failover", 90) as rows:
        time.sleep(10)
        etcd_leader_at_cut = etcd_leader()
        events["power_cut_started"] = time.time()
        kill = subprocess.run([str(CLUSTER), "kill", "node2"], cwd=REPO, capture_output=True, text=True)
        assert kill.returncode == 0, kill.stderr
        events["power_cut"] = time.time()  # every process of node2 is gone from here on
        wait_for("node1 leads", lambda: leader() == "node1", timeout=120, interval=0.5)
        events["leader_changed"] = time.time()
    # The first write acknowledged once node2 was gone (one in flight at the cut may finish first).
    first_ok = next(
        (row[0] + row[3] for row in rows if row[2] in (0, 3) and row[0] + row[3] > events["power_cut"]), None
    )
    figures = check_nothing_lost("failover", rows)
    events["first_write_acknowledged"] = first_ok or 0.0
    leader_change = events["leader_changed"] - events["power_cut_started"]
    outage = (first_ok - events["power_cut_started"]) if first_ok else None
    record(
        "ha_failover",
        {
            **figures,
            "events": events,
            "leader_change_s": round(leader_change, 1),
            "writes_back_s": round(outage, 1) if outage else None,
            "etcd_leader_at_cut": etcd_leader_at_cut,
            "etcd_leader_after": etcd_leader(),
            "requests_log": rows,
        },
    )
    # Patroni's part: the standby leads within the lock's ttl (20 s), a loop (3 s) and its probe
    # of the lost member. The first write back then waits at most [write] delivery_budget_s (3 s)
    # for the lost index node's Neo4j and Qdrant replica (exit 3: stored, delivery pending), and
    # the writes after it not at all (the breaker). The leader change is a figure (the report,
    # docs/ha.md); the leader did change (wait_for above) and writes came back.
    assert outage is not None, figures
    # The one timing asserted: issue 26's product promise, writes back within 30 s of a hard primary
    # loss. Measured 23.6 s locally and 25.7 s in the loaded fresh-clone CI rehearsal: a 4.3 s margin.
    assert outage < WRITES_BACK_WITHIN_S, (outage, figures)

    started = time.time()
    boot = subprocess.run([str(CLUSTER), "start", "node2"], cwd=REPO, capture_output=True, text=True)
    assert boot.returncode == 0, boot.stderr
    wait_for("node2 rejoins as the synchronous standby", lambda: streaming_sync("node2"), timeout=300, interval=1)
    journal = node("node2").check_output(
        f"journalctl -u patroni --no-pager -o cat --since @{int(started)} | grep -iE 'rewind|replica' | tail -20"
    )
    record("ha_rejoin", {"seconds": round(time.time() - started, 1), "patroni_log": journal})
    assert leader() == "node1"


def test_the_standby_lost_writes_continue_and_health_says_so(ha: dict[str, Any]) -> None:
    wait_for("node2 streams in sync", lambda: streaming_sync("node2"), timeout=300)
    primary = leader()
    standby = "node2" if primary == "node1" else "node1"
    node(standby).check_output("systemctl stop patroni")
    try:
        with writers("standby-lost", 20) as rows:
            pass
        figures = check_nothing_lost("standby-lost", rows)
        assert all(row[2] in (0, 3) for row in rows), figures
        health = memoryctl("health", "--json", "--deadline", "15")  # 15 s: a hang guard on a busy machine
        record("ha_standby_lost", {**figures, "health_rc": health.returncode, "health": health.stdout[-2000:]})
        # Degraded (exit 3), not healthy: the postgres component names the missing synchronous standby
        postgres = health.json()["components"][names.POSTGRES]
        assert health.returncode == ExitCode.PARTIAL and postgres["status"] == "degraded", health.stdout[-3000:]
        assert any(NO_SYNC_STANDBY in problem for problem in postgres["cluster"]["problems"]), postgres
    finally:
        node(standby).check_output("systemctl start patroni")
    wait_for(f"{standby} is the synchronous standby again", lambda: streaming_sync(standby), timeout=300)
    # node2 rebooted in the failover drill: its Neo4j (a JVM) may still be starting. The outbox holds
    # what it missed; sync answers 0 once every store took its deliveries (docs/operations.md).
    started = time.monotonic()
    wait_for("sync delivered the outbox", lambda: memoryctl("sync").returncode == 0, timeout=600, interval=10)
    reconcile = memoryctl("reconcile", "--json")
    record(
        "ha_reconcile",
        {"rc": reconcile.returncode, "out": reconcile.stdout[-1500:], "sync_s": round(time.monotonic() - started, 1)},
    )
    assert reconcile.returncode == 0, reconcile.stdout + reconcile.stderr


def test_backups_archive_from_the_primary_and_copy_the_standby(ha: dict[str, Any]) -> None:
    """pgBackRest on the cluster: WAL reaches the repository from the current primary (``check``),
    and a backup taken by the repository node reads the standby's files."""
    wait_for("a synchronous standby", lambda: sync_standby() is not None, timeout=300)
    repo = "sudo -u postgres pgbackrest --stanza=memoryctl --log-level-console=info"
    check = node("node3").run(f"{repo} check")
    assert check.rc == 0, check.stdout + check.stderr
    backup = node("node3").run(f"{repo} --type=incr backup")
    assert backup.rc == 0, backup.stdout[-3000:] + backup.stderr[-3000:]
    assert "wait for replay on the standby" in backup.stdout, backup.stdout[-3000:]
    record("ha_backup", {"leader": leader(), "standby": sync_standby(), "log": backup.stdout[-1500:]})


def test_the_derived_stores_restore_drill_on_the_cluster(ha: dict[str, Any]) -> None:
    """tests/deploy/test_restore_drills.py's drill (a) again, now that PostgreSQL is the cluster:
    Qdrant's collections and Neo4j's files lost, `memoryctl restore qdrant` and `rebuild graph`
    (reading the truth through the multi-host connection) bring back the same answers and payloads."""
    from tests.deploy.test_restore_drills import derived_stores_drill

    wait_for("a synchronous standby", lambda: sync_standby() is not None, timeout=300)
    derived_stores_drill(len(e2e_data.build().records), "ha_drill_derived_stores")  # imported by `ha`


def test_point_in_time_restore_on_the_cluster(ha: dict[str, Any]) -> None:
    """docs/ha.md "Point-in-time restore on the cluster", step by step: the database dropped on
    the primary, both members stopped, the cluster's state in etcd removed, pgBackRest restores the
    first member to a time T, Patroni takes the restored server over (as at the conversion) and
    the standby is cloned again (``patronictl reinit``). Every table as it was at T, the memories
    written after T gone (reconcile drops them from the derived stores), the standby in sync."""
    from tests.deploy.test_restore_drills import content, present, write

    wait_for("a synchronous standby", lambda: sync_standby() is not None, timeout=300)
    if leader() != "node1":  # the procedure restores on the db node (memoryctl's and cron's node)
        node("node1").check_output(f"{PATRONICTL} switchover --leader {leader()} --candidate node1 --force")
        wait_for("node1 leads", lambda: leader() == "node1", timeout=120, interval=0.5)
    scope = node("node1").check_output("sed -n 's/^scope: //p' /etc/patroni/config.yml").strip()
    repo = "sudo -u postgres pgbackrest --stanza=memoryctl"
    marker = "/etc/memoryctl/maintenance"  # docs/ha.md: set first, so no deploy starts Patroni meanwhile
    try:
        for member in ("node1", "node2"):
            node(member).check_output(f"mkdir -p /etc/memoryctl && echo 'point-in-time restore drill' > {marker}")
        sh(DB, "systemctl stop cron memoryctl-serve")  # no writers while we look
        running = "SELECT count(*) FROM maintenance_runs WHERE status = 'running'"
        wait_for("no maintenance run in progress", lambda: psql(running) == "0", timeout=300, interval=2)
        _, backup_s = timed(lambda: sh(OPS, f"{repo} --type=incr backup"))  # from the standby
        run = int(time.time())  # the ids are derived from the names: a rerun on the same nodes writes new ones
        replayed = write(f"cluster-before-t-{run}", 20)
        expected = content()
        target = psql("SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US+00')")
        lost = write(f"cluster-after-t-{run}", 10)
        psql("DROP DATABASE memoryctl WITH (FORCE)", database="postgres")
        psql("SELECT pg_switch_wal()", database="postgres")
        wait_for(
            "WAL archived up to the drop",
            lambda: psql("SELECT count(*) FROM pg_ls_archive_statusdir() WHERE name LIKE '%.ready'", "postgres") == "0",
            timeout=60,
        )
        events = {"started": time.time()}
        node("node2").check_output("systemctl stop patroni")  # the standby first: it must not take over
        node("node1").check_output("systemctl stop patroni")
        answers = f"{scope}\nYes I am aware\nnode1\n"  # the last: asked only if a leader key were left
        removed = node("node1").run(f"printf {shlex.quote(answers)} | {PATRONICTL} remove {scope}")
        assert removed.rc == 0, removed.stdout + removed.stderr
        sh(DB, f"{repo} --delta --type=time --target={shlex.quote(target)} --target-action=promote restore")
        sh(DB, f"sudo -u postgres pg_ctlcluster {PG_VERSION} main start")
        wait_for("recovery finished", lambda: psql("SELECT pg_is_in_recovery()", "postgres") == "f", timeout=300)
        events["restored"] = time.time()
        sh(DB, f"sudo -u postgres pg_ctlcluster {PG_VERSION} main stop")
        node("node1").check_output("systemctl start patroni")
        wait_for("node1 leads the restored data", lambda: leader() == "node1", timeout=300, interval=1)
        events["leader"] = time.time()
        node("node2").check_output("systemctl start patroni")
        wait_for("node2 is a member again", lambda: "node2" in roles() or _member_known("node2"), timeout=300)
        reinit = node("node1").run(f"{PATRONICTL} reinit {scope} node2 --force --wait")
        assert reinit.rc == 0, reinit.stdout + reinit.stderr
        wait_for("node2 is the synchronous standby", lambda: streaming_sync("node2"), timeout=600, interval=2)
        events["standby_in_sync"] = time.time()
        assert present(replayed | lost) == replayed, "the writes between the backup and T, and none after T"
        assert content() == expected
    finally:  # the db node's writers come back and the marker goes, whatever happened
        sh(DB, "systemctl start cron memoryctl-serve")
        for member in ("node1", "node2"):
            node(member).check_output(f"rm -f {marker}")
    found = memoryctl("reconcile", "--json").json()
    assert found["drift"] >= len(lost), found
    repaired = memoryctl("reconcile", "--repair", "--json")
    assert repaired.returncode == 0, repaired.stdout[-2000:]
    drift = memoryctl("reconcile", "--json")
    assert drift.returncode == 0 and drift.json()["drift"] == 0, drift.stdout[-2000:]
    record(
        "ha_point_in_time_restore",
        {
            "incremental_backup_s": backup_s,
            "seconds_from_stop": {k: round(v - events["started"], 1) for k, v in events.items()},
            "replayed_from_wal": len(replayed),
            "after_target_dropped": len(lost),
            "timeline": cluster_view().get("members", []),
            "reinit": reinit.stdout[-800:],
        },
    )


def _member_known(name: str) -> bool:
    return any(m.get("name") == name for m in cluster_view().get("members", []))
