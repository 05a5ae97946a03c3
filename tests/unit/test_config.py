"""Configuration layers: flags > environment > file > defaults, merged table by table."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest

from memoryctl.config import load_settings
from memoryctl.errors import ConfigError


@pytest.fixture
def toml(tmp_path: Path) -> Path:
    path = tmp_path / "memoryctl.toml"
    path.write_text(
        'default_agent = "from-file"\n'
        "[postgres]\n"
        'dsn = "postgresql://file@127.0.0.1/m"\n'
        'password = "file-secret"\n'
        "[query]\n"
        'half_life = "10d"\n'
    )
    return path


def test_precedence_flags_over_environment_over_file(toml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORYCTL_DEFAULT_AGENT", "from-env")
    monkeypatch.setenv("MEMORYCTL_QUERY__HALF_LIFE", "20d")
    s = load_settings(toml)
    assert s.default_agent == "from-env"  # env over file
    assert s.query.half_life == "20d"
    assert s.query.store_timeout_s == 2.0  # a default the layers did not mention
    s = load_settings(toml, default_agent="from-flag", postgres={"dsn": "postgresql://flag@127.0.0.1/m"})
    assert s.default_agent == "from-flag"  # flag over env
    assert s.postgres.dsn == "postgresql://flag@127.0.0.1/m"
    # a flag for one key of a table keeps the file's other keys
    assert s.postgres.password is not None and s.postgres.password.get_secret_value() == "file-secret"


def test_environment_nesting_case_and_json(toml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("memoryctl_neo4j__password", "env-secret")
    monkeypatch.setenv("MEMORYCTL_QDRANT__INDEXED_METADATA", '{"sentiment": "number"}')
    monkeypatch.setenv("MEMORYCTL_TEST_PG_DSN", "not a setting: ignored")
    s = load_settings(toml)
    assert s.neo4j.password is not None and s.neo4j.password.get_secret_value() == "env-secret"
    assert s.qdrant.indexed_metadata == {"sentiment": "number"}


def test_invalid_environment_value_names_the_field(toml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORYCTL_POSTGRES__POOL_MAX", "many")
    with pytest.raises(ConfigError, match=r"postgres\.pool_max"):
        load_settings(toml)


def test_recency_is_opt_in_and_checked_at_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No half-life unless one is configured: the default ranks by relevance alone, exactly as
    ``--half-life off`` (issue 12). A configured one applies per agent; a typo fails at load."""
    monkeypatch.delenv("MEMORYCTL_QUERY__HALF_LIFE", raising=False)
    monkeypatch.delenv("MEMORYCTL_QUERY__AGENT_HALF_LIFE", raising=False)
    defaults = load_settings(Path(os.devnull))
    assert defaults.query.half_life is None and defaults.query.agent_half_life == {}
    assert defaults.query.half_life_for("support") is None and defaults.query.half_life_for(None) is None
    path = tmp_path / "memoryctl.toml"
    path.write_text('[query]\nhalf_life = "30d"\nagent_half_life = { support = "7d", archive = "OFF" }\n')
    query = load_settings(path).query
    assert query.half_life_for("support") == timedelta(days=7)
    assert query.half_life_for("archive") is None  # "off" overrides the global half-life
    assert query.half_life_for("other") == timedelta(days=30)
    path.write_text('[query]\nhalf_life = "30x"\n')
    with pytest.raises(ConfigError, match=r"query\.half_life"):
        load_settings(path)


def test_nightly_pause_units_are_unit_names(tmp_path: Path) -> None:
    """They become arguments of ``[nightly] unit_command`` (sudo systemctl): names only."""
    assert load_settings(None, nightly={"pause_units": ["vllm@generate"]}).nightly.pause_units == ["vllm@generate"]
    for bad in ("vllm@generate --now", "-H host", "a;b", ""):
        with pytest.raises(ConfigError, match="not a systemd unit name"):
            load_settings(None, nightly={"pause_units": [bad]})
