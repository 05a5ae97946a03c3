"""A full disk under the commands that write files (memoryctl/diskspace.py): on a real, small tmpfs
that each test mounts, fills and unmounts, the write sites of ``backup qdrant`` / ``restore qdrant``
(a shard snapshot streamed from Qdrant, a set copied into a directory target) and the CLI's
wrapper answer "no space left on DEVICE (PATH): N MB free, needs about M MB", exit 1, and leave
nothing half-written. ``backup qdrant`` run whole on a full node is the deploy test's (issue 40).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from memoryctl.backup.qdrant import QdrantSnapshots
from memoryctl.backup.target import MANIFEST, DirectoryTarget
from memoryctl.cli.main import guarded
from memoryctl.diskspace import atomic_file, device, disk_full
from memoryctl.errors import DiskFullError, ExitCode
from memoryctl.maintenance.nightly import NightlyReport, _step

DEVICE = "memoryctl-full"  # the tmpfs's mount source: what the message must name
SIZE = 2 * 1024 * 1024
THREE_MB = 3_000_000
MESSAGE = re.compile(rf"^no space left on {DEVICE} \((?P<path>[^)]+)\): (?P<free>[\d.]+) MB free(?P<needs>.*)$")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted for the test (root only), unmounted whatever happens."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", DEVICE, str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_file_that_does_not_fit_is_refused_by_name_and_removed(small_disk: Path) -> None:
    (small_disk / "keep").write_bytes(b"k" * 1000)
    dest = small_disk / "shard-0.snapshot"
    with pytest.raises(DiskFullError) as caught, atomic_file(dest, THREE_MB) as tmp, tmp.open("wb") as fh:
        for _ in range(THREE_MB // 100_000):
            fh.write(b"s" * 100_000)
    found = MESSAGE.match(caught.value.message)
    assert found, caught.value.message
    assert found["path"] == str(dest) and found["needs"] == ", needs about 3.0 MB"
    assert float(found["free"]) <= 2.1  # what is left of 2 MiB (2.1 MB) once the partial file is removed
    assert caught.value.exit_code == ExitCode.FAILURE == 1
    assert "free space on memoryctl-full" in (caught.value.hint or "")
    assert _files(small_disk) == ["keep"]  # neither the temporary file nor a partial shard


def test_a_file_that_fits_is_renamed_into_place(small_disk: Path) -> None:
    dest = small_disk / "manifest.json"
    with atomic_file(dest) as tmp:
        tmp.write_text("{}")
        assert not dest.exists()
    assert dest.read_text() == "{}" and _files(small_disk) == ["manifest.json"]


def test_a_shard_snapshot_streamed_onto_a_full_disk(small_disk: Path) -> None:
    """``backup qdrant``'s download from Qdrant (an httpx transport standing in for the server):
    the clear error with the size Qdrant announced, no partial file, the snapshot still deleted on
    the peer."""
    calls: list[str] = []

    def qdrant(request: httpx.Request) -> httpx.Response:
        calls.append(f"{request.method} {request.url.path}")
        if request.method == "POST":
            return httpx.Response(200, json={"result": {"name": "s1.snapshot", "size": THREE_MB}})
        if request.method == "GET":
            return httpx.Response(200, content=b"q" * THREE_MB)
        return httpx.Response(200, json={"result": True})

    api = QdrantSnapshots("http://qdrant:6333", None)
    api.client = httpx.Client(transport=httpx.MockTransport(qdrant))
    (small_disk / "set" / "memories").mkdir(parents=True)
    dest = small_disk / "set" / "memories" / "shard-0.snapshot"
    with pytest.raises(DiskFullError) as caught:
        api.snapshot_shard("http://qdrant:6333", "memories", 0, dest)
    found = MESSAGE.match(caught.value.message)
    assert found and found["path"] == str(dest) and found["needs"] == ", needs about 3.0 MB", caught.value.message
    assert _files(small_disk) == ["set", "set/memories"]
    assert calls[-1] == "DELETE /collections/memories/shards/0/snapshots/s1.snapshot"


def test_a_set_copied_into_a_full_directory_target_leaves_no_incomplete_set(small_disk: Path, tmp_path: Path) -> None:
    local = tmp_path / "20261204T074500Z"
    (local / "memories").mkdir(parents=True)
    (local / "memories" / "shard-0.snapshot").write_bytes(b"q" * THREE_MB)
    (local / MANIFEST).write_text(json.dumps({"set": local.name}))
    target = DirectoryTarget(small_disk / "sets")
    with pytest.raises(DiskFullError) as caught:
        target.put(local)
    found = MESSAGE.match(caught.value.message)
    assert found and found["path"] == str(small_disk / "sets" / local.name), caught.value.message
    assert found["needs"] == ", needs about 3.0 MB" and float(found["free"]) > 1.9  # the partial copy removed
    assert target.all_sets() == [] and target.sets() == []


def test_the_cli_says_it_instead_of_a_traceback(small_disk: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Any write of a command that fills the disk (adapters, a migration's files …) reaches the
    one wrapper as an OSError: exit 1 and the sentence. A failed ``write()`` names no file (Python's
    OSError has no filename then), so the sentence says only what is known; an OSError that names
    its file gets the device and what is free."""
    path = small_disk / f"{uuid.uuid4()}.bin"

    def fills_the_disk() -> int:
        path.write_bytes(b"x" * THREE_MB)
        return 0

    assert guarded(fills_the_disk) == 1
    out = capsys.readouterr()
    assert out.err.startswith("error: no space left on a device this command writes to\nhint: see `df -h`"), out
    path.unlink()

    def names_its_file() -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    assert guarded(names_its_file) == 1
    out = capsys.readouterr()
    assert re.search(rf"^error: no space left on {DEVICE} \({re.escape(str(path))}\): 2.1 MB free\n", out.err), out
    assert "Traceback" not in out.err and "hint: free space on memoryctl-full" in out.err


def test_a_nightly_step_that_fills_the_disk_fails_with_the_sentence(small_disk: Path) -> None:
    """Training, registering or merging onto a full disk: that step fails and says why (the night
    goes on to record it), instead of the whole run dying on an OSError."""
    path = small_disk / "adapter.safetensors"

    def train() -> tuple[str, dict[str, object]]:
        with path.open("wb") as fh:
            fh.write(b"w" * THREE_MB)
        return "ok", {}

    report = NightlyReport()
    outcome = _step(report, "embedding", train)
    assert outcome.status == "failed" and report.steps == [outcome]
    assert outcome.detail["error"] == "no space left on a device this command writes to"
    assert str(outcome.detail["hint"]).startswith("see `df -h`")


def test_other_os_errors_stay_errors() -> None:
    assert disk_full(OSError(errno.EACCES, "Permission denied", "/x")) is None
    with pytest.raises(PermissionError):
        guarded(lambda: (_ for _ in ()).throw(PermissionError(errno.EACCES, "Permission denied", "/x")))


def test_device_is_the_mount_source_of_the_nearest_existing_parent(small_disk: Path) -> None:
    assert device(small_disk / "not" / "yet") == DEVICE
