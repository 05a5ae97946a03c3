"""``memoryctl backup qdrant`` with its spool on a full disk, against the real Qdrant and PostgreSQL
servers (issue 40): a 2 MiB tmpfs the test mounts (root), fills to within 64 KiB and unmounts. The
command exits 1 with "no space left on DEVICE (PATH): N MB free, needs about M MB", leaves no set
in the spool or at the target, and records the run as failed. The write sites alone, on the same
kind of disk: tests/unit/test_diskspace.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from memoryctl.cli.main import _invoke
from memoryctl.client import MemoryClient
from tests.conftest import cluster_settings, write_cluster_config

pytestmark = pytest.mark.integration

DEVICE = "memoryctl-spool"
# The graph is not part of a Qdrant backup: an address nothing answers on keeps the test off Neo4j.
NO_GRAPH = {"uri": "bolt://127.0.0.1:9", "password": ""}


@pytest.fixture
def full_spool(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs filled to within 64 KiB: less than the smallest shard snapshot (an empty
    collection's is about 140 KiB on Qdrant 1.19)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    spool = tmp_path / "spool"
    spool.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", DEVICE, str(spool)], check=True)
    try:
        (spool / "filler").write_bytes(b"f" * (2 * 1024 * 1024 - 64 * 1024))
        yield spool
    finally:
        subprocess.run(["umount", "-l", str(spool)], check=True)


def test_backup_qdrant_on_a_full_spool_says_so_and_leaves_nothing(
    pg_dsn: str, tmp_path: Path, full_spool: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backup = {"snapshot_target": str(tmp_path / "sets"), "spool_dir": str(full_spool)}
    config = write_cluster_config(tmp_path / "memoryctl.toml", pg_dsn, NO_GRAPH, tmp_path / "qdrant", backup=backup)
    client = MemoryClient(cluster_settings(pg_dsn, NO_GRAPH, tmp_path / "qdrant", backup=backup))
    client.init()  # the collection (empty: its snapshot still does not fit)
    capsys.readouterr()
    try:
        assert _invoke(["--config", str(config), "backup", "qdrant"]) == 1
        err = capsys.readouterr().err
        found = re.search(
            rf"^error: no space left on {DEVICE} \(([^)]+)\): ([\d.]+) MB free, needs about ([\d.]+) MB$", err, re.M
        )
        assert found, err
        assert found[1].startswith(f"{full_spool}/") and found[1].endswith("/shard-0.snapshot")
        assert float(found[2]) == 0.07 and float(found[3]) > 0.07  # 64 KiB free; the snapshot needs more
        assert "Traceback" not in err and "internal error" not in err
        assert sorted(p.name for p in full_spool.iterdir()) == ["filler"]  # no set, no partial shard
        assert not (tmp_path / "sets").exists() or list((tmp_path / "sets").iterdir()) == []
        (run,) = [r for r in client.stack.runs.recent(limit=5) if r["command"] == "backup-qdrant"]
        assert run["status"] == "failed"
    finally:
        client.close()
