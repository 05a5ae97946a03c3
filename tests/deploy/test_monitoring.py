"""Monitoring and backups on the deployed cluster, seen from the outside.

- The backup side is up: pgBackRest has a backup and WAL archiving works (`memoryctl backup
  status`), every Prometheus target is up, memoryctl's own metrics arrive.
- The dead-man's switch: the always-firing Watchdog reaches the heartbeat path of the same webhook
  every heartbeat interval, and never the operator's receiver (the arrival times and the intervals
  between them go to the deploy report).
- The alert test: Qdrant stopped on the index node → QdrantDown fires in Prometheus and reaches
  the operator: Alertmanager sends it to the receiver the inventory configures — on the local nodes
  a webhook the test runs on the monitoring node records every notification — and the test waits
  for the notification with its labels and runbook link, delivered once although two Prometheus
  send it to two Alertmanagers; started again → the resolved notification. The transcript and
  timings go to the deploy report (figures, not assertions).
- The HA drill (docs/monitoring.md, "Two of each"): with one monitoring node's Alertmanager and
  the other's Prometheus stopped at once, the same alert still arrives (through the one path left,
  from the first's Prometheus to the second's Alertmanager), once, and the Watchdog's pings never
  pause for long.
"""

from __future__ import annotations

import itertools
import json
import shlex
import time
import urllib.parse
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from deploy.components import RUNBOOK_BASE
from tests.deploy import e2e_data
from tests.deploy.cluster import MESH, REPO, memoryctl, node, wait_for
from tests.deploy.conftest import record

pytestmark = pytest.mark.deploy

DB, INDEX, OPS = "node1", "node2", "node3"
# Prometheus and Alertmanager: the pair inventory/local.yaml names (components.monitoring.nodes).
MONITORS = ("node1", "node2")


def sh(name: str, command: str, timeout: int = 600) -> str:
    result = node(name).run(f"timeout {timeout} sh -c {shlex.quote(command)}")
    assert result.rc == 0, f"{name}: {command}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    return str(result.stdout)


def psql(sql: str, database: str = "memoryctl") -> str:
    return sh(DB, f"sudo -u postgres psql -XAt -v ON_ERROR_STOP=1 -d {database} -c {shlex.quote(sql)}").strip()


def prometheus(path: str, on: str = MONITORS[0]) -> Any:
    """``GET path`` on a monitoring node's Prometheus (its mesh address, asked from that node)."""
    script = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    out = sh(on, f"python3 -c {shlex.quote(script)} {shlex.quote(f'http://{MESH[on]}:9090{path}')}")
    return json.loads(out)["data"]


def timed(fn: Any) -> Any:
    started = time.monotonic()
    result = fn()
    return result, round(time.monotonic() - started, 1)


def test_backups_are_taken_and_monitored(imported: e2e_data.DataSet) -> None:
    status = memoryctl("backup", "status", "--json")
    report = status.json()
    postgres = report["stores"]["postgres"]
    assert postgres["error"] is None and postgres["count"] >= 1 and postgres["newest_restorable"], postgres
    assert not postgres["archive_failing"]
    targets = wait_for(
        "every Prometheus target up",
        lambda: (
            all(t["health"] == "up" for t in prometheus("/api/v1/targets")["activeTargets"])
            and prometheus("/api/v1/targets")["activeTargets"]
        ),
        timeout=120,
    )
    jobs = sorted({t["labels"]["job"] for t in targets})
    assert jobs == ["alertmanager", "node", "postgres", "prometheus", "qdrant", "vllm"], jobs
    # memoryctl's own metrics arrive through the textfile collector: run the cron lines now (as cron
    # would, as their user) instead of waiting up to five minutes for them.
    for line in sh(DB, "cat /etc/cron.d/memoryctl-metrics").splitlines():
        if "--prometheus" in line and not line.startswith("#"):
            user, command = line.split(None, 6)[5:]
            sh(DB, f"sudo -u {user} sh -c {shlex.quote(command)}")
    sh(DB, "/usr/local/sbin/memoryctl-wal-metrics")  # the archive queue (issue 40), as cron runs it each minute
    sh(OPS, "/usr/local/sbin/memoryctl-gpu-metrics")  # the gpu node's GPU (its nvidia-smi STAND-IN here)
    for metric in (
        "memoryctl_healthy",
        "memoryctl_backup_last_success_timestamp_seconds",
        "memoryctl_wal_archive_queue_max_bytes",
        'memoryctl_gpu_memory_used_bytes{name="STAND-IN (no GPU)"}',
        "vllm:num_requests_waiting",
    ):
        query = urllib.parse.quote(metric)
        wait_for(f"{metric} in Prometheus", lambda q=query: prometheus(f"/api/v1/query?query={q}")["result"], 60)
    # The GPU collector ran against the stand-in: up, and the vLLM stand-ins' memory as its "used".
    (gpu_used,) = prometheus("/api/v1/query?query=memoryctl_gpu_memory_used_bytes")["result"]
    (gpu_up,) = prometheus("/api/v1/query?query=memoryctl_gpu_up")["result"]
    assert gpu_up["value"][1] == "1" and float(gpu_used["value"][1]) > 0, (gpu_up, gpu_used)
    # The queue limit Prometheus sees is the one pgBackRest enforces on the db node.
    limit = sh(DB, "sed -n 's/^archive-push-queue-max=//p' /etc/pgbackrest.conf").strip()
    query = urllib.parse.quote(f'memoryctl_wal_archive_queue_max_bytes{{node="{DB}"}}')
    (series,) = prometheus(f"/api/v1/query?query={query}")["result"]
    assert int(limit) > 0 and series["value"][1] == limit, (limit, series)
    record("daytwo_targets", {"up": len(targets), "jobs": jobs})


def firing(alertname: str, node_name: str, on: str = MONITORS[0]) -> dict[str, Any] | None:
    for alert in prometheus("/api/v1/alerts", on)["alerts"]:
        labels = alert["labels"]
        if labels["alertname"] == alertname and labels.get("node") == node_name:
            return dict(alert)
    return None


# The receivers inventory/local.yaml configures: Alertmanager on the monitoring node posts to the
# controller's stand-in server (scripts/standin, /alertsink/), which keeps one JSON line per
# notification ({"t": its clock, "path": "/alerts" or "/heartbeat", "body": Alertmanager's JSON}).
ALERT_SINK = REPO / ".cache" / "standin" / "alertsink.jsonl"


def webhook_records() -> list[dict[str, Any]]:
    """Every notification the operator's sink received so far, in order."""
    if not ALERT_SINK.exists():
        return []
    return [json.loads(line) for line in ALERT_SINK.read_text().splitlines() if line.strip()]


def _names(record_: dict[str, Any]) -> set[str]:
    return {alert["labels"]["alertname"] for alert in record_["body"]["alerts"]}


def heartbeats() -> list[float]:
    """When the Watchdog reached the heartbeat path (receiver ``heartbeat``), in the webhook's clock."""
    return [
        r["t"]
        for r in webhook_records()
        if r["path"] == "/heartbeat" and r["body"]["receiver"] == "heartbeat" and _names(r) == {"Watchdog"}
    ]


def notification(
    status: str, alertname: str, node_name: str, *, starts_at: str | None = None, since: datetime | None = None
) -> dict[str, Any] | None:
    """The first notification the webhook got with an alert of that name, node and status; of
    *this* alert (``starts_at``: the firing one's), or of one that started after ``since``.

    Alertmanager keeps an alert it notified and sends its "resolved" once it clears, even if that
    was an earlier run's (found on the cluster: a rerun picked up run 1's stale resolution), so an
    alert is told apart by when it started, not by its labels.
    """
    for record_ in webhook_records():
        for alert in record_["body"]["alerts"]:
            labels = alert["labels"]
            if alert["status"] != status or labels["alertname"] != alertname or labels.get("node") != node_name:
                continue
            if starts_at is not None and alert["startsAt"] != starts_at:
                continue
            if since is not None and datetime.fromisoformat(alert["startsAt"].replace("Z", "+00:00")) < since:
                continue
            return {"received": record_["t"], "receiver": record_["body"]["receiver"], **alert}
    return None


def notifications(status: str, alertname: str, node_name: str, since: datetime) -> list[dict[str, Any]]:
    """Every notification (as received: the sink's line) carrying that alert with that status, of an
    alert that started after ``since``: two Prometheus send it to two Alertmanagers, one must arrive."""
    return [
        record_
        for record_ in webhook_records()
        if any(
            alert["status"] == status
            and alert["labels"]["alertname"] == alertname
            and alert["labels"].get("node") == node_name
            and datetime.fromisoformat(alert["startsAt"].replace("Z", "+00:00")) >= since
            for alert in record_["body"]["alerts"]
        )
    ]


def pings_between(start: float, end: float) -> dict[str, Any]:
    """The Watchdog's arrivals at /heartbeat in [start, end] (the sink's clock): ISO times and gaps."""
    pings = [t for t in heartbeats() if start <= t <= end]
    return {
        "at": [datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds") for t in pings],
        "intervals_s": [round(b - a, 1) for a, b in itertools.pairwise(pings)],
    }


def _alerting_ok() -> dict[str, Any] | None:
    """health's alerting component once it reports deliveries and no failure, else None."""
    components = json.loads(memoryctl("health", "--json").stdout)["components"]
    alerting = components["alerting"]
    if alerting["status"] == "ok" and alerting["delivered"].get("webhook", 0) > 0 and alerting["failed"] == {}:
        return dict(alerting)
    return None


def test_alert_qdrant_down_reaches_the_receiver_and_resolves(deployed: Any) -> None:
    transcript: list[str] = []
    try:
        wait_for("no QdrantDown before the test", lambda: firing("QdrantDown", INDEX) is None, timeout=120)
        stopped, stopped_at = time.monotonic(), datetime.now(UTC) - timedelta(seconds=5)  # node clocks may lag
        sh(INDEX, "systemctl stop qdrant")
        transcript.append(f"{datetime.now(UTC):%H:%M:%S} systemctl stop qdrant on {INDEX}")
        wait_for(
            "QdrantDown firing in Prometheus",
            lambda: (firing("QdrantDown", INDEX) or {}).get("state") == "firing",
            150,
            1,
        )
        fired_s = round(time.monotonic() - stopped, 1)
        transcript.append(f"{datetime.now(UTC):%H:%M:%S} QdrantDown{{node={INDEX}}} firing in Prometheus")
        sent = wait_for(
            "the firing notification", lambda: notification("firing", "QdrantDown", INDEX, since=stopped_at), 120, 1
        )
        notified_s = round(time.monotonic() - stopped, 1)
        transcript.append(f"{datetime.now(UTC):%H:%M:%S} notification: {sent['status']} {sent['labels']}")
        assert sent["receiver"] == "operator"
        assert sent["labels"]["severity"] == "critical" and sent["labels"]["job"] == "qdrant"
        assert "Qdrant peer on node2 is down" == sent["annotations"]["summary"]
        assert sent["annotations"]["runbook_url"] == f"{RUNBOOK_BASE}#alert-qdrantdown"
        payload = next(r for r in webhook_records() if r["t"] == sent["received"])
        # Two Prometheus, each sending to both Alertmanagers: one notification (their gossip), even
        # after a peer's wait (15 s) and a group interval (10 s) in which a duplicate would come.
        time.sleep(20)
        once = len(notifications("firing", "QdrantDown", INDEX, stopped_at))
        transcript.append(f"{datetime.now(UTC):%H:%M:%S} firing notifications of it after 20 s more: {once}")
        assert once == 1, notifications("firing", "QdrantDown", INDEX, stopped_at)
        started = time.monotonic()
        sh(INDEX, "systemctl start qdrant")
        transcript.append(f"{datetime.now(UTC):%H:%M:%S} systemctl start qdrant on {INDEX}")
        resolved = wait_for(
            "the resolved notification",
            # by when it started, not its exact startsAt: each Prometheus has its own, and
            # Alertmanager keeps the earliest of them once both have sent it
            lambda: notification("resolved", "QdrantDown", INDEX, since=stopped_at),
            180,
            1,
        )
        resolved_s = round(time.monotonic() - started, 1)
        transcript.append(f"{datetime.now(UTC):%H:%M:%S} notification: {resolved['status']} {resolved['labels']}")
        assert resolved["labels"] == sent["labels"] and resolved["endsAt"] > sent["startsAt"]
        # The dead-man's switch: the Watchdog reaches the heartbeat path every 15-20 s (15 s repeat at
        # a 10 s tick: inventory/local.yaml), and never the operator's receiver.
        pings = wait_for(
            "three Watchdog pings at /heartbeat", lambda: heartbeats() if len(heartbeats()) >= 3 else None, 90, 2
        )
        gaps = [round(b - a, 1) for a, b in itertools.pairwise(pings)]
        transcript.append(f"{datetime.now(UTC):%H:%M:%S} Watchdog pings at /heartbeat, gaps {gaps} s")
        assert all(gap < 60 for gap in gaps), gaps  # ~20 s apart; room for a slow node, not for a missed minute
        assert not [r for r in webhook_records() if r["path"] != "/heartbeat" and _names(r) & {"Watchdog"}]
        heartbeats_seen = heartbeats()
        # `memoryctl health` on the db node sees the same from Prometheus: notifications delivered
        # (the heartbeat's and the operator's webhooks), none failed (the sink always answers).
        alerting = wait_for("health's alerting component ok", lambda: _alerting_ok(), 120, 5)
        transcript.append(f"{datetime.now(UTC):%H:%M:%S} health alerting: delivered {alerting['delivered']}")
    finally:
        sh(INDEX, "systemctl start qdrant")
    record(
        "alert_test",
        {
            "fired_in_prometheus_after_s": fired_s,
            "notified_after_s": notified_s,
            "resolved_notified_after_s": resolved_s,
            "watchdog_pings": [datetime.fromtimestamp(t, UTC).isoformat() for t in heartbeats_seen],
            "watchdog_intervals_s": [round(b - a, 1) for a, b in itertools.pairwise(heartbeats_seen)],
            "delivered_payload": payload,
            "health_alerting": alerting,
            "transcript": transcript,
        },
    )


def _alert_takes_the_cross_path(first: str, second: str, transcript: list[str], figures: dict[str, Any]) -> None:
    """Alertmanager stopped on ``first`` and Prometheus on ``second``, then Qdrant on the index
    node: ``QdrantDown`` can only travel from ``first``'s Prometheus to ``second``'s Alertmanager,
    and arrives there once (the sender's external URL says which Alertmanager sent it); everything
    started again, its resolution arrives too."""
    sh(first, "systemctl stop prometheus-alertmanager")
    sh(second, "systemctl stop prometheus")
    transcript.append(
        f"{datetime.now(UTC):%H:%M:%S} systemctl stop prometheus-alertmanager on {first}, prometheus on {second}"
    )
    started, since = time.monotonic(), datetime.now(UTC) - timedelta(seconds=5)
    sh(INDEX, "systemctl stop qdrant")
    transcript.append(f"{datetime.now(UTC):%H:%M:%S} systemctl stop qdrant on {INDEX}")
    sent = wait_for(
        "the firing notification through the cross path",
        lambda: notification("firing", "QdrantDown", INDEX, since=since),
        180,
        1,
        describe=lambda: webhook_records()[-3:],
    )
    arrived_s = round(time.monotonic() - started, 1)
    (delivered,) = [r for r in notifications("firing", "QdrantDown", INDEX, since) if r["t"] == sent["received"]]
    transcript.append(
        f"{datetime.now(UTC):%H:%M:%S} notification: firing {sent['labels']} from {delivered['body']['externalURL']}"
    )
    sh(first, "systemctl start prometheus-alertmanager")
    sh(second, "systemctl start prometheus")
    sh(INDEX, "systemctl start qdrant")
    transcript.append(f"{datetime.now(UTC):%H:%M:%S} started prometheus-alertmanager, prometheus and qdrant")
    resolved_at = time.monotonic()
    wait_for(
        "the resolved notification",
        lambda: notification("resolved", "QdrantDown", INDEX, since=since),
        180,
        1,
    )
    transcript.append(f"{datetime.now(UTC):%H:%M:%S} notification: resolved")
    count = len(notifications("firing", "QdrantDown", INDEX, since))
    figures["cross_path"] = {
        "alertmanager_stopped": first,
        "prometheus_stopped": second,
        "notified_after_s": arrived_s,
        "sent_by": delivered["body"]["externalURL"],
        "generator": sent.get("generatorURL", "")[:80],
        "firing_notifications": count,
        "resolved_after_s": round(time.monotonic() - resolved_at, 1),
        "receiver": sent["receiver"],
    }
    assert sent["receiver"] == "operator" and count == 1, figures["cross_path"]
    assert delivered["body"]["externalURL"].rstrip("/") == f"http://{MESH[second]}:9093", figures["cross_path"]
    assert sent["generatorURL"].startswith(f"http://{first}:9090/"), figures["cross_path"]  # its host name


def _alertmanagers_up(on: str) -> bool:
    query = urllib.parse.quote('up{job="alertmanager"}')
    found = prometheus(f"/api/v1/query?query={query}", on)["result"]
    return len(found) == len(MONITORS) and all(t["value"][1] == "1" for t in found)


def test_alerts_still_arrive_with_half_of_each_monitoring_node_down(deployed: Any) -> None:
    """The HA drill: Alertmanager stopped on one monitoring node and Prometheus on the other at
    once, so the one path left crosses between them: QdrantDown still arrives at the operator's
    sink, once, and resolves, and the Watchdog keeps pinging the heartbeat throughout
    (docs/monitoring.md, "Two of each"). Either half alone leaves that path and one more; the
    pair's de-duplication (two Prometheus, two Alertmanagers, one notification) is the plain
    alert test's."""
    transcript: list[str] = []
    figures: dict[str, Any] = {}
    first, second = MONITORS
    began, clock = time.monotonic(), time.time()
    try:
        wait_for("no QdrantDown before the drill", lambda: firing("QdrantDown", INDEX) is None, timeout=120)
        _alert_takes_the_cross_path(first, second, transcript, figures)
    finally:
        for name, unit in ((first, "prometheus-alertmanager"), (second, "prometheus"), (INDEX, "qdrant")):
            sh(name, f"systemctl start {unit}")
    # Both back: each Prometheus answers and sees both Alertmanagers up again.
    for name in MONITORS:
        wait_for(f"{name}'s Prometheus sees both Alertmanagers up", lambda n=name: _alertmanagers_up(n), 90, 3)
    pings = pings_between(clock, time.time())
    record(
        "monitoring_ha_drill",
        {"seconds": round(time.monotonic() - began, 1), **figures, "watchdog": pings, "transcript": transcript},
    )
    # The dead-man's switch never paused long while one side lived (about every 20 s here).
    assert len(pings["at"]) >= 3 and max(pings["intervals_s"]) < 60, pings
