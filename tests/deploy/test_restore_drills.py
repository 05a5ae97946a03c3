"""Restore drills on the deployed cluster, each timed (the deploy report).

- (a) the derived stores: a snapshot set is taken, then every memoryctl collection of the Qdrant
  cluster is deleted (every replica on every peer: the data itself is lost; a lost *peer* is
  test_faults.py's) and Neo4j's database files on the index node are wiped; `memoryctl restore
  qdrant` and `memoryctl rebuild graph` bring them back → reconcile 0 drift and the same answers to
  a fixed set of queries as before.
- (b) PostgreSQL: a full backup, a time T, the database dropped, the server restored by pgBackRest
  to T (the procedure of docs/backup.md) → the same counts and content hashes per table as at T,
  then reconcile 0 drift.
"""

from __future__ import annotations

import os
import shlex
import time
from datetime import UTC, datetime

import pytest

from deploy.osrelease import DEFAULT, RELEASES
from tests.deploy import e2e_data
from tests.deploy.cluster import memoryctl, peer_api, wait_for
from tests.deploy.conftest import record
from tests.deploy.test_e2e import ids, query
from tests.deploy.test_monitoring import DB, INDEX, OPS, psql, sh, timed

pytestmark = pytest.mark.deploy

PG_SERVICE = f"postgresql@{RELEASES[DEFAULT].postgres}-main"
NEO4J_DATA = "/var/lib/neo4j/data"
# Per table: rows and a digest of their content, in a stable order (what a restore must give back).
TABLES = {
    "memories": "id::text || content_hash || coalesce(deleted_at::text, '')",
    "outbox": "id::text || memory_id::text || target || op",
    "maintenance_runs": "id::text || command || status",
    "model_versions": "model_id || status",
}


def neo4j_status() -> str:
    report = memoryctl("health", "--json", "--deadline", "15").json()
    return str(report["components"]["neo4j"]["status"])


def answers() -> list[list[str]]:
    """The needles' text queries and a graph query: ids in order (with the real embedder: no ties)."""
    dataset = e2e_data.build()
    asked = [ids(query(needle.query))[:5] for needle in dataset.needles() if needle.query is not None]
    asked.append(ids(query("--entity", "Person:p07", "--limit", "20")))
    return asked


def test_drill_derived_stores_restored_from_snapshots_and_postgres(imported: e2e_data.DataSet) -> None:
    before = answers()
    snapshot, backup_s = timed(lambda: memoryctl("backup", "qdrant", "--json").json())

    # The data is lost: every memoryctl collection on every peer, and Neo4j's database files.
    for collection in peer_api(INDEX, "/collections")["collections"]:
        peer_api(INDEX, f"/collections/{collection['name']}", method="DELETE")
    sh(INDEX, f"systemctl stop neo4j && rm -rf {NEO4J_DATA}/databases/neo4j {NEO4J_DATA}/transactions/neo4j")
    sh(INDEX, "systemctl start neo4j")
    wait_for("Neo4j answers again", lambda: neo4j_status() == "ok", timeout=180)

    restored, restore_s = timed(lambda: memoryctl("restore", "qdrant", "--json"))
    assert restored.returncode == 0, restored.stderr[-2000:]
    rebuilt, rebuild_s = timed(lambda: memoryctl("rebuild", "graph", "--json"))
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    drift = memoryctl("reconcile", "--json")
    assert drift.returncode == 0 and drift.json()["drift"] == 0, drift.stdout[-2000:]
    assert answers() == before
    record(
        "drill_derived_stores",
        {
            "memories": len(imported.records),
            "snapshot_bytes": snapshot["bytes"],
            "backup_qdrant_s": backup_s,
            "restore_qdrant_s": restore_s,
            "restore_detail": restored.json(),
            "rebuild_graph_s": rebuild_s,
            "rebuild_detail": rebuilt.json(),
            "load_average": list(os.getloadavg()),
        },
    )


def content() -> dict[str, list[str]]:
    return {
        table: psql(
            f"SELECT count(*), md5(coalesce(string_agg({expr}, ',' ORDER BY {expr}), '')) FROM {table}"  # noqa: S608 - constants
        ).split("|")
        for table, expr in TABLES.items()
    }


def test_drill_postgres_point_in_time_restore(imported: e2e_data.DataSet) -> None:
    repo = "sudo -u postgres pgbackrest --stanza=memoryctl"
    _, backup_s = timed(lambda: sh(OPS, f"{repo} --type=full backup"))
    repository_bytes = int(sh(OPS, "du -sb /var/lib/pgbackrest | cut -f1"))
    sh(DB, "systemctl stop cron memoryctl-serve")  # the procedure: no writers while we look
    # ... including a job cron had already started (a reconcile runs up to a minute): it would
    # finish between what we look at and the target time.
    running = "SELECT count(*) FROM maintenance_runs WHERE status = 'running'"
    wait_for("no maintenance run in progress", lambda: psql(running) == "0", timeout=300, interval=2)
    expected = content()
    time.sleep(1.5)
    target = datetime.now(UTC)
    time.sleep(1.5)
    psql("SELECT txid_current()", database="postgres")  # the cluster commits on, as cron does all day
    psql("DROP DATABASE memoryctl WITH (FORCE)", database="postgres")
    psql("SELECT pg_switch_wal()", database="postgres")
    wait_for(
        "WAL archived up to the drop",
        lambda: psql("SELECT count(*) FROM pg_ls_archive_statusdir() WHERE name LIKE '%.ready'", "postgres") == "0",
        timeout=60,
    )
    started = time.monotonic()
    sh(DB, f"systemctl stop {PG_SERVICE}")
    when = target.strftime("%Y-%m-%d %H:%M:%S.%f+00")
    sh(DB, f"{repo} --delta --type=time --target={shlex.quote(when)} --target-action=promote restore")
    sh(DB, f"systemctl start {PG_SERVICE}")
    wait_for("recovery finished", lambda: psql("SELECT pg_is_in_recovery()", "postgres") == "f", timeout=300)
    restore_s = round(time.monotonic() - started, 1)
    assert content() == expected
    sh(DB, "systemctl start cron memoryctl-serve")
    drift = memoryctl("reconcile", "--json")
    assert drift.returncode == 0 and drift.json()["drift"] == 0, drift.stdout[-2000:]
    record(
        "drill_postgres",
        {
            "full_backup_s": backup_s,
            "repository_bytes": repository_bytes,
            "restore_s": restore_s,
            "tables": expected,
            "load_average": list(os.getloadavg()),
        },
    )
