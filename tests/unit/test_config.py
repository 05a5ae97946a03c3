"""Configuration precedence as documented: flags > environment > file > defaults, key by key."""

from __future__ import annotations

from pathlib import Path

import pytest

from memoryctl.config import load_settings
from memoryctl.errors import ConfigError

FILE = """
profile = "cluster"
default_agent = "from-file"
[neo4j]
uri = "bolt://file:7687"
password = "file-secret"
[embedder]
kind = "http"
url = "http://file:8000"
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("MEMORYCTL_PROFILE", "MEMORYCTL_DEFAULT_AGENT", "MEMORYCTL_NEO4J__URI", "MEMORYCTL_EMBEDDER__KIND"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "memoryctl.toml"
    path.write_text(FILE)
    return path


def test_file_over_defaults(config: Path) -> None:
    s = load_settings(config)
    assert (s.profile, s.default_agent, s.neo4j.uri, s.embedder.kind) == (
        "cluster",
        "from-file",
        "bolt://file:7687",
        "http",
    )
    assert s.source_file == config


def test_environment_over_file_key_by_key(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORYCTL_PROFILE", "embedded")
    monkeypatch.setenv("MEMORYCTL_NEO4J__URI", "bolt://env:7687")
    s = load_settings(config)
    assert s.profile == "embedded" and s.neo4j.uri == "bolt://env:7687"
    assert s.neo4j.password is not None and s.neo4j.password.get_secret_value() == "file-secret"  # merged, not replaced
    assert s.default_agent == "from-file"


def test_flags_over_environment_and_file(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORYCTL_PROFILE", "embedded")
    monkeypatch.setenv("MEMORYCTL_EMBEDDER__KIND", "local")
    s = load_settings(config, profile="cluster", embedder={"kind": "hash"})
    assert s.profile == "cluster" and s.embedder.kind == "hash"
    assert s.embedder.url == "http://file:8000"  # the flag replaced one key of the table
    unset = load_settings(config, profile=None)  # a flag not given does not count
    assert unset.profile == "embedded"


def test_bad_values_name_their_source(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORYCTL_PROFILE", "cloud")
    with pytest.raises(ConfigError, match="profile"):
        load_settings(config)
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(config.parent / "missing.toml")
