"""pgBackRest's second repository (repo2, S3) against a real S3-compatible server, and the archive
queue bounded while that repository is away: real pgBackRest on both sides of the deploy's
topology, configured by the deploy's template, a throwaway PostgreSQL (tests/pgbackrest_pair.py).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC

import pytest

from deploy.common import render
from tests.pg_servers import as_postgres, free_port, pgbin, wait_until
from tests.pgbackrest_pair import SEGMENT, STANZA, PgbackrestPair, elapsed

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def pair() -> Iterator[PgbackrestPair]:
    both = PgbackrestPair(queue_max=64 * 1024**2)
    try:
        yield both
    finally:
        both.close()


def test_second_repository_in_s3_backs_up_archives_and_restores(pair: PgbackrestPair) -> None:
    """stanza-create on both repositories, WAL archived to both, a full backup to repo2 alone, and a
    restore from repo2 (base backup and WAL fetched from the bucket) into a fresh data directory
    that starts and holds every row written, those after the backup too."""
    assert "repo2-type=s3" in pair.repo_conf and "repo2-host=127.0.0.2" not in pair.repo_conf
    assert "repo2-host=127.0.0.3" in pair.db_conf and "repo2-cipher-pass" not in pair.db_conf
    pair.repo("stanza-create")
    pair.repo("check")  # a WAL segment reaches both repositories
    pair.sql("CREATE TABLE rows_written (id int PRIMARY KEY, note text)")
    pair.sql("INSERT INTO rows_written SELECT g, md5(g::text) FROM generate_series(1, 1000) g")
    pair.repo("--repo=2", "--type=full", "backup")
    pair.sql("INSERT INTO rows_written SELECT g, md5(g::text) FROM generate_series(1001, 1500) g")
    segment = pair.switch_and_wait_archived()

    info = pair.info()
    print(f"pgbackrest info: backups {[(b['label'], b['database']['repo-key']) for b in info['backup']]}")
    print(f"pgbackrest info: archive {[(a['database']['repo-key'], a['min'], a['max']) for a in info['archive']]}")
    assert [b["database"]["repo-key"] for b in info["backup"]] == [2]  # repo2 only: repo1 has none
    archived = {a["database"]["repo-key"]: a["max"] for a in info["archive"]}
    assert set(archived) == {1, 2} and all(m >= segment for m in archived.values()), archived
    objects = pair.objects()
    print(f"S3 bucket: {len(objects)} objects, e.g. {sorted(objects)[:3]}")
    assert any(key.startswith(f"/memoryctl/backup/{STANZA}/") or f"backup/{STANZA}/" in key for key in objects)
    assert any(f"archive/{STANZA}/" in key and segment in key for key in objects)

    pg_ctl, port = _restore(pair, 2)
    try:
        as_postgres(*pg_ctl, "-o", f"-p {port}", "start")
    except subprocess.CalledProcessError:
        raise AssertionError((pair.root / "restored.log").read_text()[-3000:]) from None
    try:
        dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres?sslmode=disable&gssencmode=disable"
        import psycopg

        def promoted() -> bool:
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
            return row is not None and row[0] is False

        wait_until(promoted, 120)
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT count(*), max(id) FROM rows_written").fetchone()
        print(f"restored from repo2: rows {row}")
        assert row == (1500, 1500)
        log = (pair.root / "restored.log").read_text()
        assert "restored log file" in log  # WAL came from the archive (repo2), not only the backup
    finally:
        as_postgres(*pg_ctl, "-m", "immediate", "stop")


def _restore(pair: PgbackrestPair, repo: int, *options: str) -> tuple[list[str], int]:
    """A restore from repository ``repo`` on the database side into a fresh data directory (WAL
    fetched from the same repository), not started: its pg_ctl command and a free port for it."""
    restored = pair.root / "restored"
    as_postgres("mkdir", "-m", "700", str(restored))
    pair.db(
        f"--repo={repo}",
        f"--pg1-path={restored}",
        "--archive-mode=off",  # the copy must not archive into the stanza it came from
        f"--recovery-option=restore_command={pair.db_wrapper} --stanza={STANZA} --repo={repo} --pg1-path={restored} "
        'archive-get %f "%p"',
        *options,
        "restore",
    )
    pg_ctl = [str(pgbin() / "pg_ctl"), "-D", str(restored), "-l", str(pair.root / "restored.log"), "-w", "-t", "120"]
    return pg_ctl, free_port()


QUEUE_MAX = 64 * 1024**2  # 4 WAL segments: pgBackRest counts the queue in whole segments


@pytest.fixture
def small_queue() -> Iterator[PgbackrestPair]:
    # max_wal_size small so that checkpoints recycle what pgBackRest lets go of promptly
    both = PgbackrestPair(
        queue_max=QUEUE_MAX, pg_conf="max_wal_size = 64MB\nmin_wal_size = 32MB\ncheckpoint_timeout = 30s\n"
    )
    try:
        yield both
    finally:
        both.close()


class _Timeline:
    """pg_wal and the archive queue every half second, read by the deploy's own metrics script
    (templates/node-exporter/wal-metrics.j2, what WalArchiveQueueFilling is evaluated on)."""

    def __init__(self, pair: PgbackrestPair) -> None:
        textfile = pair.root / "textfile"
        textfile.mkdir()
        self.script = pair.root / "wal-metrics"
        self.script.write_text(
            render(
                "node-exporter/wal-metrics.j2",
                pg_wal=str(pair.pg.data / "pg_wal"),
                textfile_dir=str(textfile),
                queue_max=QUEUE_MAX,
            )
        )
        self.out = textfile / "memoryctl-wal.prom"
        self.phase = "repository up"
        self.rows: list[tuple[float, str, int, int]] = []
        self.start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def metrics(self) -> dict[str, int]:
        subprocess.run(["sh", str(self.script)], check=True)
        lines = [line.split() for line in self.out.read_text().splitlines() if not line.startswith("#")]
        return {name: int(value) for name, value in lines}

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            m = self.metrics()
            self.rows.append(
                (elapsed(self.start), self.phase, m["memoryctl_pg_wal_bytes"], m["memoryctl_wal_archive_queue_bytes"])
            )

    def mark(self, phase: str) -> None:
        self.phase = phase
        print(f"t={elapsed(self.start):6.1f}s  -- {phase}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def print(self) -> None:
        mb = 1024**2
        print(f"WAL timeline (archive-push-queue-max {QUEUE_MAX // mb} MB; alert condition: queue > half of it)")
        print("    t (s)  phase                     pg_wal MB  queue MB  WalArchiveQueueFilling condition")
        last = None
        for t, phase, wal, queue in self.rows:
            shown = (phase, wal // mb, queue // mb)
            if shown != last:  # the changes only
                alert = "true" if queue > QUEUE_MAX / 2 else "-"
                print(f"  {t:7.1f}  {phase:24}  {wal / mb:9.0f}  {queue / mb:8.0f}  {alert}")
                last = shown


@pytest.mark.drill  # about 2.5 minutes, 2 of them pgBackRest's retries against the missing bucket
def test_wal_queue_stops_at_its_maximum_while_the_bucket_is_away_and_archiving_resumes(
    small_queue: PgbackrestPair,
) -> None:
    """The S3 repository cut off while a writer generates five times the queue limit in WAL:
    PostgreSQL accepts every write, the un-archived WAL stops near the limit (pgBackRest drops it
    and says so in PostgreSQL's log), pg_wal stays bounded; the bucket back, archiving resumes to
    both repositories. The timeline is printed (pytest -s)."""
    pair = small_queue
    pair.repo("stanza-create")
    pair.repo("check")
    pair.sql("CREATE TABLE filler (id bigserial PRIMARY KEY, pad text)")
    pair.repo("--type=full", "backup")  # repo1: the base a point-in-time restore across the gap starts from
    timeline = _Timeline(pair)
    try:
        time.sleep(2)
        assert pair.gate is not None
        pair.gate.away()
        timeline.mark("repository away")
        start_lsn = pair.sql("SELECT pg_current_wal_lsn()")
        batches = 0
        while int(pair.sql("SELECT pg_current_wal_lsn() - %s::pg_lsn", start_lsn)) < 5 * QUEUE_MAX:
            pair.sql(
                "INSERT INTO filler (pad) SELECT md5(random()::text) || repeat('x', 200) FROM generate_series(1, 40000)"
            )
            batches += 1
        generated = int(pair.sql("SELECT pg_current_wal_lsn() - %s::pg_lsn", start_lsn))
        timeline.mark(f"writer done ({batches} batches, {generated // 1024**2} MB of WAL)")
        log = pair.root / "server.log"
        wait_until(lambda: "dropped WAL file" in log.read_text(), 180)
        timeline.mark("pgBackRest dropped the queue")
        time.sleep(3)
        pair.sql("INSERT INTO filler (pad) VALUES ('still accepting writes')")  # PostgreSQL never stopped
        target = pair.sql("SELECT clock_timestamp()")  # after the gap: a restore to it must replay through it
        pair.sql("SELECT txid_current()")  # a commit after the target, as on a live cluster
        assert pair.sql("SELECT count(*) FROM filler") == batches * 40000 + 1
        pair.gate.back()
        timeline.mark("repository back")
        segment = pair.switch_and_wait_archived(180)
        timeline.mark(f"archive caught up ({segment})")
        assert timeline.metrics()["memoryctl_wal_archive_queue_bytes"] == 0  # nothing left waiting
        time.sleep(3)
        pair.repo("check")  # a new segment reaches both repositories again
        pair.sql("CHECKPOINT")  # recycles the segments pgBackRest let go of (as the next one would)
        timeline.mark("after a CHECKPOINT")
        time.sleep(1.5)
        wal_after = timeline.metrics()["memoryctl_pg_wal_bytes"]
    finally:
        timeline.stop()
        timeline.print()
        for line in (pair.root / "log-db" / "memoryctl-archive-push-async.log").read_text().splitlines():
            if " P00 " in line and ("begin" in line or "end" in line or "WARN" in line or "ERROR" in line):
                print("  async log:", line[:200])
    dropped = [line for line in (pair.root / "server.log").read_text().splitlines() if "dropped WAL file" in line]
    print(f"PostgreSQL's log, pgBackRest's warning ({len(dropped)} lines), first: {dropped[0].strip()}")
    names = [line.split("'")[1] for line in dropped]
    in_repo1 = [n for n in names if list((pair.root / "repo1").rglob(f"{n}-*"))]
    in_repo2 = [n for n in names if any(f"/{n}-" in key for key in pair.objects())]
    print(f"of the {len(names)} dropped segments, repo1 holds {len(in_repo1)}, repo2 {len(in_repo2)}")
    away = [row for row in timeline.rows if row[1] != "repository up"]
    peak_queue, peak_wal = max(row[3] for row in away), max(row[2] for row in away)
    mb = 1024**2
    print(
        f"peak queue {peak_queue / mb:.0f} MB, peak pg_wal {peak_wal / mb:.0f} MB, WAL written {generated / mb:.0f} MB"
    )
    assert generated >= 5 * QUEUE_MAX and len(names) * SEGMENT > QUEUE_MAX
    assert peak_queue > QUEUE_MAX / 2  # the alert's condition was met on the way
    assert wal_after <= QUEUE_MAX + 64 * mb  # pg_wal back to its ordinary size (max_wal_size)

    # A point-in-time restore to a moment after the gap, from repo1 (its backup is from before the
    # gap): PostgreSQL asks for the first dropped segment, pgBackRest has none, and recovery refuses
    # to end short of the target (PostgreSQL 13+) instead of opening a database that lacks the gap.
    pg_ctl, port = _restore(
        pair, 1, "--type=time", f"--target={target.astimezone(UTC):%Y-%m-%d %H:%M:%S.%f+00}", "--target-action=promote"
    )
    # pg_ctl returns once read-only connections are accepted, mid-recovery: the refusal comes later
    subprocess.run(["runuser", "-u", "postgres", "--", *pg_ctl, "-o", f"-p {port}", "start"], capture_output=True)
    restored_log = pair.root / "restored.log"
    wait_until(lambda: "FATAL" in restored_log.read_text() or "selected new timeline" in restored_log.read_text(), 120)
    log = restored_log.read_text()
    print("point-in-time restore across the gap, PostgreSQL's log:")
    print("\n".join(line for line in log.splitlines() if "FATAL" in line or "restored log file" in line)[-2000:])
    status = subprocess.run(["runuser", "-u", "postgres", "--", *pg_ctl[:3], "status"], capture_output=True)
    if status.returncode == 0:
        subprocess.run(["runuser", "-u", "postgres", "--", *pg_ctl, "-m", "immediate", "stop"], capture_output=True)
    assert "recovery ended before configured recovery target was reached" in log, log[-2000:]
    assert status.returncode != 0  # the server did not open
