"""``memoryctl health`` shows a replicated PostgreSQL: the leader, each standby with its sync state
and replay lag, the timeline; degraded (exit 3) without a synchronous standby or with a standby
too far behind.

Real servers: a primary and a streaming standby made with pg_basebackup (tests/pg_servers.py),
reached like memoryctl reaches a Patroni cluster, through ``[postgres] hosts`` (the standby listed
first: target_session_attrs=read-write passes over it). The standby's ``cluster_name`` is its
``application_name`` on the primary, as Patroni's member name is; the primary's
``synchronous_standby_names`` names it, as Patroni's ``synchronous_mode`` sets it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from memoryctl.config import load_settings
from memoryctl.health.postgres import NO_SYNC_STANDBY
from memoryctl.health.probes import postgres_probe, run_probes
from memoryctl.stack import Stack
from tests.pg_servers import Server, wait_until

pytestmark = pytest.mark.integration

STANDBY = "member_b"

CLUSTER_KEYS = {
    "members",
    "leader",
    "connected_to",
    "in_recovery",
    "timeline",
    "synchronous_standby_names",
    "synchronous_commit",
    "standbys",
    "max_replication_lag_bytes",
    "problems",
}
STANDBY_KEYS = {"name", "address", "state", "sync_state", "lag_bytes", "replay_lag_s"}


def _sync_state(primary: Server) -> str | None:
    with psycopg.connect(primary.dsn) as conn:
        row = conn.execute("SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'").fetchone()
    return None if row is None else str(row[0])


def _set_sync_names(primary: Server, names: str) -> None:
    with psycopg.connect(primary.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(sql.Literal(names)))
        conn.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Server, Server]]:
    primary = Server("health-a")
    standby = Server("health-b")
    try:
        primary.initdb(f"synchronous_standby_names = '{STANDBY}'\nfsync = off\n").start()
        standby.standby_of(primary, f"cluster_name = '{STANDBY}'\nsynchronous_standby_names = ''\n").start()
        wait_until(lambda: _sync_state(primary) == "sync", 60)
        yield primary, standby
    finally:
        primary.remove()
        standby.remove()


def _settings(primary: Server, standby: Server, **postgres: Any) -> dict[str, Any]:
    return {
        "profile": "cluster",
        "postgres": {
            "dsn": primary.dsn,
            "hosts": [f"127.0.0.1:{standby.port}", f"127.0.0.1:{primary.port}"],
            "connect_timeout_s": 3,
            **postgres,
        },
        "embedder": {"kind": "hash"},
    }


@pytest.fixture
def stack_for(pair: tuple[Server, Server]) -> Iterator[Callable[..., Stack]]:
    stacks: list[Stack] = []

    def make(**postgres: Any) -> Stack:
        stack = Stack(load_settings(Path(os.devnull), **_settings(*pair, **postgres)))
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.close()


def _postgres(stack: Stack) -> tuple[dict[str, Any], int]:
    """The postgres component and the exit code health gives for it alone."""
    report = run_probes({"postgres": lambda: postgres_probe(stack)}, deadline_s=30)
    return report.components["postgres"], report.exit_code


def test_health_shows_the_leader_and_the_synchronous_standby(
    pair: tuple[Server, Server], stack_for: Callable[..., Stack]
) -> None:
    primary, standby = pair
    component, code = _postgres(stack_for())
    assert (component["status"], code) == ("ok", 0), component
    cluster = component["cluster"]
    assert set(cluster) == CLUSTER_KEYS
    assert cluster["leader"] == cluster["connected_to"] == f"127.0.0.1:{primary.port}"
    assert cluster["in_recovery"] is False
    assert cluster["timeline"] == 1
    assert cluster["members"] == [f"127.0.0.1:{standby.port}", f"127.0.0.1:{primary.port}"]
    assert cluster["synchronous_standby_names"] == STANDBY
    assert cluster["problems"] == []
    [member] = cluster["standbys"]
    assert set(member) == STANDBY_KEYS
    assert member["name"] == STANDBY and member["address"] == "127.0.0.1"
    assert (member["state"], member["sync_state"]) == ("streaming", "sync")
    assert isinstance(member["lag_bytes"], int) and 0 <= member["lag_bytes"] <= cluster["max_replication_lag_bytes"]
    # replay_lag is NULL once an idle standby has caught up (PostgreSQL's docs): a figure or None
    assert member["replay_lag_s"] is None or member["replay_lag_s"] >= 0


def test_a_single_server_shows_nothing_new(pair: tuple[Server, Server], stack_for: Callable[..., Stack]) -> None:
    component, code = _postgres(stack_for(hosts=[]))
    assert (component["status"], code) == ("ok", 0), component
    assert "cluster" not in component


def test_without_a_synchronous_standby_health_is_degraded(
    pair: tuple[Server, Server], stack_for: Callable[..., Stack]
) -> None:
    primary, _ = pair
    _set_sync_names(primary, "")  # what Patroni's non-strict synchronous_mode does with no standby left
    try:
        wait_until(lambda: _sync_state(primary) == "async", 30)
        component, code = _postgres(stack_for())
    finally:
        _set_sync_names(primary, STANDBY)
        wait_until(lambda: _sync_state(primary) == "sync", 30)
    assert (component["status"], code) == ("degraded", 3), component
    [problem] = component["cluster"]["problems"]
    assert problem.startswith(NO_SYNC_STANDBY) and f"{STANDBY} streaming/async" in problem
    assert component["error"] == f"PostgreSQL cluster: {problem}"
    assert component["cluster"]["standbys"][0]["sync_state"] == "async"


def test_a_standby_behind_in_replay_is_reported_with_its_lag(
    pair: tuple[Server, Server], stack_for: Callable[..., Stack]
) -> None:
    """Replay paused on the standby while the primary writes: commits still wait only for its flush
    (synchronous_commit = on), so it stays sync, and falls behind in replay by what was written."""
    primary, standby = pair
    with psycopg.connect(standby.dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")
    try:
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS filler (n int, pad text)")
            conn.execute("INSERT INTO filler SELECT n, repeat('x', 200) FROM generate_series(1, 5000) n")
        component, code = _postgres(stack_for(max_replication_lag_bytes=100_000))
    finally:
        with psycopg.connect(standby.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_wal_replay_resume()")
    [member] = component["cluster"]["standbys"]
    assert member["sync_state"] == "sync" and member["lag_bytes"] > 100_000, member
    assert (component["status"], code) == ("degraded", 3), component
    [problem] = component["cluster"]["problems"]
    assert problem == (
        f"standby {STANDBY} is {member['lag_bytes']} bytes behind in replay (max_replication_lag_bytes 100000)"
    )


def test_a_setting_pending_a_restart_is_a_note_not_a_problem(
    pair: tuple[Server, Server], stack_for: Callable[..., Stack]
) -> None:
    """What Patroni's edit-config (or a changed conf.d file) leaves until the restart: the server
    runs on with the old value, so health says so and stays ok."""
    primary, _ = pair
    with psycopg.connect(primary.dsn, autocommit=True) as conn:
        raised = int(conn.execute("SHOW max_connections").fetchone()[0]) + 10  # type: ignore[index]
        conn.execute(sql.SQL("ALTER SYSTEM SET max_connections = {}").format(sql.Literal(raised)))
        conn.execute("SELECT pg_reload_conf()")
    try:
        wait_until(lambda: _pending(primary) == ["max_connections"], 30)
        component, code = _postgres(stack_for())
    finally:
        with psycopg.connect(primary.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET max_connections")
            conn.execute("SELECT pg_reload_conf()")
        wait_until(lambda: _pending(primary) == [], 30)
    assert (component["status"], code) == ("ok", 0), component
    assert component["pending_restart"] == ["max_connections"]
    assert component["note"].startswith(f"restart pending on 127.0.0.1:{primary.port} for max_connections: ")
    assert _postgres(stack_for())[0]["pending_restart"] == []


def _pending(server: Server) -> list[str]:
    with psycopg.connect(server.dsn) as conn:
        return [str(row[0]) for row in conn.execute("SELECT name FROM pg_settings WHERE pending_restart")]


def test_the_command_shows_one_line_per_member_and_the_json(pair: tuple[Server, Server], tmp_path: Path) -> None:
    primary, standby = pair
    cfg = tmp_path / "memoryctl.toml"
    hosts = ", ".join(f'"127.0.0.1:{s.port}"' for s in (standby, primary))
    cfg.write_text(
        f'profile = "cluster"\ndata_dir = "{tmp_path}"\n[postgres]\ndsn = "{primary.dsn}"\nhosts = [{hosts}]\n'
        '[embedder]\nkind = "hash"\n[neo4j]\nuri = "bolt://127.0.0.1:9"\n'
    )
    env = {**os.environ, "MEMORYCTL_CONFIG": str(cfg), "COLUMNS": "220"}  # rich wraps at 80 otherwise
    run = subprocess.run(
        ["memoryctl", "health", "--json", "--deadline", "20"], env=env, capture_output=True, text=True, timeout=120
    )
    report = json.loads(run.stdout)
    cluster = report["components"]["postgres"]["cluster"]
    assert set(cluster) == CLUSTER_KEYS and set(cluster["standbys"][0]) == STANDBY_KEYS
    assert cluster["leader"] == f"127.0.0.1:{primary.port}"
    human = subprocess.run(
        ["memoryctl", "health", "--deadline", "20"], env=env, capture_output=True, text=True, timeout=120
    )
    lines = human.stdout.splitlines()
    leader = [line for line in lines if "leader" in line and f"127.0.0.1:{primary.port} timeline 1" in line]
    member = [line for line in lines if "standby" in line and f"{STANDBY} (127.0.0.1) streaming sync" in line]
    assert len(leader) == 1 and len(member) == 1, human.stdout
    assert "replay lag" in member[0]
    prom = subprocess.run(
        ["memoryctl", "health", "--prometheus", "--deadline", "20"], env=env, capture_output=True, text=True, timeout=99
    )
    assert "memoryctl_postgres_sync_standbys 1\n" in prom.stdout and "memoryctl_postgres_timeline 1\n" in prom.stdout
    assert f'memoryctl_postgres_replication_lag_bytes{{standby="{STANDBY}"}} ' in prom.stdout


def test_a_stopped_standby_leaves_no_synchronous_standby(
    pair: tuple[Server, Server], stack_for: Callable[..., Stack]
) -> None:
    primary, standby = pair
    standby.stop()
    try:
        wait_until(lambda: _sync_state(primary) is None, 30)
        component, code = _postgres(stack_for())
    finally:
        standby.start()
        wait_until(lambda: _sync_state(primary) == "sync", 60)
    assert (component["status"], code) == ("degraded", 3), component
    assert component["cluster"]["standbys"] == []
    assert component["cluster"]["problems"] == [
        f"{NO_SYNC_STANDBY} (no standby is streaming; synchronous_standby_names = '{STANDBY}')"
    ]
