"""The deploy's pgBackRest topology on one machine, for tests: a database side (a throwaway PostgreSQL,
pgBackRest's TLS server on 127.0.0.2) and a repository side (repo1 posix, optionally repo2 in an
S3 bucket, its TLS server on 127.0.0.3), both configured by the deploy's own template
(templates/pgbackrest/pgbackrest.conf.j2) and admitting each other by certificates of a CA from
deploy/pki.py, as on the nodes.

What differs from a node is only where things are — log, lock and spool paths, PostgreSQL's socket
and port, the S3 server's port and CA — set through pgBackRest's ``PGBACKREST_*`` environment, which
overrides the configuration file (command line > environment > file), in one wrapper script per
side that every pgBackRest command of the test runs through (archive_command too).

The S3 server is moto's server mode (PyPI ``moto[s3]`` with flask: ``python -m moto.server``),
reached over TLS through a :class:`tests.relay.Gate` that holds a certificate of the same CA:
pgBackRest speaks S3 over TLS only, and checks the server's certificate against that CA
(``repo2-storage-ca-file``, no ``verify-tls=n``). The gate also takes the bucket away and brings it
back while moto keeps what it holds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from deploy.common import render
from deploy.pki import CertificateAuthority
from tests.pg_servers import Server, as_postgres, free_port, wait_until
from tests.relay import Gate
from wireguard.keys import SecretDir

STANZA = "memoryctl"
DB_ADDRESS, REPO_ADDRESS, S3_ADDRESS = "127.0.0.2", "127.0.0.3", "127.0.0.1"
BUCKET, REGION = "memoryctl-backups", "us-east-1"
SEGMENT = 16 * 1024**2


def _listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


class PgbackrestPair:
    """Both sides, started; ``db(...)`` and ``repo(...)`` run pgBackRest on either side as postgres."""

    def __init__(self, *, queue_max: int, with_repo2: bool = True, pg_conf: str = "") -> None:
        if shutil.which("pgbackrest") is None:
            pytest.fail("pgbackrest is not installed (apt-get install pgbackrest; .ci/apt-packages.txt)", pytrace=False)
        self.queue_max = queue_max
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pg = Server("pgbackrest-pair")
        self.root = self.pg.root
        self.gate: Gate | None = None
        ca = CertificateAuthority(SecretDir(self.root / "ca"), "pgbackrest")
        for side, name, address in (("db", "db", DB_ADDRESS), ("repo", "repo", REPO_ADDRESS)):
            cert = ca.node(name, address)
            tls = self.root / f"tls-{side}"
            tls.mkdir()
            for file, pem in (("ca.crt", cert.ca), ("node.crt", cert.cert), ("node.key", cert.key)):
                (tls / file).write_text(pem + "\n")
                (tls / file).chmod(0o600 if file.endswith(".key") else 0o644)
        for directory in ("repo1", "log-db", "log-repo", "lock-db", "lock-repo", "spool"):
            (self.root / directory).mkdir()
        repository2 = self._s3(ca) if with_repo2 else None
        self.tls_port = free_port()
        common = {"stanza": STANZA, "tls_port": self.tls_port, "pg_data": str(self.pg.data), "process_max": 2}
        self.repo_conf = render(
            "pgbackrest/pgbackrest.conf.j2",
            side="repository",
            mesh_address=REPO_ADDRESS,
            tls_dir=str(self.root / "tls-repo"),
            peer_names=["db"],
            peer_addresses=[DB_ADDRESS],
            repository={"type": "posix", "path": str(self.root / "repo1")},
            cipher_pass="test-only-passphrase",
            retention_full=2,
            retention_diff=7,
            repository2=repository2,
            **common,
        )
        self.db_conf = render(
            "pgbackrest/pgbackrest.conf.j2",
            side="database",
            mesh_address=DB_ADDRESS,
            tls_dir=str(self.root / "tls-db"),
            peer_names=["repo"],
            peer_addresses=[REPO_ADDRESS],
            archive_push_queue_max=queue_max,
            repository2=with_repo2,
            **common,
        )
        where = {"PGBACKREST_PG1_PORT": str(self.pg.port)}
        self.db_wrapper = self._wrapper(
            "db",
            self.db_conf,
            {
                **where,
                "PGBACKREST_LOG_PATH": str(self.root / "log-db"),
                "PGBACKREST_LOCK_PATH": str(self.root / "lock-db"),
                "PGBACKREST_SPOOL_PATH": str(self.root / "spool"),
                "PGBACKREST_PG1_SOCKET_PATH": str(self.root),
                # the other side's configuration file (on a node both are /etc/pgbackrest.conf)
                **{f"PGBACKREST_REPO{n}_HOST_CONFIG": str(self.root / "pgbackrest-repo.conf") for n in (1, 2)},
            },
        )
        repo_env = {
            **where,
            "PGBACKREST_LOG_PATH": str(self.root / "log-repo"),
            "PGBACKREST_LOCK_PATH": str(self.root / "lock-repo"),
            "PGBACKREST_PG1_HOST_CONFIG": str(self.root / "pgbackrest-db.conf"),
        }
        if with_repo2:
            repo_env["PGBACKREST_REPO2_STORAGE_CA_FILE"] = str(self.root / "tls-repo" / "ca.crt")
        self.repo_wrapper = self._wrapper("repo", self.repo_conf, repo_env)
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", "postgres:postgres", str(self.root)], check=True)
        self.pg.initdb(
            "wal_level = replica\narchive_mode = on\narchive_timeout = 60\n"
            f"archive_command = '{self.db_wrapper} --stanza={STANZA} archive-push %p'\n{pg_conf}"
        )
        self.pg.start()
        for side, address in (("db", DB_ADDRESS), ("repo", REPO_ADDRESS)):
            wrapper = self.db_wrapper if side == "db" else self.repo_wrapper
            self._spawn([*self._as_postgres_argv(str(wrapper), "server")], self.root / f"server-{side}.log")
            wait_until(lambda a=address: _listening(a, self.tls_port), 30)  # type: ignore[misc]

    # ------------------------------------------------------------------------------ set-up parts

    def _s3(self, ca: CertificateAuthority) -> dict[str, Any]:
        """moto's S3 server over TLS, a bucket in it, the gate in front; the template's repo2 settings."""
        cert = ca.node("s3", S3_ADDRESS)
        s3 = self.root / "s3"
        s3.mkdir()
        (s3 / "s3.crt").write_text(cert.cert + "\n")
        (s3 / "s3.key").write_text(cert.key + "\n")
        (s3 / "ca.crt").write_text(cert.ca + "\n")
        port = free_port()
        argv = [sys.executable, "-m", "moto.server", "-H", S3_ADDRESS, "-p", str(port)]
        self._spawn(argv, s3 / "moto.log")
        wait_until(lambda: _listening(S3_ADDRESS, port), 60)
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(s3 / "s3.crt", s3 / "s3.key")
        self.gate = Gate((S3_ADDRESS, port), tls)
        self.s3_url = f"https://{S3_ADDRESS}:{self.gate.port}"
        self.bucket().create_bucket(Bucket=BUCKET)
        return {
            "type": "s3",
            "path": "/memoryctl",
            "endpoint": S3_ADDRESS,
            "bucket": BUCKET,
            "region": REGION,
            "uri_style": "path",
            "port": self.gate.port,
            "key": "test-only-key",
            "key_secret": "test-only-secret",
            "retention_full": 1,
            "retention_diff": 3,
        }

    def bucket(self) -> Any:
        """A boto3 client of the S3 server (through the gate, while it is open), checking its certificate."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.s3_url,
            region_name=REGION,
            aws_access_key_id="test-only-key",
            aws_secret_access_key="test-only-secret",
            verify=str(self.root / "s3" / "ca.crt"),
        )

    def objects(self) -> list[str]:
        listing = self.bucket().list_objects_v2(Bucket=BUCKET)
        return [str(o["Key"]) for o in listing.get("Contents", [])]

    def _wrapper(self, side: str, conf: str, env: dict[str, str]) -> Path:
        (self.root / f"pgbackrest-{side}.conf").write_text(conf)
        wrapper = self.root / f"pgbackrest-{side}"
        exports = "".join(f"export {key}='{value}'\n" for key, value in sorted(env.items()))
        wrapper.write_text(f'#!/bin/sh\n{exports}exec pgbackrest --config={self.root}/pgbackrest-{side}.conf "$@"\n')
        wrapper.chmod(0o755)
        return wrapper

    @staticmethod
    def _as_postgres_argv(*argv: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)

    def _spawn(self, argv: list[str], log: Path) -> None:
        # Its own session: the teardown ends this process group only (runuser and its child).
        proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)

    # ---------------------------------------------------------------------------------- commands

    def db(self, *args: str) -> str:
        return self._run(self.db_wrapper, args)

    def repo(self, *args: str) -> str:
        return self._run(self.repo_wrapper, args)

    def _run(self, wrapper: Path, args: tuple[str, ...]) -> str:
        try:
            return as_postgres(str(wrapper), f"--stanza={STANZA}", *args).stdout
        except subprocess.CalledProcessError as failed:
            raise AssertionError(f"pgbackrest {' '.join(args)}: exit {failed.returncode}\n{failed.stderr}") from None

    def info(self) -> dict[str, Any]:
        return dict(json.loads(self.repo("--output=json", "info"))[0])

    def sql(self, query: str, *params: object) -> Any:
        import psycopg

        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            cursor = conn.execute(query, params)  # type: ignore[arg-type]
            row = cursor.fetchone() if cursor.description else None
        return None if row is None else row[0]

    def switch_and_wait_archived(self, timeout: float = 120) -> str:
        """Close the current WAL segment and wait until PostgreSQL says it is archived (all repos)."""
        segment = str(self.sql("SELECT pg_walfile_name(pg_switch_wal())"))
        wait_until(lambda: str(self.sql("SELECT last_archived_wal FROM pg_stat_archiver") or "") >= segment, timeout)
        return segment

    def close(self) -> None:
        if self.gate is not None:
            self.gate.close()
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.pg.remove()


def pg_wal_bytes(data: Path) -> int:
    """What the WAL segments in pg_wal take (as ``du`` would count the segment files)."""
    return sum(p.stat().st_size for p in (data / "pg_wal").iterdir() if p.is_file() and len(p.name) == 24)


def elapsed(start: float) -> float:
    return round(time.monotonic() - start, 1)
