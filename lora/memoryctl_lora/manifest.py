"""Adapter manifests and checksums (no torch needed).

An adapter directory is what vLLM and peft load: ``adapter_config.json`` +
``adapter_model.safetensors``. Beside them we write ``manifest.json``: which base model it belongs
to, which data window it learnt from, how many examples, the metrics the gate used, the exact
training config, and a sha256 of every adapter file. The checksum lets the registry refuse an
adapter that was truncated by a full disk or edited by hand before it is promoted or hot-loaded —
a corrupted adapter in vLLM fails at request time, long after the nightly run has "succeeded".
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# The files and their identity are the core's (the minilm embedder names its model after the
# same digest, without this distribution); re-exported here for the training side.
from memoryctl.adapter_files import ADAPTER_FILES, AdapterIntegrityError, adapter_checksums, sha256_file

__all__ = [
    "ADAPTER_FILES",
    "MANIFEST_NAME",
    "AdapterIntegrityError",
    "DataWindow",
    "adapter_checksums",
    "read_manifest",
    "sha256_file",
    "verify_adapter",
    "write_manifest",
]

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class DataWindow:
    """The half-open interval [since, until) of events/memories a run learnt from.

    ``since`` is None on the very first run (everything up to ``until``). The lead stores
    ``until`` of the last successful run and passes it back as the next ``since``.
    """

    since: datetime | None
    until: datetime

    def to_json(self) -> dict[str, str | None]:
        return {"since": self.since.isoformat() if self.since else None, "until": self.until.isoformat()}


def write_manifest(adapter_dir: Path, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Add checksum/created_at/format and write manifest.json atomically (tmp file + rename)."""
    full: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "created_at": datetime.now(UTC).isoformat(),
        **manifest,
        "checksum": adapter_checksums(adapter_dir),
    }
    tmp = adapter_dir / f".{MANIFEST_NAME}.tmp"
    tmp.write_text(json.dumps(full, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, adapter_dir / MANIFEST_NAME)
    return full


def read_manifest(adapter_dir: Path) -> dict[str, Any]:
    p = adapter_dir / MANIFEST_NAME
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError as exc:
        raise AdapterIntegrityError(f"{adapter_dir}: no {MANIFEST_NAME}") from exc
    except json.JSONDecodeError as exc:
        raise AdapterIntegrityError(f"{p}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise AdapterIntegrityError(f"{p}: expected a JSON object")
    return data


def verify_adapter(adapter_dir: Path) -> dict[str, Any]:
    """Recompute the checksums and compare with the manifest; return the manifest when they match."""
    manifest = read_manifest(adapter_dir)
    expected = manifest.get("checksum", {})
    actual = adapter_checksums(adapter_dir)
    if expected.get("files") != actual["files"]:
        bad = sorted(n for n in actual["files"] if expected.get("files", {}).get(n) != actual["files"][n])
        raise AdapterIntegrityError(
            f"{adapter_dir}: checksum mismatch for {', '.join(bad) or 'manifest'}",
            hint="the adapter was modified or truncated after training; retrain or restore it",
        )
    return manifest
