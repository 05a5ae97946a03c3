"""``[postgres] hosts`` / ``target_session_attrs``: the multi-host connection string clients use to
follow a Patroni cluster's primary (docs/ha.md), and which errors count as a failover."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import PoolTimeout

from memoryctl.config import load_settings
from memoryctl.errors import ConfigError
from memoryctl.stores.pg import is_failover
from memoryctl.stores.pg_conninfo import multi_host_conninfo, split_host

DSN = "postgresql://memoryctl@10.77.0.1:5432/memoryctl?sslmode=require"


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("10.77.0.1:5432", ("10.77.0.1", 5432)),
        ("10.77.0.2", ("10.77.0.2", 5432)),
        ("db1.mesh:6432", ("db1.mesh", 6432)),
        ("[fd00::1]:5433", ("fd00::1", 5433)),
        ("[fd00::1]", ("fd00::1", 5432)),
        (" 10.77.0.1:5432 ", ("10.77.0.1", 5432)),
    ],
)
def test_split_host(entry: str, expected: tuple[str, int]) -> None:
    assert split_host(entry) == expected


@pytest.mark.parametrize(
    "entry",
    ["", ":5432", "10.77.0.1:", "10.77.0.1:0", "10.77.0.1:70000", "10.77.0.1:x", "fd00::1", "[fd00::1",
     "[fd00::1]5432", "a,b", "host=evil", "a b:5432"],
)  # fmt: skip
def test_split_host_refuses(entry: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        split_host(entry)


def test_without_hosts_the_dsn_is_used_as_written() -> None:
    assert multi_host_conninfo(DSN, [], None) == DSN


def test_hosts_replace_the_dsns_host_and_ask_for_a_read_write_session() -> None:
    params = conninfo_to_dict(multi_host_conninfo(DSN, ["10.77.0.1:5432", "10.77.0.2:5433"], None))
    assert params == {
        "user": "memoryctl",
        "dbname": "memoryctl",
        "host": "10.77.0.1,10.77.0.2",
        "port": "5432,5433",
        "sslmode": "require",
        "target_session_attrs": "read-write",
    }


def test_one_host_adds_no_attribute_unless_asked() -> None:
    assert "target_session_attrs" not in conninfo_to_dict(multi_host_conninfo(DSN, ["10.77.0.9"], None))
    params = conninfo_to_dict(multi_host_conninfo(DSN, ["10.77.0.9"], "primary"))
    assert (params["host"], params["port"], params["target_session_attrs"]) == ("10.77.0.9", "5432", "primary")


def test_a_hostaddr_in_the_dsn_does_not_pin_the_members() -> None:
    params = conninfo_to_dict(multi_host_conninfo(DSN + "&hostaddr=10.77.0.1", ["a:1", "b:2"], None))
    assert "hostaddr" not in params and params["host"] == "a,b"


def test_an_unparsable_dsn_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"postgres\.dsn"):
        multi_host_conninfo("postgresql://x@h/db?nonsense=1", ["a:1", "b:2"], None)


def test_settings_build_the_conninfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "memoryctl.toml"
    path.write_text(f'[postgres]\ndsn = "{DSN}"\nhosts = ["10.77.0.1:5432", "10.77.0.2:5432"]\n')
    settings = load_settings(path)
    assert conninfo_to_dict(settings.postgres.conninfo())["target_session_attrs"] == "read-write"
    assert settings.postgres.failover_wait_s == 30.0
    # the environment takes a JSON list, key by key like every other setting
    monkeypatch.setenv("MEMORYCTL_POSTGRES__HOSTS", '["10.77.0.3"]')
    monkeypatch.setenv("MEMORYCTL_POSTGRES__TARGET_SESSION_ATTRS", "primary")
    params = conninfo_to_dict(load_settings(path).postgres.conninfo())
    assert (params["host"], params["target_session_attrs"]) == ("10.77.0.3", "primary")


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ('hosts = ["10.77.0.1:99999"]', "postgres.hosts: Value error, '10.77.0.1:99999'"),
        ('hosts = ["10.77.0.1", "fd00::1"]', "postgres.hosts: Value error, 'fd00::1'"),
        ('target_session_attrs = "readwrite"', "postgres.target_session_attrs"),
        ("failover_wait_s = -1", "postgres.failover_wait_s"),
    ],
)
def test_bad_cluster_settings_are_config_errors(tmp_path: Path, body: str, named: str) -> None:
    path = tmp_path / "memoryctl.toml"
    path.write_text(f"[postgres]\n{body}\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert named in err.value.message and str(path) in err.value.message


@pytest.mark.parametrize(
    ("exc", "failover"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (psycopg.errors.AdminShutdown(), True),  # 57P01: the primary is being stopped
        (psycopg.errors.CannotConnectNow(), True),  # 57P03: starting up / in recovery
        (psycopg.errors.ReadOnlySqlTransaction(), True),  # 25006: landed on a standby
        (psycopg.errors.ConnectionFailure(), True),  # class 08
        (PoolTimeout("no connection"), True),
        (psycopg.errors.QueryCanceled(), False),  # 57014: statement_timeout is a deadline
        (psycopg.errors.LockNotAvailable(), False),  # 55P03
        (psycopg.errors.UniqueViolation(), False),
        (ValueError("x"), False),
    ],
)
def test_which_errors_are_failovers(exc: BaseException, failover: bool) -> None:
    assert is_failover(exc) is failover
