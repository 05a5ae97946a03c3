from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def secrets_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Generated secrets go to a temporary directory, never the developer's."""
    path = tmp_path / "secrets"
    monkeypatch.setenv("MEMORYCTL_SECRETS_DIR", str(path))
    return path
