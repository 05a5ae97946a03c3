"""The stamp both wheelhouses (deploy/wheelhouse.py, deploy/lora_wheelhouse.py) rebuild by: built again
only when the sources changed, and a build that fails part-way is not recorded as done."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.wheelhouse import STAMP, stale_build


def test_built_once_per_sources_and_again_when_they_change(tmp_path: Path) -> None:
    house = tmp_path / "house"
    with stale_build(house, {"source": "a"}) as built:
        assert built == {}  # nothing built yet: the directory is created, the block builds
    with stale_build(house, {"source": "a"}) as built:
        assert built is None  # the same sources: nothing to do
    with stale_build(house, {"source": "b"}) as built:
        assert built == {"source": "a"}  # what was built, for a build that reuses part of it
    assert (house / STAMP).read_text() == '{"source": "b"}'


def test_a_failed_build_is_built_again(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), stale_build(tmp_path, {"source": "a"}):
        raise RuntimeError("pip failed")
    assert not (tmp_path / STAMP).exists()
    with stale_build(tmp_path, {"source": "a"}) as built:
        assert built == {}
