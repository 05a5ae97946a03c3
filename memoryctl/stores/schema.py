"""Versioned schema migrations, applied by ``memoryctl init`` (and on first use).

Migrations are the numbered ``sql/NNNN_*.sql`` files, applied in order under an advisory lock so
two processes never race. A version may have variants: ``0002`` is ``timescale`` when the
extension is available on the server (``pg_available_extensions``) and ``plain`` otherwise; the
variant applied is recorded in ``schema_migrations`` so ``health`` and the README can say which path
ran, instead of silently skipping one.
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
    return dict(sorted(found.items()))


def choose_variant(variants: dict[str, Migration], timescale: bool) -> Migration:
    if len(variants) == 1:
        return next(iter(variants.values()))
    return variants["timescale" if timescale else "plain"]


def timescale_available(pool: Pool) -> bool:
    with pg_errors(), pool.connection() as conn:
        row = conn.execute("SELECT 1 AS ok FROM pg_available_extensions WHERE name = 'timescaledb'").fetchone()
    return row is not None


def migrate(pool: Pool, *, timescale: bool | None = None) -> list[dict[str, Any]]:
    """Apply pending migrations; return what was applied (empty when up to date)."""
    applied: list[dict[str, Any]] = []
    if timescale is None:
        timescale = timescale_available(pool)
    with pg_errors(), pool.connection() as conn:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_KEY,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, variant text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r["version"] for r in conn.execute("SELECT version FROM schema_migrations").fetchall()}
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
