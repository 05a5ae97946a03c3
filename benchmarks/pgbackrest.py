"""pgBackRest at N memories: full backup, repository size, point-in-time restore, on this machine.

A throwaway PostgreSQL cluster (Debian's server binaries, as the postgres user) archives WAL into a
local, encrypted pgBackRest repository (zstd), the way the deploy configures the real one (there
the repository is on another node, over TLS); memoryctl writes N memories into it (PostgreSQL only:
that is what pgBackRest backs up). Then: a full backup (timed, sized), more writes, a time T, the
database dropped, and a restore to T (timed from the stop of the server to the end of recovery).

    python benchmarks/pgbackrest.py --n 20000

Needs root (the cluster runs as postgres), pgbackrest and postgresql installed. Prints one JSON
object; figures measured here are in docs/backup.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.backup import BATCH, memories  # noqa: E402
from memoryctl.client import MemoryClient  # noqa: E402
from memoryctl.config import load_settings  # noqa: E402


def as_postgres(*argv: str) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True, capture_output=True, text=True)


def wait(dsn: str, sql: str, want: Any, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute(sql).fetchone()
            if row is not None and row[0] == want:
                return
        except psycopg.OperationalError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"timed out waiting for {sql!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20_000)
    args = parser.parse_args()
    pgbin = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
    root = Path(tempfile.mkdtemp(prefix="memoryctl-pgbackrest-bench-", dir="/var/tmp"))
    shutil.chown(root, "postgres", "postgres")
    root.chmod(0o755)
    data, repo, port = root / "data", root / "repo", 55599
    config = root / "pgbackrest.conf"
    config.write_text(
        f"[global]\nrepo1-path={repo}\nrepo1-retention-full=2\nrepo1-cipher-type=aes-256-cbc\n"
        f"repo1-cipher-pass=benchmark-only\ncompress-type=zst\nstart-fast=y\nprocess-max=2\nlog-path={root}\n"
        f"lock-path={root}\nspool-path={root}\nlog-level-console=warn\nlog-level-file=off\n"
        f"[memoryctl]\npg1-path={data}\npg1-port={port}\npg1-socket-path={root}\n"
    )
    shutil.chown(config, "postgres", "postgres")
    pg_ctl = [str(pgbin / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "120"]
    pgbackrest = ["pgbackrest", f"--config={config}", "--stanza=memoryctl"]
    out: dict[str, Any] = {"n": args.n}
    try:
        as_postgres(str(pgbin / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        with (data / "postgresql.conf").open("a") as fh:
            fh.write(
                f"port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{root}'\n"
                f"wal_level = replica\narchive_mode = on\narchive_timeout = 60\nshared_buffers = 128MB\n"
                f"archive_command = 'pgbackrest --config={config} --stanza=memoryctl archive-push %p'\n"
            )
        as_postgres(*pg_ctl, "start")
        as_postgres(*pgbackrest, "stanza-create")
        admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE memoryctl")
        dsn = f"postgresql://postgres@127.0.0.1:{port}/memoryctl"
        settings = load_settings(
            Path(os.devnull),
            profile="cluster",
            data_dir=str(root / "mctl"),
            postgres={"dsn": dsn},
            qdrant={"url": "http://127.0.0.1:9"},  # never reached: PostgreSQL only
            embedder={"kind": "hash"},
        )
        client = MemoryClient(settings)
        client.stack.records  # noqa: B018 - the schema
        items = memories(args.n)
        started = time.perf_counter()
        for i in range(0, len(items), BATCH):
            client.add(items[i : i + BATCH], deliver=False)
        out["import_s"] = round(time.perf_counter() - started, 1)
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT pg_database_size('memoryctl')").fetchone()
        out["database_bytes"] = int(row[0]) if row else None
        started = time.perf_counter()
        as_postgres(*pgbackrest, "--type=full", "backup")
        out["full_backup_s"] = round(time.perf_counter() - started, 1)
        out["repository_bytes_after_full"] = sum(p.stat().st_size for p in repo.rglob("*") if p.is_file())
        client.add(memories(args.n + 1000)[args.n :], deliver=False)  # 1,000 more: in the WAL only
        client.close()
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT count(*) FROM memories").fetchone()
        expected = int(row[0]) if row else -1
        time.sleep(1.1)
        target = datetime.now(UTC)
        time.sleep(1.1)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("SELECT txid_current()")
            conn.execute("DROP DATABASE memoryctl WITH (FORCE)")
            conn.execute("SELECT pg_switch_wal()")
        wait(admin, "SELECT count(*) FROM pg_ls_archive_statusdir() WHERE name LIKE '%.ready'", 0)
        started = time.perf_counter()
        as_postgres(*pg_ctl, "-m", "fast", "stop")
        when = target.strftime("%Y-%m-%d %H:%M:%S.%f+00")
        as_postgres(*pgbackrest, "--delta", "--type=time", f"--target={when}", "--target-action=promote", "restore")
        as_postgres(*pg_ctl, "start")
        wait(admin, "SELECT pg_is_in_recovery()", False)
        out["pitr_restore_s"] = round(time.perf_counter() - started, 1)
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT count(*) FROM memories").fetchone()
        out["restored_rows_equal"] = bool(row and int(row[0]) == expected)
        out["repository_bytes"] = sum(p.stat().st_size for p in repo.rglob("*") if p.is_file())
        scale = 500_000 / args.n
        out["extrapolated_500k"] = {
            "database_gb": round(out["database_bytes"] * scale / 1e9, 2),
            "full_backup_s": round(out["full_backup_s"] * scale),
            "full_backup_repository_gb": round(out["repository_bytes_after_full"] * scale / 1e9, 2),
            "pitr_restore_s": round(out["pitr_restore_s"] * scale),
        }
        out["load_average"] = os.getloadavg()
    finally:
        subprocess.run(["runuser", "-u", "postgres", "--", *pg_ctl, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
