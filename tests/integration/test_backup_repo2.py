"""pgBackRest's second repository (repo2, S3) against a real S3-compatible server, and the archive
queue bounded while that repository is away: real pgBackRest on both sides of the deploy's
topology, configured by the deploy's template, a throwaway PostgreSQL (tests/pgbackrest_pair.py).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.pg_servers import as_postgres, free_port, pgbin, wait_until
from tests.pgbackrest_pair import STANZA, PgbackrestPair

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

    restored = pair.root / "restored"
    as_postgres("mkdir", "-m", "700", str(restored))
    pair.db(
        "--repo=2",
        f"--pg1-path={restored}",
        "--archive-mode=off",  # the copy must not archive into the stanza it came from
        f"--recovery-option=restore_command={pair.db_wrapper} --stanza={STANZA} --repo=2 --pg1-path={restored} "
        'archive-get %f "%p"',
        "restore",
    )
    port = free_port()
    pg_ctl = [str(pgbin() / "pg_ctl"), "-D", str(restored), "-l", str(pair.root / "restored.log"), "-w", "-t", "120"]
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
