"""``memoryctl.stores.pg_connect``: which connection strings get staggered attempts, in which order,
and how the race decides (psycopg's single-member connect replaced by a scripted one here; the real
servers and a blackholed member are in tests/integration/test_pg_vanished_member.py)."""

from __future__ import annotations

import threading
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


# Only for a race that is broken and would otherwise wait for ever: generous, never a measure.
HANG_GUARD_S = 30.0


class FakeConn:
    def __init__(self, host: str, closed: threading.Event) -> None:
        self.host = host
        self.closed = closed

    def close(self) -> None:
        self.closed.set()


def _script(
    monkeypatch: pytest.MonkeyPatch, behaviour: dict[str, tuple[threading.Event | None, str]]
) -> tuple[list[str], dict[str, threading.Event]]:
    """psycopg's connect answers per host "ok", "read-only" or "refused": at once, or once the
    host's event is set (a member that does not answer until the test lets it). Returns what
    happened in order ("a tried", "a answered") and, per host, the event its connection's
    ``close()`` sets."""
    events: list[str] = []
    closed = {host: threading.Event() for host in behaviour}

    def connect(cls: Any, conninfo: str = "", **kwargs: Any) -> FakeConn:
        host = str(psycopg.conninfo.conninfo_to_dict(conninfo)["host"])
        events.append(f"{host} tried")
        gate, outcome = behaviour[host]
        if gate is not None and not gate.wait(HANG_GUARD_S):
            events.append(f"{host} hung")  # the race waited for a member the test never let answer
            raise psycopg.OperationalError(f"{host}: hung")
        events.append(f"{host} answered")
        if outcome != "ok":
            raise psycopg.OperationalError(f"{host}: {outcome}")
        return FakeConn(host, closed[host])

    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(connect))
    return events, closed


def test_a_silent_member_does_not_hold_up_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """a never answers while the race runs (a vanished machine): after the stagger b is tried,
    says no, c at once, and c wins while a's attempt still waits."""
    silent = threading.Event()
    events, _ = _script(monkeypatch, {"a": (silent, "timeout"), "b": (None, "read-only"), "c": (None, "ok")})
    try:
        conn: Any = ClusterConnection.connect(THREE)
        assert conn.host == "c"
        assert events == ["a tried", "b tried", "b answered", "c tried", "c answered"]
        # remembered: c first, and alone
        assert attempt_order(members(THREE, {})[1])[0] == ("c", "5434", "")  # type: ignore[index]
        events.clear()
        assert ClusterConnection.connect(THREE).host == "c"  # type: ignore[attr-defined]
        assert events == ["c tried", "c answered"]
    finally:
        silent.set()  # a's attempt ends now


def test_a_member_that_says_no_costs_no_stagger(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a stagger no test would wait out, a member that answers no hands over to the next at
    once: the connection is made (a race that waited for the stagger would hang here)."""
    monkeypatch.setattr(pg_connect, "CONNECT_STAGGER_S", 3600.0)
    _script(monkeypatch, {"a": (None, "read-only"), "b": (None, "refused"), "c": (None, "ok")})
    made: list[Any] = []
    racer = threading.Thread(target=lambda: made.append(ClusterConnection.connect(THREE)), daemon=True)
    racer.start()
    racer.join(HANG_GUARD_S)
    assert [conn.host for conn in made] == ["c"]


def test_a_late_success_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    late = threading.Event()
    _, closed = _script(monkeypatch, {"a": (late, "ok"), "b": (None, "ok"), "c": (None, "ok")})
    conn: Any = ClusterConnection.connect(THREE)
    assert conn.host == "b"
    late.set()  # a connects only now, after b won: its connection is closed, b's kept
    assert closed["a"].wait(HANG_GUARD_S) and not closed["b"].is_set()


def test_every_member_failing_is_one_error_naming_each(monkeypatch: pytest.MonkeyPatch) -> None:
    _script(monkeypatch, {"a": (None, "refused"), "b": (None, "read-only"), "c": (None, "refused")})
    with pytest.raises(psycopg.OperationalError) as caught:
        ClusterConnection.connect(THREE)
    text = str(caught.value)
    assert "Multiple connection attempts failed" in text
    for host, why in (("a", "refused"), ("b", "read-only"), ("c", "refused")):
        assert f"host: {host!r}" in text and f"{host}: {why}" in text
