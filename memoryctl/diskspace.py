"""Writing files so that a full disk leaves nothing half-written and says so plainly.

Every file memoryctl writes for later use (snapshot sets, their manifests, copies into a backup
directory) goes through :func:`atomic_file` or :func:`cleaned_up`: the data lands under a temporary
name in the destination's own directory and is renamed into place only when complete (a rename
within a filesystem is atomic), and whatever was written is removed when the write fails. An
``ENOSPC``/``EDQUOT`` on the way becomes :class:`~memoryctl.errors.DiskFullError` — "no space left
on DEVICE (PATH): N MB free, needs about M MB", exit 1 — instead of an OSError traceback.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memoryctl.errors import DiskFullError

FULL = (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem (its nearest existing parent)."""
    st = os.statvfs(_existing(path))
    return st.f_bavail * st.f_frsize


def device(path: Path) -> str:
    """The device (mount source) of the filesystem holding ``path``: ``/dev/nvme0n1p2``, ``tmpfs`` …

    Read from ``/proc/self/mountinfo`` (the longest mount point containing the path); the mount
    point itself where that is unreadable (not Linux)."""
    target = os.path.realpath(_existing(path))
    best, source = "", ""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if "-" not in fields:
            continue
        mount_point = fields[4].replace("\\040", " ")
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, source = mount_point, fields[fields.index("-") + 2]
    return source or best or "/"


def disk_full(exc: OSError, path: Path | str | None = None, needs_bytes: int | None = None) -> DiskFullError | None:
    """The :class:`DiskFullError` an ``OSError`` means, or None when it is about something else."""
    if exc.errno not in FULL:
        return None
    named = path if path is not None else exc.filename
    if named is None:
        return DiskFullError(None, None, None, needs_bytes)
    where = Path(named)
    return DiskFullError(str(where), device(where), free_bytes(where), needs_bytes)


@contextmanager
def cleaned_up(path: Path, needs_bytes: int | None = None, *, named: Path | None = None) -> Iterator[Path]:
    """Write ``path`` (a file or a directory tree) inside the block; if the block fails, remove it.

    For writes that cannot go through a temporary name (a directory filled in place whose
    completeness is marked otherwise, e.g. a snapshot set's manifest written last). A full disk is
    reported as writing ``named`` (default ``path``)."""
    try:
        yield path
    except BaseException as exc:
        _remove(path)
        if isinstance(exc, OSError) and (full := disk_full(exc, named or path, needs_bytes)) is not None:
            raise full from exc
        raise


@contextmanager
def atomic_file(path: Path, needs_bytes: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` when the block succeeds,
    remove it when it fails (a full disk raised as :class:`DiskFullError` naming ``path``)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with cleaned_up(tmp, needs_bytes, named=path):
        yield tmp
        os.replace(tmp, path)


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (or of the file itself): about what copying it needs."""
    if path.is_file():
        return path.stat().st_size
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
