"""A cluster member whose machine has vanished costs new connections no ``connect_timeout``.

libpq (and psycopg 3, which runs libpq's multi-host loop itself) tries ``[postgres] hosts`` in
order and gives each member ``connect_timeout_s`` before the next: a member whose node is gone
(SIGKILLed VM, packets dropped, no RST) cost every new connection 5 s before the live primary was
tried, longer than ``memoryctl health``'s 1.8 s deadline. memoryctl's connections start the next
member after a short delay instead (``memoryctl.stores.pg_connect``) and remember the primary.

Real servers: a primary and a streaming standby (tests/pg_servers.py), and a blackhole first in
``hosts``: an address routed into a network namespace of this test's that discards it without an
answer (``ip route add blackhole`` there), as a vanished machine's address does. Needs root (the
namespace); skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from memoryctl.config import load_settings
from memoryctl.health import postgres_probe, run_probes
from memoryctl.stack import Stack
from memoryctl.stores import pg_connect
from memoryctl.stores.pg_connect import ClusterConnection
from tests.pg_servers import Server, wait_until

pytestmark = pytest.mark.integration

CONNECT_TIMEOUT_S = 5  # the default [postgres] connect_timeout_s
HEALTH_DEADLINE_S = 1.8  # memoryctl health's default deadline


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True)


@pytest.fixture(scope="module")
def blackhole() -> Iterator[str]:
    """An IPv4 address that swallows every packet sent to it: routed over a veth pair into a
    namespace whose route for it is ``blackhole`` (silently discarded; an address the namespace
    merely lacks a route for answers ICMP unreachable, which fails at once)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make a network namespace")
    tag = f"{os.getpid() % 100000}"
    ns, veth, peer = f"mctlbh{tag}", f"bh{tag}", f"bhp{tag}"
    net = f"10.203.{os.getpid() % 250 + 1}"
    address = f"{net}.128"
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", ns)
        _ip("addr", "add", f"{net}.1/30", "dev", veth)
        _ip("link", "set", veth, "up")
        _ip("-n", ns, "addr", "add", f"{net}.2/30", "dev", peer)
        _ip("-n", ns, "link", "set", peer, "up")
        _ip("-n", ns, "route", "add", "blackhole", f"{address}/32")
        _ip("route", "add", f"{address}/32", "via", f"{net}.2")
        yield address
    finally:
        subprocess.run(["ip", "route", "del", f"{address}/32"], capture_output=True)
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Server, Server]]:
    primary, standby = Server("vanished-a"), Server("vanished-b")
    try:
        primary.initdb("fsync = off\n").start()
        standby.standby_of(primary).start()

        def streaming() -> bool:
            with psycopg.connect(primary.dsn) as conn:
                return (
                    conn.execute("SELECT 1 FROM pg_stat_replication WHERE state = 'streaming'").fetchone() is not None
                )

        wait_until(streaming, 60)
        yield primary, standby
    finally:
        primary.remove()
        standby.remove()


def test_the_blackhole_takes_the_whole_timeout(blackhole: str) -> None:
    """The fixture is what the defect needs: a connect to it neither succeeds nor fails, it waits."""
    started = time.monotonic()
    with socket.socket() as sock, pytest.raises(TimeoutError):
        sock.settimeout(1.0)
        sock.connect((blackhole, 5432))
    assert time.monotonic() - started >= 0.95


def _hosts(blackhole: str, pair: tuple[Server, Server]) -> list[str]:
    primary, standby = pair
    return [f"{blackhole}:5432", f"127.0.0.1:{standby.port}", f"127.0.0.1:{primary.port}"]


def _stack(blackhole: str, pair: tuple[Server, Server]) -> Stack:
    settings: dict[str, Any] = {
        "profile": "cluster",
        "postgres": {
            "dsn": pair[0].dsn,
            "hosts": _hosts(blackhole, pair),
            "connect_timeout_s": CONNECT_TIMEOUT_S,
            "pool_min": 1,
        },
        "embedder": {"kind": "hash"},
    }
    return Stack(load_settings(Path(os.devnull), **settings))


def _connect_s(conninfo: str) -> tuple[float, str]:
    started = time.monotonic()
    with ClusterConnection.connect(conninfo, connect_timeout=CONNECT_TIMEOUT_S) as conn:
        assert conn.execute("SELECT NOT pg_is_in_recovery()").fetchone() == (True,)
        return time.monotonic() - started, f"{conn.info.host}:{conn.info.port}"


def test_a_new_connection_does_not_wait_for_the_vanished_first_member(
    blackhole: str, pair: tuple[Server, Server]
) -> None:
    primary, _ = pair
    settings = load_settings(
        Path(os.devnull),
        profile="cluster",
        postgres={"dsn": primary.dsn, "hosts": _hosts(blackhole, pair), "connect_timeout_s": CONNECT_TIMEOUT_S},
    )
    conninfo = settings.postgres.conninfo()
    pg_connect.forget_primaries()
    first, where = _connect_s(conninfo)  # nothing remembered: the members in their order, staggered
    again, where_again = _connect_s(conninfo)  # the primary remembered: it is tried first
    print(f"\nfirst connection {first:.3f} s, next {again:.3f} s (connect_timeout {CONNECT_TIMEOUT_S} s)")
    assert where == where_again == f"127.0.0.1:{primary.port}"
    assert first < 1.0
    assert again < pg_connect.CONNECT_STAGGER_S


def test_health_sees_the_primary_within_its_deadline(blackhole: str, pair: tuple[Server, Server]) -> None:
    """The whole postgres probe, in a process that has not connected yet (as `memoryctl health`)."""
    pg_connect.forget_primaries()
    stack = _stack(blackhole, pair)
    try:
        report = run_probes({"postgres": lambda: postgres_probe(stack)}, deadline_s=HEALTH_DEADLINE_S)
    finally:
        stack.close()
    component = report.components["postgres"]
    print(f"\npostgres probe: {component['status']} in {component['latency_ms']} ms")
    # answered (degraded here: no schema, no synchronous standby), not `timeout`: exit 3, not 1
    assert component["status"] in ("ok", "degraded"), component
    assert report.status != "unhealthy"
    assert component["cluster"]["leader"] == f"127.0.0.1:{pair[0].port}"


def test_a_standby_promoted_while_the_vanished_member_is_tried_is_connected_to(blackhole: str) -> None:
    """The failover drill's order of events: the lost primary's address swallows the attempt while
    the standby is promoted. The standby said "read-only" at first; it is asked again while the
    lost member's attempt lasts, so the connection lands on it once promoted, not a failure after
    ``connect_timeout`` and another attempt after that (5 s later in the CI drill)."""
    primary, standby = Server("promote-a"), Server("promote-b")
    try:
        primary.initdb("fsync = off\n").start()
        standby.standby_of(primary).start()
        conninfo = (
            f"host={blackhole},127.0.0.1 port=5432,{standby.port} dbname=postgres user=postgres"
            " sslmode=disable gssencmode=disable target_session_attrs=read-write"
        )
        pg_connect.forget_primaries()
        promote = threading.Timer(1.0, standby.promote)
        promote.start()
        try:
            with ClusterConnection.connect(conninfo, connect_timeout=CONNECT_TIMEOUT_S) as conn:
                assert conn.execute("SELECT NOT pg_is_in_recovery()").fetchone() == (True,)
                assert conn.info.port == standby.port
        finally:
            promote.join()
    finally:
        primary.remove()
        standby.remove()
