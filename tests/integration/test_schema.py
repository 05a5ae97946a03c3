"""Schema migrations against the real PostgreSQL: the plain path for real, the TimescaleDB path
against STAND-INS.

TimescaleDB is in neither Debian 12's archive nor any wheel, so its variant cannot run here. The
stand-ins below are plain SQL functions with TimescaleDB's signatures (create_hypertable with
by_range, add_compression_policy, add_retention_policy) that check their arguments against the
real tables and record the calls. They prove the Timescale migration parses, binds and names real
columns — not that TimescaleDB behaves as documented. The two statements no stand-in can emulate
(CREATE EXTENSION and the timescaledb.* storage parameters) are asserted to be exactly those two.
"""

from __future__ import annotations

import psycopg
import pytest

from memoryctl.stores.pg import open_pool
from memoryctl.stores.schema import apply_schema, available_migrations, schema_state

pytestmark = pytest.mark.integration

STANDINS = """
CREATE TYPE ts_dimension AS (column_name name, partition_interval text);
CREATE TABLE ts_calls (fn text, relation regclass, detail text);
CREATE FUNCTION by_range(column_name name, partition_interval anyelement) RETURNS ts_dimension
  LANGUAGE sql AS $$ SELECT ROW(column_name, partition_interval::text)::ts_dimension $$;
CREATE FUNCTION create_hypertable(relation regclass, dimension ts_dimension,
  create_default_indexes boolean DEFAULT true, if_not_exists boolean DEFAULT false,
  migrate_data boolean DEFAULT false) RETURNS TABLE(hypertable_id int, created boolean)
  LANGUAGE plpgsql AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = relation
                 AND attname = (dimension).column_name AND NOT attisdropped) THEN
    RAISE EXCEPTION 'column % does not exist on %', (dimension).column_name, relation;
  END IF;
  INSERT INTO ts_calls VALUES ('create_hypertable', relation, (dimension).column_name);
  RETURN QUERY SELECT 1, true;
END $$;
CREATE FUNCTION add_compression_policy(hypertable regclass, compress_after interval,
  if_not_exists boolean DEFAULT false) RETURNS integer LANGUAGE sql
  AS $$ INSERT INTO ts_calls VALUES ('add_compression_policy', hypertable, compress_after::text) RETURNING 1 $$;
CREATE FUNCTION add_retention_policy(relation regclass, drop_after interval,
  if_not_exists boolean DEFAULT false) RETURNS integer LANGUAGE sql
  AS $$ INSERT INTO ts_calls VALUES ('add_retention_policy', relation, drop_after::text) RETURNING 1 $$;
"""
UNEMULATABLE = ("CREATE EXTENSION IF NOT EXISTS timescaledb", "ALTER TABLE memory_events SET (timescaledb.")


def test_plain_path_is_applied_and_recorded(pg_dsn: str) -> None:
    pool = open_pool(pg_dsn)
    try:
        applied = apply_schema(pool)
        assert applied[:2] == [{"version": 1, "variant": "core"}, {"version": 2, "variant": "plain"}]
        assert [a["version"] for a in applied] == sorted(available_migrations())
        assert apply_schema(pool) == []  # idempotent
        assert [(r["version"], r["variant"]) for r in schema_state(pool)][:2] == [(1, "core"), (2, "plain")]
        with pool.connection() as conn:
            brin = conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'memories' AND indexdef ILIKE '%USING brin%'"
            ).fetchall()
            assert [r["indexname"] for r in brin] == ["memories_created_brin"]
            with pytest.raises(psycopg.errors.UniqueViolation):
                for ts in ("2026-01-01", "2026-01-02"):  # same id, other created_at: refused on the plain path
                    conn.execute(
                        "INSERT INTO memories (id, agent_id, text, kind, created_at, updated_at, content_hash)"
                        " VALUES ('00000000-0000-0000-0000-000000000001', 'a', 't', 'note', %s, %s, 'h')",
                        (ts, ts),
                    )
    finally:
        pool.close()


def test_timescale_variant_against_standins(pg_dsn: str) -> None:
    core = available_migrations()[1]["core"].sql
    timescale = available_migrations()[2]["timescale"].sql
    statements = [s for s in (_strip_comments(s) for s in timescale.split(";")) if s]
    skipped = [s for s in statements if s.startswith(UNEMULATABLE)]
    assert len(skipped) == 2, skipped
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(core.encode())
        conn.execute(STANDINS.encode())
        for stmt in statements:
            if stmt not in skipped:
                conn.execute(stmt.encode())
        calls = conn.execute("SELECT fn, relation::text, detail FROM ts_calls ORDER BY fn, relation::text").fetchall()
    assert calls == [
        ("add_compression_policy", "memory_events", "7 days"),
        ("add_retention_policy", "memory_events", "180 days"),
        ("create_hypertable", "memories", "created_at"),
        ("create_hypertable", "memory_events", "time"),
    ]


def _strip_comments(stmt: str) -> str:
    return "\n".join(line for line in stmt.splitlines() if not line.strip().startswith("--")).strip()
