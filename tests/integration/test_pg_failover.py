"""Clients follow the primary, and a write interrupted by a failover is never applied twice.

Real PostgreSQL throughout: the shared test server behind a relay that loses the answer to a
COMMIT (the write landed, the client cannot know), and a pair of throwaway servers -- a primary
and a streaming standby made with pg_basebackup, synchronous like Patroni's ``synchronous_mode``
-- reached through one multi-host connection (``[postgres] hosts``, ``target_session_attrs=
read-write``): the primary is stopped hard and the standby promoted while a write waits.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from memoryctl.client import MemoryClient
from memoryctl.config import PostgresSettings
from memoryctl.model import Memory
from memoryctl.stack import postgres_pool
from memoryctl.stores.pg import WriteInDoubt
from memoryctl.stores.records import RecordStore
from memoryctl.stores.schema import apply_schema
from memoryctl.write.outbox import Deliverer
from tests.pg_servers import Server, wait_until
from tests.relay import BreakingRelay, close_both

pytestmark = pytest.mark.integration

# A simple-query COMMIT as psycopg sends it when a `conn.transaction()` block ends.
COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"


class CommitAnswerLost(BreakingRelay):
    """Relays loopback TCP to PostgreSQL. Armed, it forwards the next COMMIT to the server and
    drops the server's answer, closing the connection: the transaction is committed and the client
    sees a broken connection, as when the primary dies between its commit and its reply."""

    def __init__(self, port: int) -> None:
        self.armed = threading.Event()
        self.lost = 0
        self._swallow: set[socket.socket] = set()  # upstream sockets whose next answer is dropped
        super().__init__(("127.0.0.1", port))

    def _pipe(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        upstream = dst if requests else src
        try:
            while data := src.recv(65536):
                if requests and COMMIT in data and self.armed.is_set():
                    self.armed.clear()
                    self._swallow.add(upstream)  # before the COMMIT leaves: its answer is the next thing back
                elif not requests and upstream in self._swallow:
                    self._swallow.discard(upstream)
                    self.lost += 1
                    break
                dst.sendall(data)
        except OSError:
            pass
        close_both(src, dst)


def _stored(dsn: str, ids: list[uuid.UUID]) -> tuple[dict[uuid.UUID, int], int]:
    """How many rows each id has, and how many outbox entries they have between them."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, count(*) FROM memories WHERE id = ANY(%s) GROUP BY id", (ids,)).fetchall()
        outbox = conn.execute("SELECT count(*) FROM outbox WHERE memory_id = ANY(%s)", (ids,)).fetchone()
    assert outbox is not None
    return {r[0]: r[1] for r in rows}, outbox[0]


@pytest.fixture
def relayed(pg_dsn: str) -> Iterator[tuple[str, CommitAnswerLost]]:
    port = int(pg_dsn.rsplit(":", 1)[1].split("/")[0])
    relay = CommitAnswerLost(port)
    database = pg_dsn.rsplit("/", 1)[1]
    yield f"postgresql://postgres@127.0.0.1:{relay.port}/{database}?sslmode=disable&gssencmode=disable", relay
    relay.close()


def _store(dsn: str, hosts: list[str] | None = None, wait_s: float = 20.0) -> RecordStore:
    settings = PostgresSettings(dsn=dsn, hosts=hosts or [], connect_timeout_s=2, failover_wait_s=wait_s)
    pool = postgres_pool(settings)
    apply_schema(pool)
    return RecordStore(pool, failover_wait_s=settings.failover_wait_s)


def test_a_commit_whose_answer_was_lost_is_retried_and_not_applied_twice(
    relayed: tuple[str, CommitAnswerLost], pg_dsn: str
) -> None:
    dsn, relay = relayed
    store = _store(dsn)
    memories = [Memory(text=f"the deploy of step {i} went fine", agent_id="a1") for i in range(3)]
    relay.armed.set()
    result = store.upsert(memories)
    assert relay.lost == 1
    ids = [m.id for m in memories]
    # The first COMMIT landed; the retry found every memory as written: nothing inserted twice.
    assert (result.inserted, result.unchanged) == ([], ids)
    rows, outbox = _stored(pg_dsn, ids)
    assert rows == dict.fromkeys(ids, 1)
    assert outbox == 2 * len(ids)  # one per secondary store, from the first transaction only
    store.pool.close()


def test_without_a_retry_window_the_write_is_reported_in_doubt(
    relayed: tuple[str, CommitAnswerLost], pg_dsn: str
) -> None:
    dsn, relay = relayed
    store = _store(dsn, wait_s=0)
    memory = Memory(text="the rollback went fine", agent_id="a1")
    relay.armed.set()
    with pytest.raises(WriteInDoubt, match=f"writing memory {memory.id}.*may or may not") as err:
        store.upsert([memory])
    assert err.value.exit_code == 1 and "same id" in (err.value.hint or "")
    assert _stored(pg_dsn, [memory.id]) == ({memory.id: 1}, 2)  # it had landed
    assert store.upsert([memory]).unchanged == [memory.id]  # writing it again is safe
    assert _stored(pg_dsn, [memory.id]) == ({memory.id: 1}, 2)
    store.pool.close()


@pytest.fixture
def primary_and_standby() -> Iterator[tuple[Server, Server]]:
    primary = Server("failover-a")
    standby = Server("failover-b")
    try:
        # Every commit waits for the standby's flush (what Patroni's synchronous_mode configures).
        primary.initdb("synchronous_standby_names = '*'\nfsync = off\n").start()
        # Promoted, it has no standby of its own: it must not wait for one (Patroni's non-strict
        # synchronous_mode empties synchronous_standby_names when no standby is left, the same).
        standby.standby_of(primary, "synchronous_standby_names = ''\n").start()
        with psycopg.connect(primary.dsn) as conn:
            wait_until(
                lambda: conn.execute("SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'").fetchone(), 60
            )
        yield primary, standby
    finally:
        primary.remove()
        standby.remove()


def _server_port(store: RecordStore) -> int:
    with store.pool.connection() as conn:
        row = conn.execute("SELECT inet_server_port() AS port").fetchone()
    assert row is not None
    return int(row["port"])


@pytest.mark.slow
def test_writes_follow_the_primary_through_a_failover(
    primary_and_standby: tuple[Server, Server], caplog: pytest.LogCaptureFixture
) -> None:
    primary, standby = primary_and_standby
    caplog.set_level(logging.WARNING, logger="memoryctl.stores.pg")
    # The standby is listed first: target_session_attrs=read-write passes over it.
    hosts = [f"127.0.0.1:{standby.port}", f"127.0.0.1:{primary.port}"]
    store = _store(primary.dsn, hosts=hosts, wait_s=120)
    assert _server_port(store) == primary.port
    before = [Memory(text=f"acknowledged before the failover {i}", agent_id="a1") for i in range(20)]
    assert store.upsert(before).inserted == [m.id for m in before]

    primary.stop("immediate")  # the primary's node is lost: no shutdown, no goodbye to clients
    after = [Memory(text=f"written during the failover {i}", agent_id="a1") for i in range(5)]
    outcome: dict[str, Any] = {}
    writer = threading.Thread(target=lambda: outcome.update(result=store.upsert(after)))
    writer.start()
    wait_until(lambda: any("retrying" in r.getMessage() for r in caplog.records), 60)  # it is waiting
    standby.promote()
    writer.join(150)
    assert not writer.is_alive()
    assert outcome["result"].inserted == [m.id for m in after]
    assert _server_port(store) == standby.port  # the pool followed the new primary

    # Every acknowledged id is on the new primary, once (the standby was synchronous).
    ids = [m.id for m in before + after]
    rows, outbox = _stored(standby.dsn, ids)
    assert rows == dict.fromkeys(ids, 1)
    assert outbox == 2 * len(ids)
    store.pool.close()


def _then_sessions_terminated(call: Callable[..., Any], dsn: str) -> Callable[..., Any]:
    """``call``, after which the server terminates every other session of the database, as a
    switchover's shutdown does (57P01 on the pool's connections)."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = call(*args, **kwargs)
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        return result

    return wrapped


def test_losing_postgres_after_the_commit_does_not_fail_the_write(
    cluster: MemoryClient, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The switchover drill's one failed request (issue 26): the add committed and was delivered,
    then the old primary shut down and terminated the pool's sessions before the add had counted
    what was pending, and the caller got exit 1 for a stored, searchable memory. Here the server
    terminates the sessions at that point; then once more right after the commit, before the
    delivery."""
    monkeypatch.setattr(
        cluster.writes, "_deliver_write", _then_sessions_terminated(cluster.writes._deliver_write, pg_dsn)
    )
    first = Memory(text="the switchover happened right after this", agent_id="a1")
    outcome = cluster.add([first])
    monkeypatch.undo()
    # Both stores took it before the connection broke: stored and searchable, exit 0.
    assert (outcome.ids, outcome.inserted, outcome.degraded) == ([first.id], 1, []), outcome.as_dict()
    assert _stored(pg_dsn, [first.id]) == ({first.id: 1}, 0)  # stored once, delivered: outbox empty

    # Broken during the delivery (a session that sat idle in the pool in between is replaced
    # before it is lent: test_a_restart_between_two_calls_fails_neither): stored, delivery
    # pending (exit 3) with the reason; sync delivers.
    monkeypatch.setattr(Deliverer, "_apply", _then_sessions_terminated(Deliverer._apply, pg_dsn))
    second = Memory(text="and this one just before it", agent_id="a1")
    outcome = cluster.add([second])
    monkeypatch.undo()
    assert outcome.inserted == 1 and outcome.degraded, outcome.as_dict()
    assert any("terminating connection" in reason for reason in outcome.delivery.failed.values())
    cluster.sync()
    assert cluster.add([second]).pending == dict.fromkeys(outcome.pending, 0)


def test_a_restart_between_two_calls_fails_neither(pg_dsn: str) -> None:
    """A pooled connection the server ended while it sat idle (a restart: the deploy restarts
    PostgreSQL to turn archiving on; a switchover) is not lent out: the pool checks each
    connection before lending it. Found by the HA drill: `memoryctl init` through a service started
    before the deploy's restart failed with exit 1, "terminating connection due to administrator
    command"."""
    store = _store(pg_dsn)
    assert store.count() == 0
    with psycopg.connect(pg_dsn, autocommit=True) as admin:  # what a restart does to every session
        ended = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    assert ended is not None and ended[0] >= 1
    assert store.count() == 0  # a fresh connection, not the error
    store.pool.close()
