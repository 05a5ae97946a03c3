"""A file-level registry of trained adapters: ``<root>/<kind>/<version>/``.

Why on disk and not only in PostgreSQL: vLLM and peft load adapters from a directory path, so the
bytes must live somewhere stable anyway; the registry makes that place versioned, immutable and
checksummed. The lead mirrors each :class:`AdapterVersion` into the ``model_versions`` table
(:meth:`AdapterVersion.to_row` gives the columns) — the database is the system of record for what
is *active*, this directory for what *exists*. A small ``state.json`` per kind keeps the promotion
history too, so the file registry alone can answer "active" and "previous" (the embedded profile,
tests, and recovery when the database is unreachable).

Layout::

    <root>/embedding/v0001/{adapter_config.json, adapter_model.safetensors, manifest.json}
    <root>/embedding/state.json       {"active": "v0002", "history": ["v0001", "v0002"], "rollbacks": [...]}
    <root>/generation/v0001/...

Versions are ``v`` + a zero-padded counter: sortable, short, safe as vLLM adapter names.
Registration copies into a hidden temporary directory and renames it into place, so a crash never
leaves a half-written version that ``list`` would return.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memoryctl.errors import NotFoundError, UsageError

from .config import AdapterKind
from .manifest import MANIFEST_NAME, AdapterIntegrityError, verify_adapter

_VERSION_RE = re.compile(r"^v(\d{4,})$")
_KINDS: tuple[AdapterKind, ...] = ("embedding", "generation")
STATE_NAME = "state.json"


@dataclass(frozen=True)
class AdapterVersion:
    """One registered adapter. ``path`` is what vLLM's ``lora_path`` / peft's loader take."""

    kind: AdapterKind
    version: str
    path: Path
    manifest: dict[str, Any]

    @property
    def checksum(self) -> str:
        return str(self.manifest["checksum"]["combined"])

    @property
    def base_model_id(self) -> str:
        return str(self.manifest.get("base_model_id", ""))

    @property
    def model_id(self) -> str:
        """Identity of base + adapter, e.g. ``sentence-transformers/all-MiniLM-L6-v2+lora-v0003``.

        For embeddings this is the new embedding model id that ``migrate`` re-embeds into (its own
        Qdrant collection); for generation it is the adapter name to load into vLLM.
        """
        return f"{self.base_model_id}+lora-{self.version}"

    @property
    def served_name(self) -> str:
        """Name under which vLLM serves a generation adapter (the ``model`` field of requests)."""
        return f"memoryctl-{self.kind}-{self.version}"

    def to_row(self) -> dict[str, Any]:
        """Columns for the lead's ``model_versions`` table."""
        return {
            "kind": f"lora-{self.kind}",
            "version": self.version,
            "model_id": self.model_id,
            "base_model_id": self.base_model_id,
            "path": str(self.path),
            "checksum": self.checksum,
            "created_at": self.manifest.get("created_at"),
            "data_window": self.manifest.get("data_window"),
            "metrics": self.manifest.get("metrics", {}),
            "manifest": self.manifest,
        }


class AdapterRegistry:
    """Versioned adapter store under ``root``. Safe for one writer (the nightly lock) and many readers."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    # -- writing -----------------------------------------------------------------------------
    def register(self, kind: AdapterKind, adapter_dir: Path | str) -> AdapterVersion:
        """Copy a freshly trained adapter (with manifest) in as the next version.

        The checksum is verified before and after the copy: what is registered is exactly what
        was trained and evaluated.
        """
        _check_kind(kind)
        src = Path(adapter_dir)
        manifest = verify_adapter(src)
        if manifest.get("kind") not in (None, kind):
            raise UsageError(f"{src} holds a {manifest.get('kind')} adapter, not {kind}")
        kind_dir = self.root / kind
        kind_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".incoming-", dir=kind_dir))
        try:
            for item in src.iterdir():
                if item.is_file() and not item.name.startswith("."):
                    shutil.copy2(item, tmp / item.name)
            verify_adapter(tmp)
            _readable_like(tmp, kind_dir)
            while True:  # claim the next number; rename fails if another writer took it
                version = _format_version(self._max_number(kind) + 1)
                try:
                    os.rename(tmp, kind_dir / version)
                    break
                except OSError:
                    if not (kind_dir / version).exists():
                        raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self.get(kind, version)

    def set_active(self, kind: AdapterKind, version: str) -> AdapterVersion:
        """Record ``version`` as the serving adapter (after the gate passed and promotion worked)."""
        av = self.get(kind, version)
        state = self._state(kind)
        history = [v for v in state["history"] if v != version] + [version]
        self._write_state(kind, {**state, "active": version, "history": history})
        return av

    def rollback(self, kind: AdapterKind) -> AdapterVersion | None:
        """Make the previously active version active again; returns it (None: no previous → base)."""
        state = self._state(kind)
        history = list(state["history"])
        if history:
            history.pop()
        active = history[-1] if history else None
        self._write_state(kind, {**state, "active": active, "history": history})
        return self.get(kind, active) if active else None

    def restore(self, kind: AdapterKind, version: str | None, *, reason: str) -> dict[str, Any] | None:
        """Record ``version`` (None: the base model) as active because what is served went back to it
        (``migrate --rollback``): the history is cut after it, as :meth:`rollback` does, and the change
        is appended to the kind's ``rollbacks`` with ``reason``. Returns that entry, or None when
        ``version`` was already the active one (nothing recorded)."""
        if version is not None:
            self.get(kind, version, verify=False)
        state = self._state(kind)
        if state["active"] == version:
            return None
        history: list[str] = list(state["history"])
        if version is None:
            history = []
        elif version in history:
            history = history[: history.index(version) + 1]
        else:
            history = [*history, version]
        entry = {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "from": state["active"],
            "to": version,
            "reason": reason,
        }
        self._write_state(
            kind, {**state, "active": version, "history": history, "rollbacks": [*state["rollbacks"], entry]}
        )
        return entry

    def remove(self, kind: AdapterKind, version: str) -> None:
        """Delete a version that is not the active one (the nightly's clean-up of superseded merged
        embedding versions; the caller keeps the rollback target); it leaves the history too."""
        state = self._state(kind)
        if version == state["active"]:
            raise UsageError(f"{kind} adapter {version} is the active one: it is kept")
        path = self.root / kind / version
        if _number(version) is None or not path.is_dir():
            raise NotFoundError(f"no {kind} adapter {version} in {self.root}")
        self._write_state(kind, {**state, "history": [v for v in state["history"] if v != version]})
        shutil.rmtree(path)

    def rollbacks(self, kind: AdapterKind) -> list[dict[str, Any]]:
        """Every :meth:`restore` of ``kind``, oldest first."""
        return list(self._state(kind)["rollbacks"])

    # -- reading -----------------------------------------------------------------------------
    def list(self, kind: AdapterKind) -> list[AdapterVersion]:
        """All registered versions, oldest first. Unverified (cheap); use get() before serving."""
        _check_kind(kind)
        kind_dir = self.root / kind
        if not kind_dir.is_dir():
            return []
        out = []
        for d in sorted(kind_dir.iterdir(), key=lambda p: _number(p.name) or -1):
            if _number(d.name) is not None and (d / MANIFEST_NAME).is_file():
                out.append(AdapterVersion(kind, d.name, d, json.loads((d / MANIFEST_NAME).read_text())))
        return out

    def get(self, kind: AdapterKind, version: str, *, verify: bool = True) -> AdapterVersion:
        """One version; with ``verify`` (default) its files are checked against the manifest."""
        _check_kind(kind)
        if _number(version) is None:
            raise UsageError(f"invalid adapter version {version!r} (expected like v0001)")
        path = self.root / kind / version
        if not path.is_dir():
            raise NotFoundError(f"no {kind} adapter {version} in {self.root}")
        manifest = verify_adapter(path) if verify else json.loads((path / MANIFEST_NAME).read_text())
        return AdapterVersion(kind, version, path, manifest)

    def latest(self, kind: AdapterKind) -> AdapterVersion | None:
        """The newest registered version (not necessarily promoted)."""
        versions = self.list(kind)
        return self.get(kind, versions[-1].version) if versions else None

    def active(self, kind: AdapterKind) -> AdapterVersion | None:
        """The promoted version, or None when the base model serves alone."""
        v = self._state(kind)["active"]
        return self.get(kind, v) if v else None

    def previous(self, kind: AdapterKind, version: str | None = None) -> AdapterVersion | None:
        """The version promoted before ``version`` (default: before the active one) — the rollback
        target. Rejected (never promoted) versions are skipped on purpose."""
        history: list[str] = self._state(kind)["history"]
        ref = version or self._state(kind)["active"]
        if ref not in history:
            return None
        i = history.index(ref)
        return self.get(kind, history[i - 1]) if i > 0 else None

    # -- internals ---------------------------------------------------------------------------
    def _max_number(self, kind: AdapterKind) -> int:
        nums = [n for d in (self.root / kind).iterdir() if (n := _number(d.name)) is not None]
        return max(nums, default=0)

    def _state(self, kind: AdapterKind) -> dict[str, Any]:
        p = self.root / kind / STATE_NAME
        if not p.is_file():
            return {"active": None, "history": [], "rollbacks": []}
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise AdapterIntegrityError(f"{p}: not valid JSON ({exc})") from exc
        return {
            "active": data.get("active"),
            "history": list(data.get("history", [])),
            "rollbacks": list(data.get("rollbacks", [])),
        }

    def _write_state(self, kind: AdapterKind, state: dict[str, Any]) -> None:
        d = self.root / kind
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{STATE_NAME}.tmp"
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, d / STATE_NAME)


def _check_kind(kind: str) -> None:
    if kind not in _KINDS:
        raise UsageError(f"unknown adapter kind {kind!r} (expected one of {', '.join(_KINDS)})")


def _number(name: str) -> int | None:
    m = _VERSION_RE.match(name)
    return int(m.group(1)) if m else None


def _format_version(n: int) -> str:
    return f"v{n:04d}"


def _readable_like(version_dir: Path, kind_dir: Path) -> None:
    """Give a version the access its kind's directory gives, not ``mkdtemp``'s 0700 (and the
    trained files' own modes): the server that loads adapters reads the registry through its group
    (deploy/nightly.py: ``/var/lib/memoryctl-adapters`` is memoryctl:vllm, setgid), and vLLM was
    refused the first adapter a night registered on the local nodes."""
    mode = kind_dir.stat().st_mode & 0o2775
    version_dir.chmod(mode)
    for item in version_dir.iterdir():
        if item.is_file():
            item.chmod(0o644 & (mode | 0o600))
