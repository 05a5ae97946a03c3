"""Backups and restores against the real servers: Qdrant shard snapshots (the Qdrant server),
the graph rebuilt from PostgreSQL (Neo4j), and pgBackRest with a point-in-time restore of a
throwaway PostgreSQL cluster (the Debian packages), read back by ``memoryctl backup status``."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg
import pytest

from memoryctl.backup.rebuild import rebuild_graph
from memoryctl.backup.snapshots import backup_qdrant, restore_qdrant
from memoryctl.backup.status import backup_status, prometheus
from memoryctl.backup.target import BackupError
from memoryctl.client import MemoryClient
from memoryctl.maintenance.reconcile import reconcile
from memoryctl.model import EntityRef, Memory, Relation
from memoryctl.query.spec import GraphFilter
from tests.conftest import cluster_settings

pytestmark = pytest.mark.integration

N = 400
QUERIES = ["alpha3 beta7 gamma1", "sigma9 sigma2 delta4 omega0", "project p1 beta5"]


WORDS = [f"{stem}{n}" for stem in ("alpha", "beta", "gamma", "delta", "omega", "sigma") for n in range(10)]


def _memories(n: int, *, seed: int = 0) -> list[Memory]:
    """Texts drawn from a small vocabulary in varying numbers: scores practically never tie, so the
    ranked answers are the data's, not the order in which a store happens to hold equal points."""
    memories = []
    for i in range(n):
        rng = random.Random(seed * 1_000_003 + i)
        words = " ".join(rng.choices(WORDS, k=rng.randint(5, 14)))
        memories.append(
            Memory(
                text=f"project p{i % 7} topic t{i % 13}: {words}",
                agent_id="a1",
                id=uuid.UUID(int=(seed << 64) + i + 1),
                kind="note",
                entities=[EntityRef("Project", f"p{i % 7}"), EntityRef("Topic", f"t{i % 13}")],
                relations=[Relation(EntityRef("Project", f"p{i % 7}"), "RELATES_TO", EntityRef("Topic", f"t{i % 13}"))],
                metadata={"i": i},
            )
        )
    return memories


def _answers(client: MemoryClient) -> list[list[tuple[str, float]]]:
    """A fixed set of queries over every store: ids with their scores, equal scores in id order
    (the order among tied hits is the engine's, not the data's)."""
    # Without time decay: the scores do not move while the test runs.
    results = [client.query(text=q, agent_id="a1", limit=10, decay=False) for q in QUERIES]
    results.append(
        client.query(graph=GraphFilter(EntityRef("Project", "p2"), hops=2), agent_id="a1", limit=20, decay=False)
    )
    results.append(
        client.query(text="gamma4 omega8", graph=GraphFilter(EntityRef("Topic", "t4")), agent_id="a1", decay=False)
    )
    for result in results:
        assert result.degraded == [], result.degraded
    return [sorted(((str(h.id), round(h.score, 4)) for h in r.hits), key=lambda p: (-p[1], p[0])) for r in results]


TOP = 5


def same_answers(after: list[list[tuple[str, float]]], before: list[list[tuple[str, float]]]) -> bool:
    """The same ids in the same order: the first TOP of each text query, every hit of the graph
    queries. Scores are not compared, nor a text query's tail: the engine standardises each leg over
    this query's candidates, and which of several equally scored candidates the dense leg returns
    at its cut is the store's choice, not the data's; the tail moves with it. Hits tied on score
    compare as a set."""
    for n, (a, b) in enumerate(zip(after, before, strict=True)):
        if n < len(QUERIES):
            a, b = a[:TOP], b[:TOP]
        if len(a) != len(b):
            return False
        groups: list[list[int]] = []
        for i, (_, score) in enumerate(a):
            if groups and abs(a[groups[-1][0]][1] - score) < 1e-4:
                groups[-1].append(i)
            else:
                groups.append([i])
        if any({a[i][0] for i in group} != {b[i][0] for i in group} for group in groups[:-1]):
            return False
    return True


def _qdrant(client: MemoryClient) -> tuple[str, dict[str, str]]:
    qs = client.settings.qdrant
    assert qs.url is not None
    return qs.url, {"api-key": qs.api_key.get_secret_value()} if qs.api_key else {}


@pytest.fixture
def server_cluster(pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path) -> Iterator[MemoryClient]:
    """The cluster profile on the real Qdrant server (snapshots are a server API), snapshots to a directory."""
    settings = cluster_settings(
        pg_dsn,
        neo4j_clean,
        tmp_path / "qdrant",
        query={"store_timeout_s": 20.0},  # a loaded 2-core machine: answers, not timeouts, are compared
        backup={"snapshot_target": str(tmp_path / "sets"), "snapshot_keep": 2, "spool_dir": str(tmp_path / "spool")},
    )
    client = MemoryClient(settings)
    client.init()
    yield client
    url, headers = _qdrant(client)
    for info in client.stack.require_vectors().collections():
        httpx.delete(f"{url}/collections/{info.name}", headers=headers)
    client.close()


def test_qdrant_snapshot_set_restores_lost_collection_and_catches_up(server_cluster: MemoryClient) -> None:
    client = server_cluster
    client.add(_memories(N))
    first = backup_qdrant(client.stack)
    assert first["points"] == N and first["shards"] >= 1 and first["bytes"] > 0
    manifest = json.loads((Path(first["target"]) / first["set"] / "manifest.json").read_text())
    (coll,) = manifest["collections"]
    assert coll["active"] and coll["points"] == N and coll["model_id"] == client.stack.embedder.info.model_id
    # Written after the snapshot: the restore must not lose them (the catch-up re-delivers them).
    client.add(_memories(25, seed=1))
    before = _answers(client)

    url, headers = _qdrant(client)
    httpx.delete(f"{url}/collections/{coll['name']}", headers=headers).raise_for_status()  # the data is gone
    assert client.stack.require_vectors().collections() == []

    restored = restore_qdrant(client.stack)
    assert restored["set"] == first["set"] and restored["collections"] == {coll["name"]: N}
    catch_up = reconcile(client.stack, repair=True)
    assert catch_up.stores["vector"].missing == 25 and catch_up.unrepaired == 0
    assert reconcile(client.stack).drift == 0
    assert client.stack.require_vectors().count() == N + 25
    after = _answers(client)
    assert same_answers(after, before), [
        (i, a, b) for i, (a, b) in enumerate(zip(after, before, strict=True)) if a != b
    ]
    runs = {r["command"]: r for r in client.stack.runs.recent(limit=10)}
    assert runs["backup-qdrant"]["status"] == "ok" and runs["restore-qdrant"]["counts"]["points"] == N


def test_snapshot_sets_are_pruned_and_incomplete_sets_ignored(server_cluster: MemoryClient, tmp_path: Path) -> None:
    client = server_cluster
    client.add(_memories(50))
    sets = tmp_path / "sets"
    (sets / "20200101T000000Z").mkdir(parents=True)  # a run that died while shipping: no manifest
    names = []
    for _ in range(3):
        names.append(backup_qdrant(client.stack)["set"])
        _next_second()  # set names have a resolution of one second
    assert sorted(p.name for p in sets.iterdir()) == names[-2:]  # keep = 2; the incomplete one pruned too
    status = backup_status(client.stack)
    qdrant = status.stores["qdrant"]
    assert qdrant.count == 2 and qdrant.detail["newest_points"] == 50 and qdrant.error is None
    assert not qdrant.stale(status.max_age_s, status.checked_at)
    with pytest.raises(BackupError, match="no complete snapshot set"):
        restore_qdrant(client.stack, name="20200101T000000Z")


def test_rebuild_graph_from_postgres(server_cluster: MemoryClient, neo4j_clean: dict[str, str]) -> None:
    client = server_cluster
    client.add(_memories(N))
    client.forget([uuid.UUID(int=3)], agent_id="a1")  # a soft-deleted memory keeps its flag in the graph
    before = _answers(client)
    graph = client.stack.require_graph()
    from tests.conftest import wipe_neo4j

    wipe_neo4j(neo4j_clean)  # Neo4j's data is lost (constraints survive a wipe; rebuild ensures them anyway)
    assert graph.count() == 0
    stray = uuid.uuid4()
    from memoryctl.stores.protocols import GraphMemory

    graph.upsert_memories([GraphMemory(stray, "a1", datetime.now(UTC), False, [], [], [])])
    result = rebuild_graph(client.stack)
    assert result["memories"] == N and result["orphans_removed"] == 1 and result["graph_count"] == N
    assert reconcile(client.stack).drift == 0
    after = _answers(client)
    assert same_answers(after, before), [
        (i, a, b) for i, (a, b) in enumerate(zip(after, before, strict=True)) if a != b
    ]
    assert rebuild_graph(client.stack)["graph_count"] == N  # again: idempotent


# ------------------------------------------------------------------------------------ pgBackRest


def _as_postgres(*argv: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    command = ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)
    return subprocess.run(command, capture_output=True, text=True, check=True, **kwargs)  # type: ignore[call-overload,no-any-return]


@pytest.fixture
def pgbackrest_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """A throwaway PostgreSQL cluster archiving WAL into a local pgBackRest repository."""
    if shutil.which("pgbackrest") is None:
        pytest.fail("pgbackrest is not installed (apt-get install pgbackrest; .ci/apt-packages.txt)", pytrace=False)
    pgbin = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
    root = Path(f"/var/tmp/memoryctl-pgbackrest-{uuid.uuid4().hex[:8]}")  # the postgres user must reach it
    root.mkdir(mode=0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data, repo, port = root / "data", root / "repo", _free_port()
    config = root / "pgbackrest.conf"
    config.write_text(
        f"[global]\nrepo1-path={repo}\nrepo1-retention-full=2\nrepo1-cipher-type=aes-256-cbc\n"
        f"repo1-cipher-pass=test-only-passphrase\ncompress-type=zst\nstart-fast=y\nlog-path={root}\n"
        f"lock-path={root}\nspool-path={root}\nlog-level-console=warn\nlog-level-file=off\n"
        f"[memoryctl]\npg1-path={data}\npg1-port={port}\npg1-socket-path={root}\n"
    )
    if os.geteuid() == 0:
        shutil.chown(config, "postgres", "postgres")
    _as_postgres(str(pgbin / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
    with (data / "postgresql.conf").open("a") as fh:
        fh.write(
            f"port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{root}'\n"
            f"wal_level = replica\narchive_mode = on\narchive_timeout = 60\n"
            f"archive_command = 'pgbackrest --config={config} --stanza=memoryctl archive-push %p'\n"
        )
    pg_ctl = [str(pgbin / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60"]
    _as_postgres(*pg_ctl, "start")
    pgbackrest = ["pgbackrest", f"--config={config}", "--stanza=memoryctl"]
    try:
        _as_postgres(*pgbackrest, "stanza-create")
        yield {
            "dsn": f"postgresql://postgres@127.0.0.1:{port}/postgres",
            "pg_ctl": pg_ctl,
            "pgbackrest": pgbackrest,
            "command": [
                *(["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []),
                "pgbackrest",
                f"--config={config}",
            ],
            "repo": repo,
        }
    finally:
        subprocess.run(["runuser", "-u", "postgres", "--", *pg_ctl, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _content(dsn: str) -> tuple[int, str]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*), md5(string_agg(id::text || text, ',' ORDER BY id)) FROM memories"
        ).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


@pytest.mark.slow
def test_pgbackrest_point_in_time_restore_and_status(
    pgbackrest_cluster: dict[str, object], neo4j_clean: dict[str, str], tmp_path: Path
) -> None:
    """Backup, more writes, a time T, the database dropped: restored to T, counts and content equal."""
    cluster = pgbackrest_cluster
    base = str(cluster["dsn"]).rsplit("/", 1)[0]
    with psycopg.connect(str(cluster["dsn"]), autocommit=True) as conn:
        conn.execute("CREATE DATABASE memoryctl")
    dsn = f"{base}/memoryctl"
    settings = cluster_settings(
        dsn,
        neo4j_clean,
        tmp_path / "qdrant",
        backup={"pgbackrest_stanza": "memoryctl", "pgbackrest_command": cluster["command"]},
    )
    client = MemoryClient(settings)
    client.init()
    client.add(_memories(300), deliver=False)

    stale = backup_status(client.stack).stores["postgres"]
    assert stale.error is None and stale.count == 0 and stale.stale(3600, datetime.now(UTC))

    pgbackrest = [str(a) for a in cluster["pgbackrest"]]  # type: ignore[attr-defined]
    _as_postgres(*pgbackrest, "--type=full", "backup")
    # pgBackRest picks a backup whose stop time, in whole seconds, is before the target's whole
    # second ("unable to find backup set with stop time less than …" otherwise): on a quiet machine
    # the writes and T below can fall in the backup's last second.
    _next_second()
    client.add(_memories(50, seed=1), deliver=False)  # after the backup: only the WAL has these
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_switch_wal()")
    expected = _content(dsn)
    # T: the server's clock after those commits (anything committed later is after T).
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    target: datetime = row[0]

    report = backup_status(client.stack)
    pg = report.stores["postgres"]
    assert pg.error is None and pg.count == 1 and pg.last_backup is not None and pg.bytes and pg.bytes > 0
    assert pg.restorable is not None and pg.restorable >= pg.last_backup and not pg.archive_failing
    assert report.exit_code == 0  # Qdrant snapshots are not configured here, Neo4j has no backup of its own
    text = prometheus(report)
    assert 'memoryctl_backup_status_ok{store="postgres"} 1' in text
    if shutil.which("promtool"):
        lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout + lint.stderr
    client.close()

    with psycopg.connect(str(cluster["dsn"]), autocommit=True) as conn:
        # Some transaction commits between T and the drop, as the cluster's cron jobs do all day: a
        # time target replays up to the first commit after it, and since PostgreSQL 15.4 a DROP
        # DATABASE marks the database invalid before its own commit (docs/backup.md, the caveat).
        conn.execute("SELECT txid_current()")
        conn.execute("DROP DATABASE memoryctl WITH (FORCE)")
        conn.execute("SELECT pg_switch_wal()")  # the segment holding T reaches the repository
    pg_ctl = [str(a) for a in cluster["pg_ctl"]]  # type: ignore[attr-defined]
    _wait_archived(str(cluster["dsn"]))
    _as_postgres(*pg_ctl, "-m", "fast", "stop")
    started = time.perf_counter()
    _as_postgres(
        *pgbackrest,
        "--delta",
        "--type=time",
        f"--target={target.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%S.%f+00')}",
        "--target-action=promote",
        "restore",
    )
    _as_postgres(*pg_ctl, "start")  # returns once read-only connections are accepted: mid-recovery
    _wait_promoted(str(cluster["dsn"]))
    print(f"pgBackRest PITR restore: {time.perf_counter() - started:.1f} s")  # a figure, not an assertion
    assert _content(dsn) == expected


def _next_second(timeout: float = 5.0) -> None:
    """Poll until the wall clock's second has changed (what names a snapshot set)."""
    now = datetime.now(UTC).replace(microsecond=0)
    deadline = time.monotonic() + timeout
    while datetime.now(UTC).replace(microsecond=0) == now:
        assert time.monotonic() < deadline, "the clock did not move"
        time.sleep(0.05)


def _wait_promoted(dsn: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        if row is not None and not row[0]:
            return
        time.sleep(0.3)
    raise AssertionError("recovery did not finish in time")


def _wait_archived(dsn: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            ready = conn.execute("SELECT count(*) FROM pg_ls_archive_statusdir() WHERE name LIKE '%.ready'").fetchone()
            if ready is not None and ready[0] == 0:
                return
            time.sleep(0.3)
    raise AssertionError("WAL was not archived in time")


def test_cli_backup_and_restore_with_writes_waiting_in_the_outbox(
    pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path
) -> None:
    """The commands as cron and an operator run them: writes made while the collection is gone wait
    in the outbox and arrive with the restore's catch-up; exit codes as documented."""
    from memoryctl.cli.main import _invoke
    from tests.conftest import write_cluster_config

    config = write_cluster_config(
        tmp_path / "memoryctl.toml",
        pg_dsn,
        neo4j_clean,
        tmp_path / "qdrant",
        query={"store_timeout_s": 20.0},
        backup={"snapshot_target": str(tmp_path / "sets"), "spool_dir": str(tmp_path / "spool")},
    )
    client = MemoryClient(cluster_settings(pg_dsn, neo4j_clean, tmp_path / "qdrant", backup={}))
    client.init()
    client.add(_memories(120))
    assert _invoke(["--config", str(config), "backup", "status"]) == 3  # no snapshot set yet: stale
    assert _invoke(["--config", str(config), "backup", "qdrant"]) == 0
    assert _invoke(["--config", str(config), "backup", "status"]) == 0
    url, headers = _qdrant(client)
    (info,) = client.stack.require_vectors().collections()
    httpx.delete(f"{url}/collections/{info.name}", headers=headers).raise_for_status()
    outcome = client.add(_memories(15, seed=2))
    assert outcome.pending["qdrant"] == 15  # the vector store cannot take them: they wait
    lost = [m.id for m in _memories(5)]
    client.stack.require_graph().delete(lost)  # graph drift: `rebuild graph`'s, not the restore's
    assert _invoke(["--config", str(config), "restore", "qdrant"]) == 0
    after = reconcile(client.stack)
    assert after.stores["vector"].drift == 0 and after.stores["graph"].missing == 5, after.as_dict()
    assert client.stack.require_vectors().count() == 135
    assert _invoke(["--config", str(config), "rebuild", "graph"]) == 0
    assert reconcile(client.stack).drift == 0
    assert _invoke(["--config", str(config), "restore", "qdrant", "--set", "20200101T000000Z"]) == 1
    client.close()
