"""A running ``memoryctl serve`` (in this process) on the embedded profile, shared by a module's
tests: the HTTP side on a free loopback port, the Unix socket in the data directory."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from memoryctl.config import load_settings
from memoryctl.serve.server import Service


def embedded_config(root: Path, **serve: object) -> Path:
    """A config file for the embedded profile (hash embedder: the service is under test, not the
    model) with its data directory under ``root`` (made, world-enterable)."""
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    lines = [
        'profile = "embedded"',
        f'data_dir = "{root / "d"}"',
        'default_agent = "support"',
        "[embedder]",
        'kind = "hash"',
        "[extractor]",
        'kind = "none"',
        "[serve]",
        *(f"{k} = {v!r}" for k, v in serve.items()),
    ]
    path = root / "memoryctl.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def served_root() -> Iterator[Path]:
    """Outside pytest's 0700 tree: as root, the embedded PostgreSQL runs as its own user."""
    root = Path(tempfile.mkdtemp(prefix="memoryctl-serve-test-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def served(served_root: Path) -> Iterator[Service]:
    """The service with HTTP on loopback (its config file: ``served.settings.source_file``)."""
    config = embedded_config(served_root / "served")
    svc = Service(load_settings(config), http="127.0.0.1:0")
    svc.start()
    yield svc
    svc.shutdown(grace_s=10)
