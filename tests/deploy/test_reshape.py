"""The cluster changes shape under writers (issue 39, docs/operations.md "Replace a node", "Add a
node"): each drill on the local nodes, after test_ha.py's drills, on the Patroni cluster.

1. **node2 replaced**: the synchronous standby's node -- also an etcd member, a Qdrant peer and the
   Neo4j node -- destroyed (power cut, disk deleted) and booted blank under the same name
   (``scripts/cluster replace``), then one ordinary deploy run. Writers add memories through the
   service on node1 the whole time.
2. **node1 replaced**: the primary's node destroyed: Patroni fails over to node2; node1 booted blank;
   one deploy run clones it as a standby. Writers run on node3 (the service's node is the one
   destroyed), with memoryctl's one-shot CLI.
3. **node4 added and removed**: a fourth node as a storage-only Qdrant peer (no role, no etcd vote);
   the deploy moves replicas onto it until the peers hold them evenly within one; then it is
   dropped from the inventory and a deploy drains it first. Writes and queries go on meanwhile with
   0 failed requests.
4. **A rolled upgrade**: newer builds of patroni, etcd and postgresql-17 in a signed repository the
   nodes read; ``components.upgrades.held: roll`` and one deploy run upgrade every node, at most one
   switchover, 0 failed writes or queries (deploy/package_roll.py).

Each drill: every acknowledged write in PostgreSQL afterwards, then delivered to Qdrant and Neo4j
(reconcile 0 drift), the second run changes nothing; the transcript (timestamps of destroyed, deploy
started, member joined, synchronous, replicas complete) goes to the deploy report.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import e2e_data
from tests.deploy.cluster import CLUSTER, MESH, REPO, fetch, memoryctl, node, peer_api, put, run_deploy, wait_for
from tests.deploy.conftest import record
from tests.deploy.test_ha import PATRONICTL, acknowledged, cluster_view, convert, leader, streaming_sync

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

WRITER = "/usr/local/sbin/memoryctl-reshape-writer"
# Until the stop file exists: one memory (or, with a second argument, a query) every 0.5 s; each
# line: start (epoch s), id, exit code, seconds. Runs as the memoryctl user, as cron's jobs do.
WRITER_SCRIPT = """#!/bin/sh
label=$1; mode=${2:-add}; log=/var/lib/memoryctl/reshape-$label.log; stop=/run/reshape-$label.stop
: > "$log"; rm -f "$stop"; n=0
while [ ! -e "$stop" ]; do
  n=$((n+1)); id=$(cat /proc/sys/kernel/random/uuid); t=$(date +%s.%N)
  if [ "$mode" = query ]; then
    cd /var/lib/memoryctl && sudo -u memoryctl OMP_NUM_THREADS=1 timeout 120 memoryctl query --agent default \
      --limit 3 "reshape drill $label" >/dev/null 2>>"/var/lib/memoryctl/reshape-$label.err"
  else
    cd /var/lib/memoryctl && sudo -u memoryctl OMP_NUM_THREADS=1 timeout 120 memoryctl add --id "$id" \
      "reshape drill $label write $n" >/dev/null 2>>"/var/lib/memoryctl/reshape-$label.err"
  fi
  rc=$?; echo "$t $id $rc $(echo "$(date +%s.%N) - $t" | bc)" >> "$log"; sleep 0.5
done
echo done >> "$log"
"""
Row = tuple[float, str, int, float]
# The add-a-node drill's fourth node (scripts/cluster start node4): a storage-only Qdrant peer.
NODE4 = {"public": "10.78.0.4", "mesh": "10.77.0.4", "roles": []}


@contextmanager
def writers(label: str, on: str = "node1", mode: str = "add") -> Iterator[list[Row]]:
    """Writers (or queries) on ``on`` until the block ends; yields the list their log is read into."""
    put(on, WRITER_SCRIPT, WRITER)
    node(on).run(f"chmod 755 {WRITER}; command -v bc >/dev/null || apt-get install -y -qq bc >/dev/null")
    node(on).run(f"nohup {WRITER} {label} {mode} >/dev/null 2>&1 &")
    rows: list[Row] = []
    try:
        yield rows
    finally:
        log = f"/var/lib/memoryctl/reshape-{label}.log"
        node(on).run(f"touch /run/reshape-{label}.stop")
        wait_for(f"the {label} writers finished", lambda: node(on).run(f"tail -1 {log}").stdout.strip() == "done", 300)
        for line in node(on).check_output(f"cat {log}").splitlines():
            fields = line.split()
            if len(fields) == 4:
                rows.append((float(fields[0]), fields[1], int(fields[2]), float(fields[3])))


class Transcript:
    """Timestamps of what a drill waits for, polled in the background while the deploy runs.

    Polling starts at :meth:`cut` (the node destroyed); each condition is timed at the first poll
    that finds it holding after a poll found it not holding since the cut (``<event>_lost`` is
    when it was first seen gone): a condition that never went away is not a recovery.
    """

    def __init__(self, checks: dict[str, Callable[[], bool]]) -> None:
        self.started = time.time()
        self.events: dict[str, float] = {}
        self._checks = checks
        self._stop = threading.Event()
        self._cut = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def mark(self, event: str) -> None:
        self.events.setdefault(event, time.time())

    def cut(self, event: str) -> None:
        self.mark(event)
        self._cut.set()

    def _holds(self, check: Callable[[], bool]) -> bool:
        try:
            return bool(check())
        except Exception:  # a node that is being recreated does not answer
            return False

    def _poll(self) -> None:
        self._cut.wait()
        while not self._stop.is_set():
            for event, check in self._checks.items():
                if event in self.events:
                    continue
                holds = self._holds(check)
                if not holds:
                    self.mark(f"{event}_lost")
                elif f"{event}_lost" in self.events:
                    self.mark(event)
            self._stop.wait(2)

    def __enter__(self) -> Transcript:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._cut.set()
        self._thread.join(timeout=60)

    def between(self, first: str, then: str) -> float | None:
        if first not in self.events or then not in self.events:
            return None
        return round(self.events[then] - self.events[first], 1)

    def figures(self) -> dict[str, float]:
        return {event: round(at - self.started, 1) for event, at in sorted(self.events.items(), key=lambda e: e[1])}


def etcd_members(via: str = "node3") -> dict[str, bool]:
    """etcd's members by name, each with whether it answers healthy (asked with ``via``'s certificate)."""
    pki = "--cacert=/etc/etcd/pki/ca.crt --cert=/etc/etcd/pki/node.crt --key=/etc/etcd/pki/node.key"
    endpoints = ",".join(f"https://{address}:2379" for address in MESH.values())
    listed = node(via).run(f"etcdctl --endpoints={endpoints} {pki} --dial-timeout=1s member list -w json")
    members = json.loads(listed.stdout or "{}").get("members", [])
    health = {}
    for member in members:
        urls = ",".join(member.get("clientURLs") or [])
        ok = bool(urls) and node(via).run(f"etcdctl --endpoints={urls} {pki} --dial-timeout=1s endpoint health").rc == 0
        health[member.get("name") or "(unstarted)"] = ok
    return health


def shard_layout(via: str = "node1") -> dict[str, Any]:
    """Per collection: each shard's replicas (peer node name -> state), and replicas per peer."""
    peers = peer_api(via, "/cluster")["peers"]
    known = {**MESH, "node4": NODE4["mesh"]}  # the add-a-node drill's fourth peer is named too
    names = {
        int(pid): next((n for n, a in known.items() if f"//{a}:" in p["uri"]), p["uri"]) for pid, p in peers.items()
    }
    layout: dict[str, Any] = {}
    for collection in peer_api(via, "/collections")["collections"]:
        name = collection["name"]
        info = peer_api(via, f"/collections/{name}/cluster")
        shards: dict[int, dict[str, str]] = {}
        for shard in info["local_shards"]:
            shards.setdefault(shard["shard_id"], {})[names.get(info["peer_id"], str(info["peer_id"]))] = shard["state"]
        for shard in info["remote_shards"]:
            shards.setdefault(shard["shard_id"], {})[names.get(shard["peer_id"], str(shard["peer_id"]))] = shard[
                "state"
            ]
        per_peer = {peer: sum(peer in replicas for replicas in shards.values()) for peer in names.values()}
        layout[name] = {"shards": {str(s): r for s, r in sorted(shards.items())}, "per_peer": per_peer}
    return layout


def replicas_complete(expected_peers: set[str], factor: int = 2) -> bool:
    """Every shard of every collection has ``factor`` Active replicas, all on ``expected_peers``, and
    the peers hold replicas evenly within one."""
    for collection in shard_layout().values():
        for replicas in collection["shards"].values():
            if sorted(replicas.values()) != ["Active"] * factor or not set(replicas) <= expected_peers:
                return False
        counts = [collection["per_peer"].get(peer, 0) for peer in expected_peers]
        if max(counts) - min(counts) > 1:
            return False
    return True


def stored(ids: list[str], on: str) -> set[str]:
    sql = "SELECT id FROM memories WHERE text LIKE 'reshape drill %'"
    out = node(on).check_output(f"sudo -u postgres psql -XAtd memoryctl -c {shlex.quote(sql)}")
    return set(out.split()) & set(ids)


def settle_and_reconcile(on: str = "node1") -> dict[str, Any]:
    """The outbox delivered to every store, then reconcile: 0 drift (every acknowledged write in
    Qdrant and Neo4j too, nothing extra)."""
    started = time.monotonic()
    wait_for("sync delivered the outbox", lambda: memoryctl("sync", on=on).returncode == 0, timeout=900, interval=10)
    reconcile = memoryctl("reconcile", "--json", on=on)
    assert reconcile.returncode == 0, reconcile.stdout[-2000:] + reconcile.stderr[-2000:]
    found = reconcile.json()
    assert found["drift"] == 0, found
    return {"sync_s": round(time.monotonic() - started, 1), "drift": found["drift"]}


def replace(name: str) -> None:
    result = subprocess.run([str(CLUSTER), "replace", name], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def deploy_twice(label: str, overlay: Path | None = None) -> dict[str, Any]:
    """One deploy run that must succeed, then one that must change nothing."""
    logs = REPO / ".cache"
    first = run_deploy(logs / f"deploy-{label}.log", overlay=overlay)
    assert first.returncode == 0 and first.errors == 0, first.output[-5000:]
    second = run_deploy(logs / f"deploy-{label}-second.log", overlay=overlay)
    assert second.returncode == 0 and second.changed_operations() == [], second.changed_operations()
    return {"deploy": first.figures(), "second_run": {**second.figures(), "changed": second.changed}}


def lost_writes(label: str, rows: list[Row], on: str) -> dict[str, Any]:
    acked = acknowledged(rows)
    held = stored(acked, on)
    figures = {
        "requests": len(rows),
        "acknowledged": len(acked),
        "exit_codes": {str(rc): sum(1 for r in rows if r[2] == rc) for rc in sorted({r[2] for r in rows})},
        "stored_of_acknowledged": len(held),
        "lost": sorted(set(acked) - held),
    }
    assert rows and not figures["lost"], (label, figures)
    return figures


@pytest.fixture(scope="module")
def ha(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The Patroni cluster test_ha.py converted (converted here when this module runs alone)."""
    return convert(request)


def _node_state(name: str) -> dict[str, Callable[[], bool]]:
    """What a replaced node's return is measured by: etcd member healthy, PostgreSQL the streaming
    synchronous standby (when a Patroni member), Qdrant replicas complete, Neo4j answering."""
    return {
        "etcd_member_healthy": lambda: etcd_members().get(name, False),
        "synchronous_standby": lambda: streaming_sync(name),
        "replicas_complete": lambda: replicas_complete(set(MESH)),
    }


def test_the_synchronous_standbys_node_replaced_blank_comes_back_in_one_run(ha: dict[str, Any]) -> None:
    wait_for("node2 streams in sync", lambda: streaming_sync("node2"), timeout=300)
    assert leader() == "node1", cluster_view()
    before = shard_layout()
    with writers("replace-node2") as rows, Transcript(_node_state("node2")) as transcript:
        time.sleep(5)
        transcript.cut("destroyed")
        replace("node2")
        transcript.mark("booted_blank")
        transcript.mark("deploy_started")
        runs = deploy_twice("replace-node2")
        transcript.mark("deploy_finished")
        wait_for("node2 is the synchronous standby", lambda: streaming_sync("node2"), timeout=300)
        wait_for("replicas complete", lambda: replicas_complete(set(MESH)), timeout=300, describe=shard_layout)
        time.sleep(5)
    figures = lost_writes("replace-node2", rows, "node1")
    delivered = settle_and_reconcile()
    events = transcript.figures()
    record(
        "reshape_replace_node2",
        {
            **figures,
            **runs,
            **delivered,
            "transcript_s": events,
            "without_sync_standby_s": transcript.between("synchronous_standby_lost", "synchronous_standby"),
            "etcd": etcd_members(),
            "layout_before": before,
            "layout_after": shard_layout(),
        },
    )
    assert set(etcd_members().values()) == {True} and len(etcd_members()) == 3
    assert replicas_complete(set(MESH))
    # Neo4j rebuilt and answering. A Neo4j just started and refilled plans its first queries cold and
    # can miss the 2 s store timeout (docs/operations.md, "After a Neo4j restart"): asked until it answers.
    graph = ("query", "--agent", e2e_data.AGENT, "--json", "--entity", "person:p00", "--via", "AUTHORED")
    wait_for("a graph query answers", lambda: memoryctl(*graph).returncode == 0, timeout=300, interval=5)


def _node1_leads_node2_in_sync() -> None:
    """The drills' starting point, whatever the drill before left (the node1 drill leaves node2
    leading): a synchronous standby first, a switchover to node1 if another node leads, then node2
    the streaming synchronous standby."""
    wait_for("a synchronous standby", lambda: any(streaming_sync(name) for name in ("node1", "node2")), timeout=300)
    if leader() != "node1":
        node("node2").check_output(f"{PATRONICTL} switchover --leader {leader()} --candidate node1 --force")
        wait_for("node1 leads", lambda: leader() == "node1", timeout=120, interval=0.5)
    wait_for("node2 streams in sync", lambda: streaming_sync("node2"), timeout=300)


@pytest.mark.drill
def test_the_primarys_node_replaced_blank_fails_over_then_comes_back_in_one_run(ha: dict[str, Any]) -> None:
    """node1 -- the primary, memoryctl's service and cron, an etcd member and a Qdrant peer -- destroyed:
    Patroni promotes node2; node1 booted blank and one deploy run clones it as the standby (never
    initialised with a database of its own) and installs memoryctl on it again. Writers on node3."""
    _node1_leads_node2_in_sync()
    checks = {**_node_state("node1"), "failed_over": lambda: leader() == "node2"}
    with writers("replace-node1", on="node3") as rows, Transcript(checks) as transcript:
        time.sleep(5)
        transcript.cut("destroyed")
        replace("node1")
        transcript.mark("booted_blank")
        wait_for("node2 leads", lambda: leader() == "node2", timeout=180, interval=1)
        transcript.mark("deploy_started")
        runs = deploy_twice("replace-node1")
        transcript.mark("deploy_finished")
        wait_for("node1 is the synchronous standby", lambda: streaming_sync("node1"), timeout=300)
        wait_for("replicas complete", lambda: replicas_complete(set(MESH)), timeout=300, describe=shard_layout)
        time.sleep(5)
    figures = lost_writes("replace-node1", rows, "node2")
    delivered = settle_and_reconcile()
    record(
        "reshape_replace_node1",
        {
            **figures,
            **runs,
            **delivered,
            "transcript_s": transcript.figures(),
            "etcd": etcd_members(),
            "layout_after": shard_layout(),
        },
    )
    assert leader() == "node2" and set(etcd_members().values()) == {True}
    health = memoryctl("health", "--json")
    assert health.returncode == 0, health.stdout[-3000:]


def _overlay(tmp: Path, label: str, doc: dict[str, Any]) -> Path:
    path = tmp / f"{label}.yaml"
    path.write_text(yaml.safe_dump({"cluster": "local", **doc}))
    return path


PEERS = ["node1", "node2", "node3"]


def failed(rows: list[Row]) -> list[Row]:
    """Requests that failed: anything but 0 (done) and 3 (a write stored with a delivery pending, a
    query answered with a store degraded)."""
    return [row for row in rows if row[2] not in (0, 3)]


@pytest.mark.drill
def test_a_fourth_qdrant_peer_joins_gets_replicas_and_is_drained_again(ha: dict[str, Any], tmp_path: Path) -> None:
    """node4 as a storage-only Qdrant peer: no role, no etcd vote (etcd stays three members). Joined
    by adding it to the inventory and deploying; removed in the documented two steps: out of
    ``qdrant.peers`` (the deploy drains it: replicas moved off, peer removed, Qdrant stopped), then
    out of ``nodes`` (the mesh forgets it)."""
    started = subprocess.run([str(CLUSTER), "start", "node4"], cwd=REPO, capture_output=True, text=True, check=False)
    assert started.returncode == 0, started.stdout + started.stderr
    grown = _overlay(
        tmp_path, "grown", {"nodes": {"node4": NODE4}, "components": {"qdrant": {"peers": [*PEERS, "node4"]}}}
    )
    draining = _overlay(tmp_path, "draining", {"nodes": {"node4": NODE4}, "components": {"qdrant": {"peers": PEERS}}})
    before = shard_layout()
    figures: dict[str, Any] = {"layout_before": before}
    try:
        with writers("grow") as writes, writers("grow-queries", mode="query") as queries:
            figures["add"] = deploy_twice("add-node4", overlay=grown)
            figures["layout_with_node4"] = shard_layout()
            assert replicas_complete({*PEERS, "node4"}), figures["layout_with_node4"]
            assert sorted(etcd_members()) == PEERS  # no etcd vote for node4
            figures["drain"] = deploy_twice("drain-node4", overlay=draining)
            figures["layout_drained"] = shard_layout()
            assert replicas_complete(set(PEERS)), figures["layout_drained"]
            assert node("node1").run("curl -s http://10.77.0.4:6333/ -m 3").rc != 0  # its Qdrant stopped
            figures["forget"] = deploy_twice("forget-node4")
    finally:
        subprocess.run([str(CLUSTER), "destroy", "node4"], cwd=REPO, capture_output=True, text=True, check=False)
    figures["writes"] = lost_writes("grow", writes, "node1")
    figures["queries"] = {"requests": len(queries), "failed": failed(queries)}
    figures.update(settle_and_reconcile())
    record("reshape_add_remove_node4", figures)
    assert failed(writes) == [] and failed(queries) == [] and len(queries) > 10, figures


ROLLED = ["patroni", "etcd-server", "etcd-client", "postgresql-17", "postgresql-client-17"]
SUFFIX = "+memoryctl.roll1"
UPDATES_SOURCE = "/etc/apt/sources.list.d/memoryctl-drill-updates.sources"
UPDATES_KEY = "/etc/apt/keyrings/memoryctl-drill-updates.asc"


def newer_builds(tmp: Path) -> list[Path]:
    """The nodes' own patroni, etcd and PostgreSQL 17 packages rebuilt one version up (``+memoryctl.roll1``,
    exact-version dependencies between them moved along): a point release as apt sees it, with the same
    maintainer scripts (patroni's postinst restarts Patroni, etcd-server's etcd)."""
    node("node1").check_output(
        f"rm -rf /root/roll && mkdir /root/roll && cd /root/roll && apt-get download -q {' '.join(ROLLED)}"
    )
    built = []
    for name in node("node1").check_output("ls /root/roll").split():
        original, unpacked = tmp / name, tmp / f"{name}.d"
        original.write_bytes(fetch("node1", f"/root/roll/{name}"))
        subprocess.run(["dpkg-deb", "-R", str(original), str(unpacked)], check=True)
        control = unpacked / "DEBIAN" / "control"
        text = control.read_text()
        version = next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("Version: "))
        control.write_text(
            text.replace(f"Version: {version}", f"Version: {version}{SUFFIX}").replace(
                f"(= {version})", f"(= {version}{SUFFIX})"
            )
        )
        out = tmp / name.replace(".deb", "-roll.deb")
        subprocess.run(["dpkg-deb", "-Zxz", "-b", str(unpacked), str(out)], check=True, capture_output=True)
        built.append(out)
    return built


def serve_updates(debs: list[Path]) -> None:
    """The newer builds in the stand-in's signed ``updates/`` repository, every node reading it."""
    served = subprocess.run(
        [str(REPO / "scripts" / "standin"), "updates", *map(str, debs)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert served.returncode == 0, served.stdout + served.stderr
    key = (REPO / ".cache" / "standin" / "www" / "packagecloud.io" / "timescale" / "timescaledb" / "gpgkey").read_text()
    source = f"Types: deb\nURIs: {served.stdout.strip()}\nSuites: ./\nSigned-By: {UPDATES_KEY}\n"
    for name in MESH:
        node(name).check_output(f"mkdir -p {Path(UPDATES_KEY).parent}")
        put(name, key, UPDATES_KEY)
        put(name, source, UPDATES_SOURCE)
        node(name).check_output("apt-get update -qq")


def versions(name: str) -> dict[str, str]:
    out = node(name).check_output(
        "dpkg-query -W -f '${Package} ${Version} ${db:Status-Status}\\n' " + " ".join(ROLLED) + " 2>/dev/null || true"
    )
    return {f[0]: f[1] for f in (line.split() for line in out.splitlines()) if len(f) == 3 and f[2] == "installed"}


def timeline() -> int:
    """Patroni's timeline: one more for every promotion (a switchover or a failover)."""
    return int(json.loads(node("node1").check_output(f"{PATRONICTL} list -f json"))[0].get("TL", 0))


@pytest.mark.drill
def test_a_rolled_upgrade_of_patroni_etcd_and_postgresql_fails_nothing_and_switches_over_once(
    ha: dict[str, Any], tmp_path: Path
) -> None:
    """Newer builds of patroni, etcd-server/-client and postgresql-17 published in a signed repository
    every node reads; ``components.upgrades.held: roll`` and one deploy run: node2 and node3 first,
    one switchover, then node1. Writes and queries go on throughout with 0 failed requests."""
    _node1_leads_node2_in_sync()
    serve_updates(newer_builds(tmp_path))
    before = {name: versions(name) for name in MESH}
    timeline_before = timeline()
    rolled = _overlay(tmp_path, "rolled", {"components": {"upgrades": {"held": "roll"}}})
    figures: dict[str, Any] = {"before": before}
    try:
        with writers("roll") as writes, writers("roll-queries", mode="query") as queries:
            figures["runs"] = deploy_twice("package-roll", overlay=rolled)
            time.sleep(5)
    finally:
        for name in MESH:
            node(name).run(f"rm -f {UPDATES_SOURCE} {UPDATES_KEY} && apt-get update -qq")
    figures["after"] = after = {name: versions(name) for name in MESH}
    figures["switchovers"] = timeline() - timeline_before
    figures["leader"] = leader()
    figures["writes"] = lost_writes("roll", writes, leader())
    figures["queries"] = {"requests": len(queries), "failed": failed(queries)}
    figures.update(settle_and_reconcile())
    record("reshape_package_roll", figures)
    for name in MESH:
        assert before[name] and all(version.endswith(SUFFIX) for version in after[name].values()), (name, after)
        assert after[name].keys() == before[name].keys()
    assert figures["switchovers"] <= 1 and leader() in ("node1", "node2"), figures
    assert failed(writes) == [] and failed(queries) == [] and len(queries) > 10, figures
    assert streaming_sync("node1" if leader() == "node2" else "node2")
