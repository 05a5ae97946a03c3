"""The idle embedding slot and its link (memoryctl/maintenance/embedding_version.py): the new version goes
to the slot that is not serving the active model, its link moves in one rename, and the served name
is the version's directory name. The end-to-end path: tests/integration/test_nightly_embedding_version.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from memoryctl.config import EmbeddingSlot, NightlySettings
from memoryctl.errors import ConfigError
from memoryctl.maintenance.embedding_version import idle_slot, point_link, served_name

A = EmbeddingSlot(url="http://10.77.0.3:8001", link="/m/a", unit="vllm@embed-a")
B = EmbeddingSlot(url="http://10.77.0.3:8002/", link="/m/b", unit="vllm@embed-b")


def test_the_idle_slot_is_the_one_not_serving_the_active_model() -> None:
    assert idle_slot([A, B], "http://10.77.0.3:8001") is B
    assert idle_slot([A, B], "http://10.77.0.3:8002") is A  # trailing slashes do not matter
    assert idle_slot([A, B], "http://10.77.0.3:8002/") is A  # after a rollback: the other way round


def test_one_slot_or_none_idle_is_refused_with_a_hint() -> None:
    with pytest.raises(ConfigError) as one:
        idle_slot([A], "http://10.77.0.9:8001")
    assert "two slots" in (one.value.hint or "")
    with pytest.raises(ConfigError):
        idle_slot([], None)


def test_the_link_moves_to_the_version_in_one_rename(tmp_path: Path) -> None:
    old, new, link = tmp_path / "v1", tmp_path / "v2", tmp_path / "slot.model"
    old.mkdir()
    new.mkdir()
    point_link(link, old)
    point_link(link, new)
    assert link.is_symlink() and link.resolve() == new.resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slot.model", "v1", "v2"]  # no leftover


def test_the_served_name_is_a_directory_name() -> None:
    assert served_name("BAAI/bge-m3+lora-v0003") == "BAAI--bge-m3+lora-v0003"


def test_slot_units_are_unit_names() -> None:
    with pytest.raises(ValidationError):
        NightlySettings(embedding_slots=[{"url": "http://x:1", "link": "/m/a", "unit": "vllm; rm -rf /"}])
    assert NightlySettings(embedding_slots=[A, B]).embedding_slots[1].unit == "vllm@embed-b"
