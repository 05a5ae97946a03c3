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

import logging
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
from memoryctl.health.probes import postgres_probe, run_probes
from memoryctl.stack import Stack
from memoryctl.stores import pg_connect
from memoryctl.stores.pg_connect import ClusterConnection
from tests.pg_servers import Server, wait_until

pytestmark = pytest.mark.integration

CONNECT_TIMEOUT_S = 5  # the default [postgres] connect_timeout_s
# Only for a probe that hangs: generous, never the measure (health's own deadline is 1.8 s; what
# keeps the probe clear of it is that the vanished member's attempt is not waited for).
HANG_GUARD_S = 60.0


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
    """The fixture is what the defect needs: a connect to it neither succeeds nor fails, it waits
    (a refusal or an unreachable route would raise another error at once)."""
    with socket.socket() as sock, pytest.raises(TimeoutError):
        sock.settimeout(1.0)
        sock.connect((blackhole, 5432))


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


def failures_of(address: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The failed attempts on ``address`` pg_connect logged (its race logs each as it learns of it):
    none while a connection was made means it was made while that attempt still waited."""
    said = [r.getMessage() for r in caplog.records if r.name == pg_connect.__name__]
    return [m for m in said if "connection failed" in m and repr(address) in m]


def _connect_s(conninfo: str) -> tuple[float, str]:
    started = time.monotonic()
    with ClusterConnection.connect(conninfo, connect_timeout=CONNECT_TIMEOUT_S) as conn:
        assert conn.execute("SELECT NOT pg_is_in_recovery()").fetchone() == (True,)
        return time.monotonic() - started, f"{conn.info.host}:{conn.info.port}"


def test_a_new_connection_does_not_wait_for_the_vanished_first_member(
    blackhole: str, pair: tuple[Server, Server], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=pg_connect.__name__)
    primary, _ = pair
    settings = load_settings(
        Path(os.devnull),
        profile="cluster",
        postgres={"dsn": primary.dsn, "hosts": _hosts(blackhole, pair), "connect_timeout_s": CONNECT_TIMEOUT_S},
    )
    conninfo = settings.postgres.conninfo()
    pg_connect.forget_primaries()
    first, where = _connect_s(conninfo)  # nothing remembered: the members in their order, staggered
    # made while the vanished member's attempt still waited (a loop that waits it out logs its timeout first)
    assert failures_of(blackhole, caplog) == []
    found = pg_connect.members(conninfo, {})
    assert found is not None
    assert pg_connect.attempt_order(found[1])[0][1] == str(primary.port)  # the primary remembered: tried first
    again, where_again = _connect_s(conninfo)
    print(f"\nfirst connection {first:.3f} s, next {again:.3f} s (connect_timeout {CONNECT_TIMEOUT_S} s)")
    assert where == where_again == f"127.0.0.1:{primary.port}"


def test_health_sees_the_primary_without_waiting_for_the_vanished_member(
    blackhole: str, pair: tuple[Server, Server], caplog: pytest.LogCaptureFixture
) -> None:
    """The whole postgres probe, in a process that has not connected yet (as `memoryctl health`):
    it answers from the primary while the vanished member's attempt still waits."""
    caplog.set_level(logging.DEBUG, logger=pg_connect.__name__)
    pg_connect.forget_primaries()
    stack = _stack(blackhole, pair)
    try:
        report = run_probes({"postgres": lambda: postgres_probe(stack)}, deadline_s=HANG_GUARD_S)
        waited_for = failures_of(blackhole, caplog)
    finally:
        stack.close()
    component = report.components["postgres"]
    print(f"\npostgres probe: {component['status']} in {component['latency_ms']} ms")
    assert waited_for == [], waited_for
    # answered (degraded here: no schema, no synchronous standby), not `timeout`: exit 3, not 1
    assert component["status"] in ("ok", "degraded"), component
    assert report.status != "unhealthy"
    assert component["cluster"]["leader"] == f"127.0.0.1:{pair[0].port}"


class _Heard(logging.Handler):
    """Sets ``event`` when a record's message contains every one of ``words``."""

    def __init__(self, event: threading.Event, *words: str) -> None:
        super().__init__(logging.DEBUG)
        self.event, self.words = event, words

    def emit(self, record: logging.LogRecord) -> None:
        if all(word in record.getMessage() for word in self.words):
            self.event.set()


def test_a_standby_promoted_while_the_vanished_member_is_tried_is_connected_to(
    blackhole: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The failover drill's order of events: the lost primary's address swallows the attempt while
    the standby is promoted. The standby said "read-only" at first; it is asked again while the
    lost member's attempt lasts, so the connection lands on it once promoted, not a failure after
    ``connect_timeout`` and another attempt after that (5 s later in the CI drill). The promotion
    starts once the standby has said no, and the lost member's attempt lasts the hang guard: the
    order holds however slowly the machine promotes."""
    caplog.set_level(logging.DEBUG, logger=pg_connect.__name__)
    primary, standby = Server("promote-a"), Server("promote-b")
    said_no = threading.Event()
    heard = _Heard(said_no, "connection failed", f"port: '{standby.port}'", "read-only")
    logging.getLogger(pg_connect.__name__).addHandler(heard)
    try:
        primary.initdb("fsync = off\n").start()
        standby.standby_of(primary).start()
        conninfo = (
            f"host={blackhole},127.0.0.1 port=5432,{standby.port} dbname=postgres user=postgres"
            " sslmode=disable gssencmode=disable target_session_attrs=read-write"
        )
        pg_connect.forget_primaries()
        promote = threading.Thread(target=lambda: said_no.wait(HANG_GUARD_S) and standby.promote())
        promote.start()
        try:
            with ClusterConnection.connect(conninfo, connect_timeout=int(HANG_GUARD_S)) as conn:
                assert conn.execute("SELECT NOT pg_is_in_recovery()").fetchone() == (True,)
                assert conn.info.port == standby.port
        finally:
            said_no.set()  # whatever happened, the promoting thread ends
            promote.join()
        assert failures_of(blackhole, caplog) == []  # connected while the lost member's attempt waited
    finally:
        logging.getLogger(pg_connect.__name__).removeHandler(heard)
        primary.remove()
        standby.remove()
