"""The metrics the alert rules are written against, from a health report's components."""

from __future__ import annotations

import shutil
import subprocess

from memoryctl.health.exposition import Exposition, health_metrics

COMPONENTS = {
    "outbox": {
        "vector": {"pending": 3, "oldest_age_s": 12.5, "last_error": None},
        "graph": {"pending": 0, "oldest_age_s": None, "last_error": None},
    },
    "runs": {
        "last": {
            "reconcile": {
                "status": "partial",
                "started_at": "2026-11-30T10:00:00+00:00",
                "counts": {
                    "postgres": 100,
                    "qdrant_scanned": 100,
                    "qdrant_orphan": 1,
                    "qdrant_missing": 2,
                    "qdrant_stale": 0,
                    "qdrant_repaired": 1,
                    "neo4j_scanned": 100,
                    "neo4j_orphan": 0,
                    "neo4j_missing": 0,
                    "neo4j_stale": 0,
                    "neo4j_repaired": 0,
                },
            },
            "nightly": {"status": "failed", "started_at": "2026-11-30T02:15:00+00:00"},
        }
    },
}


def test_health_metrics_for_the_alert_rules() -> None:
    text = "\n".join(health_metrics(COMPONENTS)) + "\n"
    assert 'memoryctl_outbox_oldest_age_seconds{target="vector"} 12.500' in text
    assert 'memoryctl_outbox_oldest_age_seconds{target="graph"} 0.000' in text
    assert 'memoryctl_last_run_timestamp_seconds{command="nightly"} 1796004900.000' in text
    assert 'memoryctl_last_run_success{command="nightly"} 0' in text
    assert 'memoryctl_last_run_success{command="reconcile"} 1' in text  # partial is not failed
    assert 'memoryctl_reconcile_drift{store="qdrant"} 2' in text  # 1 orphan + 2 missing - 1 repaired
    assert 'memoryctl_reconcile_drift{store="neo4j"} 0' in text
    promtool = shutil.which("promtool")
    if promtool is not None:
        lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert lint.returncode == 0, lint.stderr


def test_no_runs_yet_gives_empty_families() -> None:
    text = "\n".join(health_metrics({}))
    assert "memoryctl_reconcile_drift{" not in text and "# TYPE memoryctl_reconcile_drift gauge" in text


def test_label_values_are_escaped() -> None:
    out = Exposition()
    out.family("x", "help")
    out.sample({"a": 'q"uo\\te\n'}, 1)
    assert out.text().splitlines()[-1] == 'x{a="q\\"uo\\\\te\\n"} 1'


CLUSTER = {
    "leader": "10.77.0.1:5432",
    "timeline": 4,
    "standbys": [
        {"name": "pg2", "address": "10.77.0.2", "state": "streaming", "sync_state": "sync", "lag_bytes": 512},
        {"name": "pg3", "address": "10.77.0.3", "state": "catchup", "sync_state": "async", "lag_bytes": None},
    ],
}


def test_a_postgres_cluster_gives_its_sync_standbys_lag_and_timeline() -> None:
    text = "\n".join(health_metrics({"postgres": {"status": "ok", "cluster": CLUSTER}})) + "\n"
    assert "memoryctl_postgres_sync_standbys 1\n" in text
    assert 'memoryctl_postgres_replication_lag_bytes{standby="pg2"} 512\n' in text
    assert 'standby="pg3"' not in text
    assert "memoryctl_postgres_timeline 4\n" in text
    promtool = shutil.which("promtool")
    if promtool is not None:
        lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert lint.returncode == 0, lint.stderr
    # a single server (no cluster block): none of the three families
    assert "memoryctl_postgres" not in "\n".join(health_metrics({"postgres": {"status": "ok"}}))
