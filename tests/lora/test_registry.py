"""Adapter registry: versioning, atomic registration, checksum verification, active/previous/rollback.

The adapter files here are small byte blobs — the registry treats adapters as opaque files, so real
training is not needed to test it (the training tests register real adapters too).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memoryctl.errors import NotFoundError, UsageError
from memoryctl_lora.manifest import AdapterIntegrityError, read_manifest, verify_adapter, write_manifest
from memoryctl_lora.registry import AdapterRegistry


def _adapter(tmp: Path, name: str, payload: bytes, kind: str = "generation") -> Path:
    d = tmp / name
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    (d / "adapter_model.safetensors").write_bytes(payload)
    write_manifest(
        d,
        {
            "kind": kind,
            "base_model_id": "tiny/qwen2",
            "metrics": {"loss": 1.0},
            "data_window": {"since": None, "until": "2026-11-29T00:00:00+00:00"},
        },
    )
    return d


def test_register_list_latest_and_row(tmp_path: Path) -> None:
    reg = AdapterRegistry(tmp_path / "reg")
    assert reg.list("generation") == [] and reg.latest("generation") is None and reg.active("generation") is None
    v1 = reg.register("generation", _adapter(tmp_path, "a", b"one"))
    v2 = reg.register("generation", _adapter(tmp_path, "b", b"two"))
    assert (v1.version, v2.version) == ("v0001", "v0002")
    assert [v.version for v in reg.list("generation")] == ["v0001", "v0002"]
    assert reg.latest("generation") == v2
    assert reg.list("embedding") == []
    row = v2.to_row()
    assert row["kind"] == "lora-generation" and row["model_id"] == "tiny/qwen2+lora-v0002"
    assert row["checksum"] == v2.manifest["checksum"]["combined"] and row["metrics"] == {"loss": 1.0}
    assert v2.served_name == "memoryctl-generation-v0002"
    assert not any(p.name.startswith(".incoming") for p in (tmp_path / "reg" / "generation").iterdir())


def test_checksum_mismatch_is_refused(tmp_path: Path) -> None:
    reg = AdapterRegistry(tmp_path / "reg")
    v1 = reg.register("generation", _adapter(tmp_path, "a", b"weights"))
    (v1.path / "adapter_model.safetensors").write_bytes(b"tampered")
    with pytest.raises(AdapterIntegrityError, match="checksum mismatch"):
        reg.get("generation", "v0001")
    assert reg.get("generation", "v0001", verify=False).version == "v0001"
    # An adapter that is already corrupt is not registered at all.
    bad = _adapter(tmp_path, "b", b"x")
    (bad / "adapter_model.safetensors").write_bytes(b"y")
    with pytest.raises(AdapterIntegrityError):
        reg.register("generation", bad)
    missing = tmp_path / "c"
    missing.mkdir()
    with pytest.raises(AdapterIntegrityError, match="no manifest"):
        verify_adapter(missing)


def test_active_previous_and_rollback(tmp_path: Path) -> None:
    reg = AdapterRegistry(tmp_path / "reg")
    for i in range(3):
        reg.register("embedding", _adapter(tmp_path, f"a{i}", f"w{i}".encode(), kind="embedding"))
    reg.set_active("embedding", "v0001")
    reg.set_active("embedding", "v0003")  # v0002 was rejected by the gate: never active
    assert reg.active("embedding").version == "v0003"  # type: ignore[union-attr]
    assert reg.previous("embedding").version == "v0001"  # type: ignore[union-attr]
    assert reg.previous("embedding", "v0001") is None
    assert reg.previous("embedding", "v0002") is None
    back = reg.rollback("embedding")
    assert back is not None and back.version == "v0001" and reg.active("embedding") == back
    assert reg.rollback("embedding") is None and reg.active("embedding") is None  # back to the base model


def test_errors(tmp_path: Path) -> None:
    reg = AdapterRegistry(tmp_path / "reg")
    with pytest.raises(UsageError):
        reg.list("vision")  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        reg.get("embedding", "../../etc")
    with pytest.raises(NotFoundError):
        reg.get("embedding", "v0009")
    with pytest.raises(UsageError, match="not embedding"):
        reg.register("embedding", _adapter(tmp_path, "g", b"w", kind="generation"))
    assert read_manifest(_adapter(tmp_path, "h", b"w"))["format"] == 1


def test_restore_follows_what_is_served_and_remove_keeps_the_active(tmp_path: Path) -> None:
    """restore: the version the served vectors hold becomes active, recorded as a rollback (the
    history cut after it, as rollback does); remove: a superseded version's files and history go."""
    reg = AdapterRegistry(tmp_path / "reg")
    for i in range(3):
        reg.register("embedding", _adapter(tmp_path, f"a{i}", f"w{i}".encode(), kind="embedding"))
    for v in ("v0001", "v0002", "v0003"):
        reg.set_active("embedding", v)
    entry = reg.restore("embedding", "v0002", reason="migrate --rollback")
    assert entry is not None and (entry["from"], entry["to"], entry["reason"]) == (
        "v0003",
        "v0002",
        "migrate --rollback",
    )
    assert reg.active("embedding").version == "v0002"  # type: ignore[union-attr]
    assert reg.previous("embedding").version == "v0001"  # type: ignore[union-attr]
    assert reg.restore("embedding", "v0002", reason="again") is None  # already so: nothing recorded
    reg.set_active("embedding", "v0003")  # a later promotion keeps the rollbacks
    assert reg.restore("embedding", None, reason="the base model") is not None
    assert reg.active("embedding") is None
    assert [(r["from"], r["to"]) for r in reg.rollbacks("embedding")] == [("v0003", "v0002"), ("v0003", None)]
    with pytest.raises(NotFoundError):
        reg.restore("embedding", "v0009", reason="x")
    reg.set_active("embedding", "v0003")
    with pytest.raises(UsageError, match="active"):
        reg.remove("embedding", "v0003")
    reg.remove("embedding", "v0001")
    assert [v.version for v in reg.list("embedding")] == ["v0002", "v0003"]
    assert reg.previous("embedding") is None  # v0001 left the history with its files
    reg.set_active("embedding", "v0002")
    assert reg.previous("embedding").version == "v0003"  # type: ignore[union-attr]


def test_a_registered_version_is_readable_as_its_kind_directory_is(tmp_path: Path) -> None:
    """The server that loads adapters reads the registry through its group (deploy/nightly.py):
    a version must not keep ``mkdtemp``'s 0700 or the trained files' 0600."""
    src = _adapter(tmp_path, "a", b"one")
    (src / "adapter_model.safetensors").chmod(0o600)
    kind_dir = tmp_path / "reg" / "generation"
    kind_dir.mkdir(parents=True)
    kind_dir.chmod(0o2750)
    version = AdapterRegistry(tmp_path / "reg").register("generation", src)
    assert version.path.stat().st_mode & 0o7777 == 0o2750
    assert {p.stat().st_mode & 0o777 for p in version.path.iterdir()} == {0o640}
    verify_adapter(version.path)  # still exactly what was trained
