"""Throwaway PostgreSQL servers for tests that need more than the shared test server: a second
instance to fail over to (a streaming standby made with pg_basebackup), stopped and promoted at will.

Debian's server binaries (the newest under /usr/lib/postgresql), loopback only, data under
/var/tmp (the postgres user must reach it when the tests run as root).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def wait_until(condition: Callable[[], Any], seconds: float) -> Any:
    """``condition()``'s first truthy value, polled every 0.1 s; fails the test after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)
    return value


def as_postgres(*argv: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    command = ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)
    return subprocess.run(command, capture_output=True, text=True, check=True, **kwargs)  # type: ignore[call-overload,no-any-return]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pgbin() -> Path:
    return sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))[-1]


class Server:
    """One PostgreSQL instance in its own directory; ``conf`` lines go after initdb's."""

    def __init__(self, label: str) -> None:
        self.root = Path(f"/var/tmp/memoryctl-{label}-{uuid.uuid4().hex[:8]}")
        self.root.mkdir(mode=0o755)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.data = self.root / "data"
        self.port = free_port()
        self.pg_ctl = [str(pgbin() / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"), "-w"]

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres?sslmode=disable&gssencmode=disable"

    def _own_settings(self, conf: str) -> None:
        lines = f"port = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.root}'\n{conf}"
        as_postgres("sh", "-c", f"cat >> {self.data}/postgresql.conf", input=lines)

    def initdb(self, conf: str = "") -> Server:
        as_postgres(str(pgbin() / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self._own_settings(conf)
        return self

    def standby_of(self, primary: Server, conf: str = "") -> Server:
        """A copy of ``primary`` (its postgresql.conf too) that streams from it (``-R``:
        standby.signal + primary_conninfo); ``conf`` overrides what it copied."""
        as_postgres(
            str(pgbin() / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
            "-D", str(self.data), "-R", "-X", "stream",
        )  # fmt: skip
        self._own_settings(conf)
        return self

    def start(self) -> None:
        as_postgres(*self.pg_ctl, "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        as_postgres(*self.pg_ctl, "-m", mode, "stop")

    def promote(self) -> None:
        as_postgres(*self.pg_ctl, "-t", "60", "promote")

    def remove(self) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *self.pg_ctl, "-m", "immediate", "stop"]
            if os.geteuid() == 0
            else [*self.pg_ctl, "-m", "immediate", "stop"],
            capture_output=True,
        )
        shutil.rmtree(self.root, ignore_errors=True)
