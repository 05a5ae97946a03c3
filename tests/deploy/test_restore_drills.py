"""Restore drills on the deployed cluster, each timed (the deploy report).

- (a) the derived stores: a snapshot set is taken, then every memoryctl collection of the Qdrant
  cluster is deleted (every replica on every peer: the data itself is lost; a lost *peer* is
  test_faults.py's) and Neo4j's database files on the index node are wiped; `memoryctl restore
  qdrant` and `memoryctl rebuild graph` bring them back → reconcile 0 drift, the same answers to a
  fixed set of queries as before (text queries and a graph query, each answering something), and
  every point's payload the same (a hash per point id, over every point of the collection). CI
  runs it on the Patroni cluster (test_ha.py); on the single server it is a `drill` (on demand).
- (b) PostgreSQL: a full backup; memories written after it (only WAL replay brings them back); a
  time T read from the server's clock; memories written after T (they must not come back); the
  database dropped, the server restored by pgBackRest to T (the procedure of docs/backup.md) →
  every row of every table identical to what it was at T (count and a hash of the full rows), the
  memories written between the backup and T there and those after T absent; then `reconcile
  --repair` drops what the derived stores still hold of the lost writes → 0 drift.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
import uuid

import pytest

from deploy.osrelease import DEFAULT, RELEASES
from tests.deploy import e2e_data
from tests.deploy.cluster import memoryctl, peer_api, put, wait_for
from tests.deploy.conftest import record
from tests.deploy.test_e2e import ids, query
from tests.deploy.test_monitoring import DB, INDEX, OPS, psql, sh, timed

pytestmark = pytest.mark.deploy

PG_SERVICE = f"postgresql@{RELEASES[DEFAULT].postgres}-main"
NEO4J_DATA = "/var/lib/neo4j/data"
GRAPH_QUERY = ("--entity", "person:p07", "--limit", "20")  # the data's type (types are case-sensitive)


def neo4j_status() -> str:
    report = memoryctl("health", "--json", "--deadline", "15").json()
    return str(report["components"]["neo4j"]["status"])


def answers() -> list[list[str]]:
    """The needles' text queries and a graph query: ids in order (with the real embedder: no ties).
    Each answers something: an empty answer before and after would prove nothing."""
    dataset = e2e_data.build()
    asked = [ids(query(needle.query))[:5] for needle in dataset.needles() if needle.query is not None]
    asked.append(ids(query(*GRAPH_QUERY)))
    assert all(asked), asked
    return asked


def payload_hashes(collection: str) -> dict[str, str]:
    """Every point of ``collection`` (scrolled through the index node's peer): id -> sha256 of its
    payload (keys sorted)."""
    hashes: dict[str, str] = {}
    offset = None
    while True:
        body = {"limit": 1000, "with_payload": True, "with_vector": False, "offset": offset}
        page = peer_api(INDEX, f"/collections/{collection}/points/scroll", method="POST", body=body)
        for point in page["points"]:
            encoded = json.dumps(point["payload"], sort_keys=True).encode()
            hashes[str(point["id"])] = hashlib.sha256(encoded).hexdigest()
        offset = page.get("next_page_offset")
        if offset is None:
            return hashes


# On demand (`scripts/test --drills`): CI runs drill (a) once, on the Patroni cluster (test_ha.py),
# where it reads PostgreSQL through the multi-host connection. Its Qdrant cluster and Neo4j are the
# same here; only PostgreSQL's topology differs, and every other test on the single server reads it.
@pytest.mark.drill
def test_drill_derived_stores_restored_from_snapshots_and_postgres(imported: e2e_data.DataSet) -> None:
    derived_stores_drill(len(imported.records), "drill_derived_stores")


def answers_once_whole() -> list[list[str]]:
    """:func:`answers` asked again while a query comes back degraded: a rebuilt Neo4j plans its first
    queries cold and can miss the 2 s store timeout for a while after the first one answered (the
    fresh-clone rehearsal of session 13 met it). Only a degraded answer is retried; whole answers
    that differ still fail the comparison."""
    found: list[list[list[str]]] = []

    def whole() -> bool:
        try:
            found.append(answers())
        except AssertionError:
            return False
        return True

    wait_for("every answer whole (Neo4j warm)", whole, timeout=300, interval=5)
    return found[-1]


def derived_stores_drill(memories: int, report_key: str) -> None:
    """Drill (a); test_ha.py runs it again on the Patroni cluster."""
    before = answers()
    collection = memoryctl("health", "--json", "--deadline", "15").json()["components"]["qdrant"]["collection"]
    points = payload_hashes(collection)
    assert len(points) >= memories, len(points)
    snapshot, backup_s = timed(lambda: memoryctl("backup", "qdrant", "--json").json())

    # The data is lost: every memoryctl collection on every peer, and Neo4j's database files.
    for lost in peer_api(INDEX, "/collections")["collections"]:
        peer_api(INDEX, f"/collections/{lost['name']}", method="DELETE")
    sh(INDEX, f"systemctl stop neo4j && rm -rf {NEO4J_DATA}/databases/neo4j {NEO4J_DATA}/transactions/neo4j")
    sh(INDEX, "systemctl start neo4j")
    wait_for("Neo4j answers again", lambda: neo4j_status() == "ok", timeout=180)

    restored, restore_s = timed(lambda: memoryctl("restore", "qdrant", "--json"))
    assert restored.returncode == 0, restored.stderr[-2000:]
    rebuilt, rebuild_s = timed(lambda: memoryctl("rebuild", "graph", "--json"))
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    # A Neo4j just started and refilled plans its first queries cold: wait for the graph query the
    # comparison asks to answer (docs/operations.md, "After a Neo4j restart").
    graph = ("query", "--agent", e2e_data.AGENT, "--json", *GRAPH_QUERY)
    wait_for("the graph query answers", lambda: memoryctl(*graph).returncode == 0, timeout=300, interval=5)
    drift = memoryctl("reconcile", "--json")
    assert drift.returncode == 0 and drift.json()["drift"] == 0, drift.stdout[-2000:]
    assert answers_once_whole() == before
    assert payload_hashes(collection) == points
    record(
        report_key,
        {
            "memories": memories,
            "points_compared": len(points),
            "snapshot_bytes": snapshot["bytes"],
            "backup_qdrant_s": backup_s,
            "restore_qdrant_s": restore_s,
            "restore_detail": restored.json(),
            "rebuild_graph_s": rebuild_s,
            "rebuild_detail": rebuilt.json(),
            "load_average": list(os.getloadavg()),
        },
    )


def tables() -> list[str]:
    return psql("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename").split()


def content() -> dict[str, list[str]]:
    """Per table of the memoryctl schema: rows and an md5 of the full rows in a stable order."""
    return {
        table: psql(
            f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {table} t"  # noqa: S608 - names from pg_tables
        ).split("|")
        for table in tables()
    }


def write(name: str, count: int) -> set[str]:
    """``count`` new memories through memoryctl's write path (every table they touch); their ids,
    fresh on every call (a rerun on a kept cluster writes new memories, as the drill needs)."""
    records = [
        {
            "id": str(uuid.uuid4()),
            "agent_id": e2e_data.AGENT,
            "text": f"{name}: point-in-time drill memory {n} about the observatory",
            "entities": [{"type": "project", "name": f"pitr-{name}"}],
            "metadata": {"drill": name, "n": n},
        }
        for n in range(count)
    ]
    put(DB, "".join(json.dumps(r) + "\n" for r in records), f"/var/lib/memoryctl/pitr-{name}.jsonl", "memoryctl")
    outcome = memoryctl("import", f"pitr-{name}.jsonl", "--json").json()
    assert outcome["inserted"] == count, outcome
    return {r["id"] for r in records}


def present(wanted: set[str]) -> set[str]:
    listed = ",".join(f"'{i}'" for i in sorted(wanted))
    return set(psql(f"SELECT id FROM memories WHERE id IN ({listed})").split())  # noqa: S608 - uuids we made


def test_drill_postgres_point_in_time_restore(imported: e2e_data.DataSet) -> None:
    repo = "sudo -u postgres pgbackrest --stanza=memoryctl"
    _, backup_s = timed(lambda: sh(OPS, f"{repo} --type=full backup"))
    repository_bytes = int(sh(OPS, "du -sb /var/lib/pgbackrest | cut -f1"))
    sh(DB, "systemctl stop cron memoryctl-serve")  # the procedure: no writers while we look
    try:
        # ... including a job cron had already started (a reconcile runs up to a minute): it would
        # finish between what we look at and the target time.
        running = "SELECT count(*) FROM maintenance_runs WHERE status = 'running'"
        wait_for("no maintenance run in progress", lambda: psql(running) == "0", timeout=300, interval=2)
        replayed = write("before-t", 20)  # after the backup: only WAL replay brings these back
        expected = content()
        # T: the server's clock after those commits; anything that commits after this is after T.
        target = psql("SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US+00')")
        lost = write("after-t", 10)
        assert present(replayed | lost) == replayed | lost
        psql("DROP DATABASE memoryctl WITH (FORCE)", database="postgres")
        psql("SELECT pg_switch_wal()", database="postgres")
        wait_for(
            "WAL archived up to the drop",
            lambda: psql("SELECT count(*) FROM pg_ls_archive_statusdir() WHERE name LIKE '%.ready'", "postgres") == "0",
            timeout=60,
        )
        started = time.monotonic()
        sh(DB, f"systemctl stop {PG_SERVICE}")
        sh(DB, f"{repo} --delta --type=time --target={shlex.quote(target)} --target-action=promote restore")
        sh(DB, f"systemctl start {PG_SERVICE}")
        wait_for("recovery finished", lambda: psql("SELECT pg_is_in_recovery()", "postgres") == "f", timeout=300)
        restore_s = round(time.monotonic() - started, 1)
        assert present(replayed | lost) == replayed, "the writes between the backup and T, and none after T"
        assert content() == expected
    finally:  # the server and the db node's writers come back whatever happened (later tests use them)
        sh(DB, f"systemctl start {PG_SERVICE} cron memoryctl-serve")
    # The derived stores still hold the memories written after T: reconcile finds and drops them.
    found = memoryctl("reconcile", "--json").json()
    assert found["drift"] >= len(lost), found
    repaired = memoryctl("reconcile", "--repair", "--json")
    assert repaired.returncode == 0, repaired.stdout[-2000:]
    drift = memoryctl("reconcile", "--json")
    assert drift.returncode == 0 and drift.json()["drift"] == 0, drift.stdout[-2000:]
    record(
        "drill_postgres",
        {
            "full_backup_s": backup_s,
            "repository_bytes": repository_bytes,
            "restore_s": restore_s,
            "replayed_from_wal": len(replayed),
            "after_target_dropped": len(lost),
            "tables": expected,
            "load_average": list(os.getloadavg()),
        },
    )
