"""Versioned schema migrations, applied by ``memoryctl init`` (and on first use).

Migrations are the numbered ``sql/NNNN_*.sql`` files, applied in order under an advisory lock so
two processes never race. A version may have variants: ``timescale`` when TimescaleDB can be used
and ``plain`` otherwise; the variant applied is recorded in ``schema_migrations`` so ``health`` and
the README can say which path ran, instead of silently skipping one. Once a database has taken one
path, later versions follow it (a ``timescale`` aggregate needs the ``timescale`` hypertable).

"Can be used" is two facts, both checked: the extension is *available* (its files are installed:
``pg_available_extensions``) and *loaded* (``shared_preload_libraries`` names it; without that
``CREATE EXTENSION`` fails). Installing the package without the preload setting is a common
half-done deploy: the database then takes the plain path and ``health`` says why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from memoryctl.stores.pg import Pool, pg_errors

_ADVISORY_KEY = 0x6D656D6F  # "memo"
_FILE = re.compile(r"^(?P<version>\d{4})_(?P<variant>[a-z_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    variant: str
    sql: str


def available_migrations() -> dict[int, dict[str, Migration]]:
    found: dict[int, dict[str, Migration]] = {}
    for entry in resources.files("memoryctl.stores").joinpath("sql").iterdir():
        m = _FILE.match(entry.name)
        if m:
            mig = Migration(int(m["version"]), m["variant"], entry.read_text())
            found.setdefault(mig.version, {})[mig.variant] = mig
    for version, variants in found.items():
        # Two files sharing a number by accident (two branches both adding "0004_…") would make
        # one of them silently never run: only the plain/timescale pair may share a version.
        if len(variants) > 1 and set(variants) != {"plain", "timescale"}:
            raise RuntimeError(f"migrations {sorted(variants)} share version {version:04d}: renumber one")
    return dict(sorted(found.items()))


def choose_variant(variants: dict[str, Migration], timescale: bool) -> Migration:
    if len(variants) == 1:
        return next(iter(variants.values()))
    return variants["timescale" if timescale else "plain"]


@dataclass(frozen=True, slots=True)
class TimescaleStatus:
    available: str | None  # default version of the installed package, None when not installed
    preloaded: bool  # shared_preload_libraries names it (the server was started with it)
    installed: str | None  # version of the extension created in this database

    @property
    def usable(self) -> bool:
        return self.available is not None and self.preloaded


def timescale_status(conn: Any) -> TimescaleStatus:
    row = conn.execute(
        "SELECT (SELECT default_version FROM pg_available_extensions WHERE name = 'timescaledb') AS available,"
        " (SELECT extversion FROM pg_extension WHERE extname = 'timescaledb') AS installed,"
        " current_setting('shared_preload_libraries') AS preload"
    ).fetchone()
    libs = {lib.strip().strip('"').rsplit("/", 1)[-1] for lib in row["preload"].split(",")}
    return TimescaleStatus(row["available"], "timescaledb" in libs, row["installed"])


def apply_schema(pool: Pool, *, timescale: bool | None = None) -> list[dict[str, Any]]:
    """Apply pending migrations; return what was applied (empty when up to date).

    ``timescale`` forces a path for a database that has none yet (tests use it to run the plain
    path on a server that has TimescaleDB); by default it is taken when TimescaleDB is usable.
    """
    applied: list[dict[str, Any]] = []
    with pg_errors(), pool.connection() as conn:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_KEY,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, variant text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            recorded = {
                r["version"]: r["variant"] for r in conn.execute("SELECT version, variant FROM schema_migrations")
            }
            done = set(recorded)
            if "timescale" in recorded.values() or "plain" in recorded.values():
                timescale = "timescale" in recorded.values()
            elif timescale is None:
                timescale = timescale_status(conn).usable
            for version, variants in available_migrations().items():
                if version in done:
                    continue
                mig = choose_variant(variants, timescale)
                conn.execute(mig.sql.encode())
                conn.execute(
                    "INSERT INTO schema_migrations (version, variant) VALUES (%s, %s)", (mig.version, mig.variant)
                )
                applied.append({"version": mig.version, "variant": mig.variant})
    return applied


def schema_state(pool: Pool) -> list[dict[str, Any]]:
    with pg_errors(), pool.connection() as conn:
        exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL AS ok").fetchone()
        if not exists or not exists["ok"]:
            return []
        return list(conn.execute("SELECT version, variant, applied_at FROM schema_migrations ORDER BY version"))


def latest_version() -> int:
    return max(available_migrations())
