"""Monitoring and backups on the deployed cluster, seen from the outside.

- The backup side is up: pgBackRest has a backup and WAL archiving works (`memoryctl backup
  status`), every Prometheus target is up, memoryctl's own metrics arrive.
- The alert test: Qdrant stopped on the index node → QdrantDown firing in Prometheus' API within
  the rule's window (1 minute + a scrape and an evaluation, 5 s each on the local nodes); started
  again → resolved. The transcript and timings go to the deploy report.
"""

from __future__ import annotations

import json
import shlex
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.deploy import e2e_data
from tests.deploy.cluster import MESH, memoryctl, node, wait_for
from tests.deploy.conftest import record

pytestmark = pytest.mark.deploy

DB, INDEX, OPS = "node1", "node2", "node3"


def sh(name: str, command: str, timeout: int = 600) -> str:
    result = node(name).run(f"timeout {timeout} sh -c {shlex.quote(command)}")
    assert result.rc == 0, f"{name}: {command}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    return str(result.stdout)


def psql(sql: str, database: str = "memoryctl") -> str:
    return sh(DB, f"sudo -u postgres psql -XAt -v ON_ERROR_STOP=1 -d {database} -c {shlex.quote(sql)}").strip()


def prometheus(path: str) -> Any:
    """``GET path`` on Prometheus (on the monitoring node's mesh address, asked from that node)."""
    script = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    out = sh(OPS, f"python3 -c {shlex.quote(script)} {shlex.quote(f'http://{MESH[OPS]}:9090{path}')}")
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
    assert jobs == ["alertmanager", "node", "postgres", "prometheus", "qdrant"], jobs
    # memoryctl's own metrics arrive through the textfile collector: run the cron lines now (as cron
    # would, as their user) instead of waiting up to five minutes for them.
    for line in sh(DB, "cat /etc/cron.d/memoryctl-metrics").splitlines():
        if "--prometheus" in line and not line.startswith("#"):
            user, command = line.split(None, 6)[5:]
            sh(DB, f"sudo -u {user} sh -c {shlex.quote(command)}")
    for metric in ("memoryctl_healthy", "memoryctl_backup_last_success_timestamp_seconds"):
        wait_for(f"{metric} in Prometheus", lambda m=metric: prometheus(f"/api/v1/query?query={m}")["result"], 60)
    record("daytwo_targets", {"up": len(targets), "jobs": jobs})


def firing(alertname: str, node_name: str) -> dict[str, Any] | None:
    for alert in prometheus("/api/v1/alerts")["alerts"]:
        labels = alert["labels"]
        if labels["alertname"] == alertname and labels.get("node") == node_name:
            return dict(alert)
    return None


def test_alert_qdrant_down_fires_and_resolves(deployed: Any) -> None:
    transcript: list[str] = []
    wait_for("no QdrantDown before the test", lambda: firing("QdrantDown", INDEX) is None, timeout=120)
    stopped = time.monotonic()
    sh(INDEX, "systemctl stop qdrant")
    transcript.append(f"{datetime.now(UTC):%H:%M:%S} systemctl stop qdrant on {INDEX}")

    def state() -> str | None:
        alert = firing("QdrantDown", INDEX)
        if alert is not None and (not transcript[-1].endswith(alert["state"])):
            transcript.append(f"{datetime.now(UTC):%H:%M:%S} QdrantDown{{node={INDEX}}} {alert['state']}")
        return alert["state"] if alert else None

    wait_for("QdrantDown firing", lambda: state() == "firing", timeout=150, interval=1)
    fired_s = round(time.monotonic() - stopped, 1)
    started = time.monotonic()
    sh(INDEX, "systemctl start qdrant")
    transcript.append(f"{datetime.now(UTC):%H:%M:%S} systemctl start qdrant on {INDEX}")
    wait_for("QdrantDown resolved", lambda: state() is None, timeout=120, interval=1)
    resolved_s = round(time.monotonic() - started, 1)
    transcript.append(f"{datetime.now(UTC):%H:%M:%S} QdrantDown{{node={INDEX}}} resolved")
    record("alert_test", {"fired_after_s": fired_s, "resolved_after_s": resolved_s, "transcript": transcript})
    assert fired_s <= 60 + 30  # the rule's `for: 1m`, plus a scrape and an evaluation (5 s each here), plus slack
