"""Where snapshot sets are kept: the backup node's rsync daemon, or a directory.

A *set* is one directory named by its UTC creation time (``20261130T183508Z``) holding the shard
snapshots and, written last, ``manifest.json``: a set without a manifest is incomplete (a run that
died while shipping) and is neither listed nor restored; pruning removes it with the old ones.

``rsync://user@host/module`` talks to the backup node's rsync daemon over the mesh (the password
goes in ``RSYNC_PASSWORD``, never on a command line). A plain path is a directory on this host
(tests, single-host installs).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Protocol

from memoryctl.diskspace import cleaned_up, device, free_bytes, tree_bytes
from memoryctl.errors import ConfigError, DiskFullError, MemoryctlError

SET_NAME = re.compile(r"^\d{8}T\d{6}Z$")
MANIFEST = "manifest.json"


class BackupError(MemoryctlError):
    """A backup target could not be read or written."""


class SnapshotTarget(Protocol):
    def sets(self) -> list[str]:
        """Names of the complete sets, oldest first."""
        ...

    def all_sets(self) -> list[str]:
        """Every set directory, complete or not, oldest first."""
        ...

    def put(self, local: Path) -> None:
        """Ship the set directory ``local`` (its manifest last)."""
        ...

    def fetch(self, name: str, into: Path) -> Path:
        """Copy set ``name`` into ``into/name`` and return that directory."""
        ...

    def manifest(self, name: str) -> dict[str, Any]: ...

    def remove(self, names: list[str]) -> None: ...

    def describe(self) -> str: ...


class DirectoryTarget:
    def __init__(self, path: Path) -> None:
        self.path = path

    def describe(self) -> str:
        return str(self.path)

    def all_sets(self) -> list[str]:
        if not self.path.is_dir():
            return []
        return sorted(p.name for p in self.path.iterdir() if p.is_dir() and SET_NAME.match(p.name))

    def sets(self) -> list[str]:
        return [name for name in self.all_sets() if (self.path / name / MANIFEST).is_file()]

    def put(self, local: Path) -> None:
        dest = self.path / local.name
        with cleaned_up(dest, tree_bytes(local)):  # a full target: no incomplete set left there
            dest.mkdir(parents=True, exist_ok=True)
            for item in sorted(local.rglob("*")):
                if item.is_file() and item.name != MANIFEST:
                    (dest / item.relative_to(local)).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(item, dest / item.relative_to(local))
            shutil.copyfile(local / MANIFEST, dest / MANIFEST)

    def fetch(self, name: str, into: Path) -> Path:
        dest = into / name
        with cleaned_up(dest, tree_bytes(self.path / name)):
            shutil.copytree(self.path / name, dest, dirs_exist_ok=True)
        return dest

    def manifest(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.path / name / MANIFEST).read_text())
        return data

    def remove(self, names: list[str]) -> None:
        for name in names:
            shutil.rmtree(self.path / name, ignore_errors=True)


class RsyncTarget:
    def __init__(self, url: str, password: str | None) -> None:
        self.url = url.rstrip("/")
        self.env = {**os.environ, **({"RSYNC_PASSWORD": password} if password else {})}

    def describe(self) -> str:
        return self.url

    def _rsync(self, *args: str) -> str:
        if shutil.which("rsync") is None:
            raise BackupError("rsync is not installed", hint="apt-get install rsync (the deploy installs it)")
        result = subprocess.run(["rsync", "--timeout=60", *args], env=self.env, capture_output=True, text=True)
        if result.returncode != 0:
            raise BackupError(
                f"rsync to {self.url} failed (exit {result.returncode}): {result.stderr.strip()[:400]}",
                hint="is the backup node's rsync daemon up, and is [backup] snapshot_password its password?",
            )
        return result.stdout

    def _listing(self, path: str = "") -> list[tuple[str, str]]:
        """(type char, name) of the entries directly under ``path``."""
        entries = []
        for line in self._rsync("--list-only", f"{self.url}/{path}").splitlines():
            parts = line.split(None, 4)
            if len(parts) == 5 and parts[4] != ".":
                entries.append((parts[0][0], parts[4]))
        return entries

    def all_sets(self) -> list[str]:
        return sorted(name for kind, name in self._listing() if kind == "d" and SET_NAME.match(name))

    def sets(self) -> list[str]:
        found = []
        for name in self.all_sets():
            if any(entry == MANIFEST for _, entry in self._listing(f"{name}/")):
                found.append(name)
        return found

    def put(self, local: Path) -> None:
        self._rsync("-r", "--partial", f"--exclude=/{MANIFEST}", f"{local}/", f"{self.url}/{local.name}/")
        self._rsync(str(local / MANIFEST), f"{self.url}/{local.name}/{MANIFEST}")

    def fetch(self, name: str, into: Path) -> Path:
        dest = into / name
        try:
            with cleaned_up(dest):
                dest.mkdir(parents=True, exist_ok=True)
                self._rsync("-r", f"{self.url}/{name}/", f"{dest}/")
        except BackupError as exc:
            # rsync says "No space left on device" (exit 11) when *this* side filled up.
            if "No space left on device" in exc.message:
                raise DiskFullError(str(dest), device(dest), free_bytes(dest), None) from exc
            raise
        return dest

    def manifest(self, name: str) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="memoryctl-manifest-") as tmp:
            self._rsync(f"{self.url}/{name}/{MANIFEST}", f"{tmp}/{MANIFEST}")
            data: dict[str, Any] = json.loads(Path(tmp, MANIFEST).read_text())
        return data

    def remove(self, names: list[str]) -> None:
        if not names:
            return
        # rsync deletes on the receiver what the (empty) sender lacks, limited to the named sets.
        with tempfile.TemporaryDirectory(prefix="memoryctl-prune-") as empty:
            rules = [f"--include=/{name}/***" for name in names]
            self._rsync("-r", "--delete", *rules, "--exclude=*", f"{empty}/", f"{self.url}/")


def make_target(target: str | None, password: str | None) -> SnapshotTarget:
    if not target:
        raise ConfigError(
            "no snapshot target configured",
            hint="set [backup] snapshot_target (rsync://user@host/module or a directory); the deploy writes it",
        )
    if target.startswith("rsync://"):
        return RsyncTarget(target, password)
    if "://" in target:
        raise ConfigError(f"[backup] snapshot_target {target!r}: use rsync://user@host/module or a directory")
    return DirectoryTarget(Path(target))
