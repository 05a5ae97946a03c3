"""A ``memoryctl serve`` process for tests that talk to the service as its clients do: over HTTP
with the bearer token, and through the Unix socket the CLI finds on its own.

Started as a command (``python -m memoryctl serve --http 127.0.0.1:PORT``), not as an object in
the test's process: the tests that use it hold the CLI contract and the HTTP API, whatever server
answers behind them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

START_DEADLINE_S = 180.0  # warm-up loads the embedder and starts PostgreSQL on a busy machine


@dataclass(frozen=True, slots=True)
class Served:
    url: str
    token: str
    process: subprocess.Popen[bytes]

    def request(
        self,
        path: str,
        body: bytes | dict[str, Any] | None = None,
        *,
        method: str = "POST",
        token: str | None = "",
        headers: dict[str, str] | None = None,
        timeout: float = 120.0,
    ) -> tuple[int, dict[str, str], Any]:
        """One request: status, headers, the JSON body (or the raw bytes if it is not JSON)."""
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        req = urllib.request.Request(self.url + path, data=data, method=method)
        given = self.token if token == "" else token
        if given:
            req.add_header("Authorization", f"Bearer {given}")
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, head, raw = resp.status, _names(resp.getheaders()), resp.read()
        except urllib.error.HTTPError as exc:
            status, head, raw = exc.code, _names(exc.headers.items()), exc.read()
        try:
            return status, head, json.loads(raw)
        except ValueError:
            return status, head, raw


@contextlib.contextmanager
def embedded_home(prefix: str) -> Iterator[Path]:
    """A configuration file for the embedded profile (``hash`` embedder, no extractor) in a fresh
    directory outside pytest's 0700 tree (as root, the embedded PostgreSQL runs as its own user);
    yields the file, its data directory beside it, removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    config = root / "memoryctl.toml"
    config.write_text(
        f'profile = "embedded"\ndata_dir = "{root / "d"}"\ndefault_agent = "support"\n'
        '[embedder]\nkind = "hash"\n[extractor]\nkind = "none"\n'
    )
    try:
        yield config
    finally:
        shutil.rmtree(root, ignore_errors=True)


def poison(client: Any) -> uuid.UUID:
    """A memory PostgreSQL stored and psycopg cannot read back (0001 BC, as an older memoryctl
    stored `--at 0001-01-01T00:00:00+14:00`), queued for both derived stores: the next delivery
    sets it aside (issue 22, item 1). Written by SQL: the door refuses such timestamps now."""
    bad = uuid.uuid4()
    with client.stack.pool.connection() as conn:
        conn.execute(
            "INSERT INTO memories (id, agent_id, text, kind, created_at, updated_at, content_hash)"
            " VALUES (%s, 'dates', 'x', 'note', '0001-12-31 10:00:00+00 BC', now(), 'h')",
            (bad,),
        )
        conn.execute(
            "INSERT INTO outbox (memory_id, target, op) VALUES (%s, 'vector', 'upsert'), (%s, 'graph', 'upsert')",
            (bad, bad),
        )
    return bad


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def running_service(config: Path, data_dir: Path, *, log: Path | None = None) -> Iterator[Served]:
    """``memoryctl serve`` on ``config`` until the block ends (SIGTERM, then waited for)."""
    port = free_port()
    env = {**os.environ, "MEMORYCTL_CONFIG": str(config)}
    sink = open(log, "wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "memoryctl", "serve", "--http", f"127.0.0.1:{port}"],
        env=env,
        stdout=sink,
        stderr=sink,
    )
    try:
        served = _wait_until_answering(proc, f"http://127.0.0.1:{port}", data_dir / "serve.token")
        yield served
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            sink.close()  # type: ignore[union-attr]


def _wait_until_answering(proc: subprocess.Popen[bytes], url: str, token_file: Path) -> Served:
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"memoryctl serve exited with {proc.returncode} while starting")
        if token_file.exists() and (token := token_file.read_text().strip()):
            served = Served(url, token, proc)
            with contextlib.suppress(OSError):
                status, _, _ = served.request("/v1/status", method="GET", timeout=5)
                if status == 200:
                    return served
        time.sleep(0.2)  # polling for a condition, with a deadline
    raise AssertionError(f"memoryctl serve did not answer on {url} within {START_DEADLINE_S:.0f} s")


def _names(headers: Any) -> dict[str, str]:
    """Header names in one spelling (``Memoryctl-Exit-Code``): HTTP ignores their case, servers differ."""
    return {name.title(): value for name, value in headers}
