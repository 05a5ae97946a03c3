"""The classification of a replicated PostgreSQL in ``memoryctl health`` (memoryctl/health/postgres.py),
from rows as the server returns them; the real servers are in
tests/integration/test_health_pg_cluster.py."""

from __future__ import annotations

from typing import Any

import pytest

from memoryctl.health.postgres import NO_SYNC_STANDBY, cluster_status, member_lines

MEMBERS = ["10.77.0.1:5432", "10.77.0.2:5432"]
MiB = 1024 * 1024


def _server(**over: Any) -> dict[str, Any]:
    return {
        "in_recovery": False,
        "connected_to": "10.77.0.1:5432",
        "timeline": 4,
        "synchronous_standby_names": '"pg2"',
        "synchronous_commit": "on",
        **over,
    }


def _standby(**over: Any) -> dict[str, Any]:
    return {
        "name": "pg2",
        "address": "10.77.0.2",
        "state": "streaming",
        "sync_state": "sync",
        "sync_priority": 1,
        "lag_bytes": 512,
        "replay_lag_s": 0.0012345,
        **over,
    }


def _status(server: dict[str, Any], *standbys: dict[str, Any], max_lag: int = 16 * MiB) -> dict[str, Any]:
    return cluster_status(server, list(standbys), members=MEMBERS, max_lag_bytes=max_lag)


def test_a_streaming_sync_standby_is_healthy() -> None:
    out = _status(_server(), _standby())
    assert out["problems"] == []
    assert out["leader"] == "10.77.0.1:5432" and out["timeline"] == 4
    assert out["standbys"] == [
        {
            "name": "pg2",
            "address": "10.77.0.2",
            "state": "streaming",
            "sync_state": "sync",
            "lag_bytes": 512,
            "replay_lag_s": 0.001,
        }
    ]


@pytest.mark.parametrize("sync_state", ["quorum", "sync"])
def test_quorum_counts_as_synchronous(sync_state: str) -> None:
    assert (
        _status(_server(), _standby(sync_state="async"), _standby(name="pg3", sync_state=sync_state))["problems"] == []
    )


@pytest.mark.parametrize(
    ("standby", "seen"),
    [
        ({"sync_state": "async"}, "pg2 streaming/async"),
        ({"sync_state": "potential"}, "pg2 streaming/potential"),
        # catching up after a restart: the primary does not wait for it yet
        ({"state": "catchup", "sync_state": "sync"}, "pg2 catchup/sync"),
    ],
)
def test_no_standby_in_sync_is_degraded(standby: dict[str, Any], seen: str) -> None:
    out = _status(_server(synchronous_standby_names=""), _standby(**standby))
    assert out["problems"] == [f"{NO_SYNC_STANDBY} (standbys: {seen}; synchronous_standby_names = '')"]


def test_no_standby_at_all_is_degraded() -> None:
    out = _status(_server())
    assert out["standbys"] == []
    assert out["problems"] == [f"{NO_SYNC_STANDBY} (no standby is streaming; synchronous_standby_names = '\"pg2\"')"]


def test_lag_above_the_threshold_is_degraded_with_the_figure() -> None:
    out = _status(_server(), _standby(lag_bytes=16 * MiB + 1))
    behind = 16 * MiB + 1
    assert out["problems"] == [f"standby pg2 is {behind} bytes behind in replay (max_replication_lag_bytes {16 * MiB})"]
    assert _status(_server(), _standby(lag_bytes=16 * MiB))["problems"] == []


def test_without_pg_monitor_the_columns_are_hidden_and_it_says_so() -> None:
    hidden = dict.fromkeys(("name", "address", "state", "sync_state", "sync_priority", "lag_bytes", "replay_lag_s"))
    [problem] = _status(_server(), hidden)["problems"]
    assert "grant pg_monitor" in problem


def test_a_connection_on_a_standby_has_no_leader() -> None:
    out = _status(_server(in_recovery=True, connected_to="10.77.0.2:5432", timeline=3))
    assert out["leader"] is None and out["in_recovery"] is True
    [problem] = out["problems"]
    assert problem.startswith("connected to 10.77.0.2:5432, a standby in recovery")
    assert member_lines(out) == [("connected", "10.77.0.2:5432 in recovery (not the leader)")]


def test_one_line_per_member() -> None:
    out = _status(_server(), _standby(lag_bytes=3 * MiB, replay_lag_s=None))
    assert member_lines(out) == [
        ("leader", "10.77.0.1:5432 timeline 4"),
        ("standby", "pg2 (10.77.0.2) streaming sync, replay lag 3.0 MiB / -"),
    ]
