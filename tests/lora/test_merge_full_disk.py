"""A merged embedding version written onto a full disk leaves nothing behind (issue 40): the
versions directory is a real 2 MiB tmpfs the test mounts (root) and the base model's 3 MB file
does not fit. The merged weights themselves need torch; a stand-in model object answers for them,
since the copy of the base is what runs out of space first."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import memoryctl_lora.train_embedding
from memoryctl_lora.merge import merge_embedding_adapter


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "versions"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "memoryctl-versions", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_merge_that_runs_out_of_space_removes_its_partial_directory(
    small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    (base / "tokenizer.json").write_bytes(b"t" * 3_000_000)

    def merged(*_: Any, **__: Any) -> Any:
        return SimpleNamespace(model=SimpleNamespace(save_pretrained=lambda *_a, **_k: None), model_id="m")

    monkeypatch.setattr(memoryctl_lora.train_embedding, "load_embedding_model", merged)
    with pytest.raises(OSError) as caught:
        merge_embedding_adapter(tmp_path / "adapter", small_disk / "m-v1", base_model_dir=base)
    assert caught.value.errno == errno.ENOSPC
    assert list(small_disk.iterdir()) == []  # neither the version nor its .partial directory
