"""The health metrics node_exporter exposes (``memoryctl health --prometheus``): degraded is told apart
from down, so the alerts can be (templates/prometheus/memoryctl.rules.yml, rules_test.yml)."""

from __future__ import annotations

from memoryctl.health.exposition import prometheus
from memoryctl.health.probes import HealthReport
from tests.unit.test_metrics import CLUSTER  # a leader, a sync standby and one catching up


def test_degraded_is_not_down_in_the_metrics() -> None:
    report = HealthReport(
        components={
            "postgres": {"status": "degraded", "latency_ms": 3.0},  # e.g. no synchronous standby
            "neo4j": {"status": "down", "latency_ms": 2000.0},
            "qdrant": {"status": "ok", "latency_ms": 4.0},
        }
    )
    text = prometheus(report)
    assert 'memoryctl_up{component="postgres"} 0' in text and 'memoryctl_degraded{component="postgres"} 1' in text
    assert 'memoryctl_up{component="neo4j"} 0' in text and 'memoryctl_degraded{component="neo4j"} 0' in text
    assert 'memoryctl_up{component="qdrant"} 1' in text and 'memoryctl_degraded{component="qdrant"} 0' in text


# The whole text of two reports, pinned (issue 43, item 4): a healthy one with a disabled component
# (empty families keep their HELP and TYPE), and a degraded one with a timeout, a down store, the
# outbox, the last runs with a reconcile's drift and a replicated PostgreSQL.
RUNS = {
    "status": "degraded",
    "error": "last run failed: nightly",
    "latency_ms": 7.25,
    "last": {
        "reconcile": {
            "status": "partial",
            "started_at": "2026-11-30T10:00:00+00:00",
            "age_s": 3600.0,
            "error": None,
            "counts": {
                "postgres": 10,
                "qdrant_scanned": 10,
                "qdrant_orphan": 1,
                "qdrant_missing": 2,
                "qdrant_stale": 0,
                "qdrant_repaired": 1,
            },
        },
        "nightly": {"status": "failed", "started_at": "2026-11-30T02:15:00+00:00", "age_s": 7200.0, "error": "boom"},
    },
}
OUTBOX = {
    "status": "degraded",
    "latency_ms": 2.0,
    "vector": {"pending": 3, "oldest_age_s": 12.5, "last_error": None, "set_aside": 1, "set_aside_error": "x"},
    "graph": {"pending": 0, "oldest_age_s": None, "last_error": None, "set_aside": 0, "set_aside_error": None},
}

HEALTHY_TEXT = """\
# HELP memoryctl_up 1 if the component answered ok.
# TYPE memoryctl_up gauge
memoryctl_up{component="postgres"} 1
memoryctl_up{component="qdrant"} 1
# HELP memoryctl_degraded 1 if the component answered degraded.
# TYPE memoryctl_degraded gauge
memoryctl_degraded{component="postgres"} 0
memoryctl_degraded{component="qdrant"} 0
# HELP memoryctl_probe_latency_seconds Probe latency.
# TYPE memoryctl_probe_latency_seconds gauge
memoryctl_probe_latency_seconds{component="postgres"} 0.0030
memoryctl_probe_latency_seconds{component="qdrant"} 0.0001
# HELP memoryctl_outbox_pending Outbox rows awaiting delivery.
# TYPE memoryctl_outbox_pending gauge
# HELP memoryctl_outbox_oldest_age_seconds Age of the oldest undelivered outbox entry (0: none).
# TYPE memoryctl_outbox_oldest_age_seconds gauge
# HELP memoryctl_outbox_set_aside Outbox rows set aside after failing alone (memoryctl outbox list).
# TYPE memoryctl_outbox_set_aside gauge
# HELP memoryctl_last_run_timestamp_seconds Start of the last run of each maintenance command.
# TYPE memoryctl_last_run_timestamp_seconds gauge
# HELP memoryctl_last_run_success 1 if the last run of the command did not fail.
# TYPE memoryctl_last_run_success gauge
# HELP memoryctl_reconcile_drift Findings of the last reconcile left unrepaired, per store.
# TYPE memoryctl_reconcile_drift gauge
# HELP memoryctl_healthy 1 healthy, 0 otherwise.
# TYPE memoryctl_healthy gauge
memoryctl_healthy 1
"""

DEGRADED_TEXT = """\
# HELP memoryctl_up 1 if the component answered ok.
# TYPE memoryctl_up gauge
memoryctl_up{component="neo4j"} 0
memoryctl_up{component="outbox"} 0
memoryctl_up{component="postgres"} 0
memoryctl_up{component="qdrant"} 0
memoryctl_up{component="runs"} 0
# HELP memoryctl_degraded 1 if the component answered degraded.
# TYPE memoryctl_degraded gauge
memoryctl_degraded{component="neo4j"} 0
memoryctl_degraded{component="outbox"} 1
memoryctl_degraded{component="postgres"} 1
memoryctl_degraded{component="qdrant"} 0
memoryctl_degraded{component="runs"} 1
# HELP memoryctl_probe_latency_seconds Probe latency.
# TYPE memoryctl_probe_latency_seconds gauge
memoryctl_probe_latency_seconds{component="neo4j"} 1.8000
memoryctl_probe_latency_seconds{component="outbox"} 0.0020
memoryctl_probe_latency_seconds{component="postgres"} 0.0123
memoryctl_probe_latency_seconds{component="qdrant"} 0.0040
memoryctl_probe_latency_seconds{component="runs"} 0.0073
# HELP memoryctl_outbox_pending Outbox rows awaiting delivery.
# TYPE memoryctl_outbox_pending gauge
memoryctl_outbox_pending{target="vector"} 3
memoryctl_outbox_pending{target="graph"} 0
# HELP memoryctl_outbox_oldest_age_seconds Age of the oldest undelivered outbox entry (0: none).
# TYPE memoryctl_outbox_oldest_age_seconds gauge
memoryctl_outbox_oldest_age_seconds{target="vector"} 12.500
memoryctl_outbox_oldest_age_seconds{target="graph"} 0.000
# HELP memoryctl_outbox_set_aside Outbox rows set aside after failing alone (memoryctl outbox list).
# TYPE memoryctl_outbox_set_aside gauge
memoryctl_outbox_set_aside{target="vector"} 1
memoryctl_outbox_set_aside{target="graph"} 0
# HELP memoryctl_last_run_timestamp_seconds Start of the last run of each maintenance command.
# TYPE memoryctl_last_run_timestamp_seconds gauge
memoryctl_last_run_timestamp_seconds{command="nightly"} 1796004900.000
memoryctl_last_run_timestamp_seconds{command="reconcile"} 1796032800.000
# HELP memoryctl_last_run_success 1 if the last run of the command did not fail.
# TYPE memoryctl_last_run_success gauge
memoryctl_last_run_success{command="nightly"} 0
memoryctl_last_run_success{command="reconcile"} 1
# HELP memoryctl_reconcile_drift Findings of the last reconcile left unrepaired, per store.
# TYPE memoryctl_reconcile_drift gauge
memoryctl_reconcile_drift{store="qdrant"} 2
# HELP memoryctl_postgres_sync_standbys Standbys streaming in sync or quorum state (0: no sync standby).
# TYPE memoryctl_postgres_sync_standbys gauge
memoryctl_postgres_sync_standbys 1
# HELP memoryctl_postgres_replication_lag_bytes WAL bytes a standby has still to replay.
# TYPE memoryctl_postgres_replication_lag_bytes gauge
memoryctl_postgres_replication_lag_bytes{standby="pg2"} 512
# HELP memoryctl_postgres_timeline The primary's timeline (goes up at every promotion).
# TYPE memoryctl_postgres_timeline gauge
memoryctl_postgres_timeline 4
# HELP memoryctl_healthy 1 healthy, 0 otherwise.
# TYPE memoryctl_healthy gauge
memoryctl_healthy 0
"""


def test_the_whole_text_of_a_healthy_report() -> None:
    report = HealthReport(
        components={
            "postgres": {"status": "ok", "latency_ms": 3.0},
            "qdrant": {"status": "disabled", "latency_ms": 0.1},
        }
    )
    assert report.status == "healthy"
    assert prometheus(report) == HEALTHY_TEXT


def test_the_whole_text_of_a_degraded_report() -> None:
    report = HealthReport(
        components={
            "postgres": {"status": "degraded", "latency_ms": 12.34567, "cluster": CLUSTER},
            "neo4j": {"status": "timeout", "latency_ms": 1800.0},
            "qdrant": {"status": "down", "latency_ms": 4.0},
            "outbox": OUTBOX,
            "runs": RUNS,
        }
    )
    assert report.status == "degraded"
    assert prometheus(report) == DEGRADED_TEXT
