"""``memoryctl.stores.pg_connect``: which connection strings get staggered attempts, in which order,
and how the race decides (psycopg's single-member connect replaced by a scripted one here; the real
servers and a blackholed member are in tests/integration/test_pg_vanished_member.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from memoryctl.stores import pg_connect
from memoryctl.stores.pg_connect import ClusterConnection, attempt_order, members

THREE = "host=a,b,c port=5432,5433,5434 dbname=m target_session_attrs=read-write"


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    pg_connect.forget_primaries()
    yield
    pg_connect.forget_primaries()


@pytest.mark.parametrize(
    "conninfo",
    [
        "host=a port=5432 target_session_attrs=read-write",  # one member
        "host=a,b port=5432 target_session_attrs=prefer-standby",  # an order that means something
        "host=a,b port=5432",  # libpq's default (any): the first that answers is right
        "host=a,b,c port=1,2 target_session_attrs=read-write",  # mismatched lists: libpq says so
    ],
)
def test_psycopg_keeps_what_is_not_a_primary_race(conninfo: str) -> None:
    assert members(conninfo, {}) is None


def test_members_carry_their_own_port_and_hostaddr() -> None:
    found = members("host=a,b hostaddr=10.0.0.1,10.0.0.2 port=6432 target_session_attrs=primary", {})
    assert found is not None
    assert found[1] == [("a", "6432", "10.0.0.1"), ("b", "6432", "10.0.0.2")]
    assert members(THREE, {"host": "x"}) is None


class FakeConn:
    def __init__(self, host: str) -> None:
        self.host = host
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _script(
    monkeypatch: pytest.MonkeyPatch, behaviour: dict[str, tuple[float, str]]
) -> tuple[list[tuple[str, float]], list[FakeConn]]:
    """psycopg's connect answers per host after a delay: "ok", "read-only" or "refused"."""
    started: list[tuple[str, float]] = []
    t0 = time.monotonic()
    made: list[FakeConn] = []

    def connect(cls: Any, conninfo: str = "", **kwargs: Any) -> FakeConn:
        host = str(psycopg.conninfo.conninfo_to_dict(conninfo)["host"])
        started.append((host, time.monotonic() - t0))
        delay, outcome = behaviour[host]
        time.sleep(delay)
        if outcome != "ok":
            raise psycopg.OperationalError(f"{host}: {outcome}")
        made.append(FakeConn(host))
        return made[-1]

    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(connect))
    return started, made


def test_a_silent_member_costs_the_stagger_and_a_refusing_one_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    started, _ = _script(monkeypatch, {"a": (3.0, "timeout"), "b": (0.0, "read-only"), "c": (0.0, "ok")})
    t0 = time.monotonic()
    conn: Any = ClusterConnection.connect(THREE)
    took = time.monotonic() - t0
    assert conn.host == "c"
    assert [h for h, _ in started] == ["a", "b", "c"]
    assert pg_connect.CONNECT_STAGGER_S <= took < pg_connect.CONNECT_STAGGER_S + 0.2
    assert started[2][1] - started[1][1] < 0.1  # b said no: c at once
    # remembered: c first, and alone
    assert attempt_order(members(THREE, {})[1])[0] == ("c", "5434", "")  # type: ignore[index]
    started.clear()
    assert ClusterConnection.connect(THREE).host == "c"  # type: ignore[attr-defined]
    assert [h for h, _ in started] == ["c"]


def test_a_late_success_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    _, made = _script(monkeypatch, {"a": (0.5, "ok"), "b": (0.0, "ok"), "c": (0.0, "ok")})
    conn: Any = ClusterConnection.connect(THREE)
    assert conn.host == "b"
    deadline = time.monotonic() + 2
    while len(made) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    late = [c for c in made if c.host == "a"]
    assert late and late[0].closed and not conn.closed


def test_every_member_failing_is_one_error_naming_each(monkeypatch: pytest.MonkeyPatch) -> None:
    _script(monkeypatch, {"a": (0.0, "refused"), "b": (0.0, "read-only"), "c": (0.1, "refused")})
    with pytest.raises(psycopg.OperationalError) as caught:
        ClusterConnection.connect(THREE)
    text = str(caught.value)
    assert "Multiple connection attempts failed" in text
    for host, why in (("a", "refused"), ("b", "read-only"), ("c", "refused")):
        assert f"host: {host!r}" in text and f"{host}: {why}" in text
