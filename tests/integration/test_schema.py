"""Schema migrations against the real PostgreSQL 15 with the real TimescaleDB 2.28 (the artefact
scripts/bootstrap installs and scripts/services preloads): both paths for real.

- The Timescale path: hypertables, compression and retention policies, the continuous aggregate
  behind ``memoryctl stats``, and the policies running as the server's *background* jobs (the
  artefact README's PostgreSQL 15.20 bug made exactly those fail while everything else looked fine).
- The plain path, forced in a database of the same server (the embedded profile's PostgreSQL 18
  has no TimescaleDB and takes it too: tests/e2e).
- ``stats`` from the aggregate equals ``stats`` from the table, and a brute-force count in Python.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from memoryctl.stores.pg import Pool, open_pool
from memoryctl.stores.schema import TimescaleStatus, apply_schema, available_migrations, schema_state, timescale_status

pytestmark = pytest.mark.integration


def variants(path: str) -> list[dict[str, Any]]:
    """Every version with the variant a database on ``path`` applies (single-variant versions: theirs)."""
    out = []
    for version, found in available_migrations().items():
        variant = path if path in found else next(iter(found))
        out.append({"version": version, "variant": variant})
    return out


@pytest.fixture
def pool(pg_dsn: str) -> Iterator[Pool]:
    p = open_pool(pg_dsn)
    yield p
    p.close()


def rows(pool: Pool, query: str, params: Any = None) -> list[dict[str, Any]]:
    with pool.connection() as conn:
        return list(conn.execute(query.encode(), params))


def indexes(pool: Pool, table: str) -> set[str]:
    return {r["indexname"] for r in rows(pool, "SELECT indexname FROM pg_indexes WHERE tablename = %s", (table,))}


def test_the_test_server_has_timescale_loaded(pool: Pool) -> None:
    """Available (package installed) *and* loaded (preloaded): both, or the Timescale path never ran."""
    with pool.connection() as conn:
        ts = timescale_status(conn)
    assert ts.available == "2.28.3" and ts.preloaded and ts.installed is None, ts
    assert TimescaleStatus("2.28.3", preloaded=False, installed=None).usable is False
    assert TimescaleStatus(None, preloaded=True, installed=None).usable is False


def test_timescale_path_is_applied_and_recorded(pool: Pool) -> None:
    applied = apply_schema(pool)
    assert applied == variants("timescale")
    assert [a["version"] for a in applied if a["variant"] == "timescale"] == [2, 4]
    assert apply_schema(pool) == []  # idempotent
    assert [(r["version"], r["variant"]) for r in schema_state(pool)] == [(a["version"], a["variant"]) for a in applied]
    assert rows(pool, "SELECT extversion FROM pg_extension WHERE extname = 'timescaledb'") == [{"extversion": "2.28.3"}]
    hypertables = rows(
        pool,
        "SELECT h.hypertable_name AS t, d.column_name AS col, d.time_interval::text AS every, h.compression_enabled"
        " FROM timescaledb_information.hypertables h JOIN timescaledb_information.dimensions d"
        " USING (hypertable_schema, hypertable_name) WHERE h.hypertable_schema = 'public' ORDER BY 1",
    )
    assert hypertables == [
        {"t": "memories", "col": "created_at", "every": "7 days", "compression_enabled": False},
        {"t": "memory_events", "col": "time", "every": "1 day", "compression_enabled": True},
    ]
    jobs = rows(
        pool,
        "SELECT proc_name, hypertable_name, config FROM timescaledb_information.jobs"
        " WHERE hypertable_schema = 'public' ORDER BY proc_name",
    )
    assert [(j["proc_name"], j["hypertable_name"]) for j in jobs] == [
        ("policy_compression", "memory_events"),
        ("policy_refresh_continuous_aggregate", "memory_stats_hourly"),
        ("policy_retention", "memory_events"),
    ]
    assert jobs[0]["config"]["compress_after"] == "7 days"
    assert jobs[2]["config"]["drop_after"] == "180 days"
    caggs = rows(pool, "SELECT view_name, materialized_only FROM timescaledb_information.continuous_aggregates")
    assert caggs == [{"view_name": "memory_stats_hourly", "materialized_only": False}]
    # No unique index on id alone here (a hypertable's unique indexes must hold created_at): the
    # primary key (id, created_at) and the writer keep ids unique; the plain path adds the index.
    assert indexes(pool, "memories") == {
        "memories_pkey",
        "memories_agent_created",
        "memories_live_scope",
        "memories_tsv",
        "memories_metadata",
        "memories_deleted",
        "memories_id",
        "memories_created_at_idx",
        "memories_updated_at",
    }


def test_plain_path_when_forced_on_the_same_server(pool: Pool) -> None:
    applied = apply_schema(pool, timescale=False)
    assert applied == variants("plain")
    assert [a["version"] for a in applied if a["variant"] == "plain"] == [2, 4]
    assert apply_schema(pool) == []  # the recorded path wins over "TimescaleDB is usable here"
    assert rows(pool, "SELECT extname FROM pg_extension WHERE extname = 'timescaledb'") == []
    assert rows(pool, "SELECT to_regclass('memory_stats_hourly') IS NULL AS none") == [{"none": True}]
    assert indexes(pool, "memories") == {
        "memories_pkey",
        "memories_agent_created",
        "memories_live_scope",
        "memories_tsv",
        "memories_metadata",
        "memories_deleted",
        "memories_id_key",
        "memories_created_brin",
        "memories_updated_at",
    }
    with pool.connection() as conn, pytest.raises(psycopg.errors.UniqueViolation):
        for ts in ("2026-01-01", "2026-01-02"):  # same id, other created_at: refused on the plain path
            conn.execute(
                "INSERT INTO memories (id, agent_id, text, kind, created_at, updated_at, content_hash)"
                " VALUES ('00000000-0000-0000-0000-000000000001', 'a', 't', 'note', %s, %s, 'h')",
                (ts, ts),
            )


def test_later_versions_follow_the_recorded_path(pool: Pool) -> None:
    """A database that took the plain path keeps it when TimescaleDB appears later (0004 needs 0002's
    hypertable): it is migrated deliberately, not by the next `init`."""
    with pool.connection() as conn:
        conn.execute(
            "CREATE TABLE schema_migrations (version integer PRIMARY KEY, variant text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version in (1, 2):
            mig = available_migrations()[version]["core" if version == 1 else "plain"]
            conn.execute(mig.sql.encode())
            conn.execute("INSERT INTO schema_migrations VALUES (%s, %s)", (version, mig.variant))
    applied = apply_schema(pool)
    assert {a["version"]: a["variant"] for a in applied}[4] == "plain"


# --------------------------------------------------------------------------------- background jobs


def run_jobs_in_background(pool: Pool, job_ids: list[int], *, bound_s: float = 120.0) -> list[dict[str, Any]]:
    """Have the server's job scheduler run these jobs now; return their stats once each has run.

    The wait is for an event (the scheduler's run), bounded so a scheduler that never runs them
    fails the test instead of hanging it; nothing is asserted about how long it took.
    """

    def completed() -> dict[int, dict[str, Any]]:
        found = rows(
            pool,
            "SELECT job_id, coalesce(total_successes, 0) + coalesce(total_failures, 0) AS done, job_status,"
            " last_run_status FROM timescaledb_information.job_stats WHERE job_id = ANY(%s)",
            (job_ids,),
        )
        return {r["job_id"]: r for r in found}

    before = {job: r["done"] for job, r in completed().items()}
    with pool.connection() as conn:
        for job in job_ids:
            conn.execute("SELECT alter_job(%s, next_start => now())", (job,))
    deadline = time.monotonic() + bound_s
    while True:
        stats = completed()
        if all(job in stats and stats[job]["done"] > before.get(job, 0) for job in job_ids):
            return [stats[job] for job in sorted(job_ids)]
        assert time.monotonic() < deadline, f"the scheduler did not run jobs {job_ids}: {stats}"
        time.sleep(0.2)


def policy_jobs(pool: Pool) -> dict[str, int]:
    found = rows(pool, "SELECT job_id, proc_name FROM timescaledb_information.jobs WHERE hypertable_schema = 'public'")
    return {r["proc_name"]: r["job_id"] for r in found}


def test_policies_run_as_background_jobs(pool: Pool) -> None:
    from memoryctl.health.probes import timescale_jobs, timescale_problems

    apply_schema(pool)
    now = datetime.now(UTC)
    with pool.connection() as conn:
        for age_days in (1, 30, 200):
            conn.execute(
                "INSERT INTO memory_events (time, agent_id, event) VALUES (%s, 'a', 'recall')",
                (now - timedelta(days=age_days),),
            )
        insert_memories(conn, [("a", "note", now - timedelta(days=3), {"m": 1.5})])
    jobs = policy_jobs(pool)
    stats = run_jobs_in_background(pool, sorted(jobs.values()))
    assert [s["last_run_status"] for s in stats] == ["Success"] * 3, stats
    # retention dropped the 200-day-old event's chunk; compression compressed the 30-day-old one
    ages = rows(pool, "SELECT (now() - time) > interval '100 days' AS old FROM memory_events ORDER BY time")
    assert ages == [{"old": False}, {"old": False}]
    compressed = rows(
        pool,
        "SELECT count(*) FILTER (WHERE is_compressed) AS c, count(*) AS n FROM timescaledb_information.chunks"
        " WHERE hypertable_name = 'memory_events'",
    )
    assert compressed == [{"c": 1, "n": 2}]
    assert rows(pool, "SELECT sum(n) AS n FROM memory_stats_hourly") == [{"n": 1}]  # the refresh policy ran
    with pool.connection() as conn:
        ts = timescale_status(conn)
        assert timescale_problems(ts, "timescale", timescale_jobs(conn)) == []


def test_a_failing_background_job_is_reported(pool: Pool) -> None:
    from memoryctl.health.probes import timescale_jobs, timescale_problems

    apply_schema(pool)
    with pool.connection() as conn:
        conn.execute(
            "CREATE PROCEDURE broken_job(job_id int, config jsonb) LANGUAGE plpgsql"
            " AS $$ BEGIN RAISE EXCEPTION 'planted failure %', job_id; END $$"
        )
        job = conn.execute("SELECT add_job('broken_job', '1 day', initial_start => now() + interval '1 day') AS id")
        job_id = job.fetchone()["id"]  # type: ignore[index]
    [stat] = run_jobs_in_background(pool, [job_id])
    assert stat["last_run_status"] == "Failed"
    with pool.connection() as conn:
        problems = timescale_problems(timescale_status(conn), "timescale", timescale_jobs(conn))
    assert problems == [f"TimescaleDB job {job_id} (broken_job) failed: planted failure {job_id}"]


# ------------------------------------------------------------------------------------------ stats

T0 = datetime(2026, 3, 2, 5, 17, 3, tzinfo=UTC)  # deliberately not on an hour


def insert_memories(conn: Any, specs: list[tuple[str, str, datetime, dict[str, Any]]]) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in specs]
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO memories (id, agent_id, text, kind, created_at, updated_at, content_hash, metadata)"
            " VALUES (%s, %s, 'x', %s, %s, %s, 'h', %s)",
            [(i, a, k, t, t, Jsonb(m)) for i, (a, k, t, m) in zip(ids, specs, strict=True)],
        )
    return ids


def seeded_specs(seed: int, n: int) -> list[tuple[str, str, datetime, dict[str, Any]]]:
    """Memories over ~12 days at random seconds: numbers, strings, booleans and missing values."""
    rng = random.Random(seed)
    specs = []
    for _ in range(n):
        meta: dict[str, Any] = {}
        r = rng.random()
        if r < 0.6:
            meta["sentiment"] = rng.choice([rng.uniform(-1, 1), rng.randint(-3, 3)])
        elif r < 0.7:
            meta["sentiment"] = rng.choice(["high", True, None, [1]])
        if rng.random() < 0.5:
            meta["score"] = rng.randint(0, 100)
        t = T0 + timedelta(seconds=rng.randint(0, 12 * 86400))
        specs.append((rng.choice(["a", "b"]), rng.choice(["note", "dialogue"]), t, meta))
    return specs


def oracle(specs: list[tuple[str, str, datetime, dict[str, Any]]], q: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Brute force in Python: (bucket, count, n, min, max) per bucket."""
    from memoryctl.query.stats import ORIGIN

    width = timedelta(seconds=q["width_s"])
    first = ORIGIN + ((q["since"] - ORIGIN) // width) * width
    out = []
    b = first
    while b < q["until"]:
        inside = [
            s
            for s in specs
            if max(b, q["since"]) <= s[2] < min(b + width, q["until"])
            and q["agent_id"] in (None, s[0])
            and q["kind"] in (None, s[1])
        ]
        vals = [
            float(s[3][q["metric"]])
            for s in inside
            if q["metric"] and type(s[3].get(q["metric"])) in (int, float)  # JSON numbers, not booleans
        ]
        out.append((b, len(inside), len(vals), min(vals, default=None), max(vals, default=None)))
        b += width
    return out


def shape(result: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["bucket"], r["count"], r["n_metric"] or 0, r["min"], r["max"]) for r in result]


def assert_same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert shape(a) == shape(b)
    for x, y in zip(a, b, strict=True):
        assert (x["avg"] is None) == (y["avg"] is None)
        if y["avg"] is not None:
            assert x["avg"] == pytest.approx(y["avg"], rel=1e-12, abs=1e-12)  # summation order only


QUERIES = [
    {"width_s": 3600, "since": T0, "until": T0 + timedelta(days=12, hours=1)},
    {"width_s": 86400, "since": T0 - timedelta(days=1), "until": T0 + timedelta(days=13)},
    {"width_s": 3 * 3600, "since": T0 + timedelta(minutes=41), "until": T0 + timedelta(days=5, minutes=7)},
    {"width_s": 7 * 86400, "since": T0 - timedelta(days=9), "until": T0 + timedelta(days=20)},
    {"width_s": 3600, "since": T0 + timedelta(minutes=5), "until": T0 + timedelta(minutes=50)},  # inside one hour
]


@pytest.fixture
def both_paths(pg_admin_dsn: str) -> Iterator[tuple[Pool, Pool]]:
    """The same server, one database per path."""
    from tests.conftest import fresh_database

    with fresh_database(pg_admin_dsn) as ts_dsn, fresh_database(pg_admin_dsn) as plain_dsn:
        ts, plain = open_pool(ts_dsn), open_pool(plain_dsn)
        try:
            apply_schema(ts)
            apply_schema(plain, timescale=False)
            yield ts, plain
        finally:
            ts.close()
            plain.close()


def test_stats_from_the_aggregate_equal_the_table(both_paths: tuple[Pool, Pool]) -> None:
    from memoryctl.query.stats import aggregate_window, refresh, stats, uses_aggregate

    ts, plain = both_paths
    with ts.connection() as a, plain.connection() as b:
        assert (uses_aggregate(a, 3 * 3600), uses_aggregate(a, 1800), uses_aggregate(b, 3600)) == (True, False, False)
    specs = seeded_specs(seed=5, n=1500)
    late = seeded_specs(seed=6, n=200)  # written after the aggregate has been refreshed once
    for pool in both_paths:
        with pool.connection() as conn:
            ids = insert_memories(conn, specs)
        if pool is ts:  # materialise everything, so the late writes below make it stale
            with ts.connection() as conn:
                refresh(conn, T0 - timedelta(days=30), T0 + timedelta(days=30))
        with pool.connection() as conn:
            insert_memories(conn, late)
            conn.execute("UPDATE memories SET deleted_at = now() WHERE id = ANY(%s)", (ids[::7],))
    live = [s for i, s in enumerate(specs) if i % 7] + late
    # The late writes made the materialised hours stale: reading the view alone would be wrong,
    # which is what stats' refresh is for (and what the comparisons below would catch).
    lo, hi = aggregate_window(T0, T0 + timedelta(days=13))
    in_window = sum(1 for s in live if lo <= s[2] < hi)
    view = "SELECT sum(n)::int AS n FROM memory_stats_hourly WHERE bucket >= %s AND bucket < %s"
    assert rows(ts, view, (lo, hi)) != [{"n": in_window}]
    stats(ts, agent_id=None, since=lo, until=hi, width_s=3600, metric=None, kind=None)
    assert rows(ts, view, (lo, hi)) == [{"n": in_window}]
    checked = 0
    for q in QUERIES:
        for agent_id in (None, "a"):
            for kind in (None, "dialogue"):
                for metric in (None, "sentiment", "score", "absent"):
                    args = {**q, "agent_id": agent_id, "kind": kind, "metric": metric}
                    from_aggregate = stats(ts, **args)
                    assert_same(from_aggregate, stats(ts, **args, aggregate=False))
                    assert_same(from_aggregate, stats(plain, **args))
                    expected = oracle(live, args)
                    assert [r[:3] for r in shape(from_aggregate)] == [e[:3] for e in expected]
                    for got, want in zip(shape(from_aggregate), expected, strict=True):
                        assert [x is None for x in got[3:]] == [x is None for x in want[3:]]
                        if want[3] is not None:
                            assert got[3:] == pytest.approx(want[3:])
                    checked += sum(r["count"] for r in from_aggregate)
    assert checked > 20_000  # the comparison covered real rows, not empty buckets


def test_lexical_terms_are_rebuilt_by_their_migration_on_both_paths(both_paths: tuple[Pool, Pool]) -> None:
    """Schema 0009 (after 0007) counts the words and the entity names of the memories already there
    (a hypertable or a plain table), and running it again gives the same counts: deploys re-run
    migrations."""
    (migration,) = available_migrations()[9].values()
    recount = (
        "SELECT agent_id, term, count(*)::bigint AS df FROM memories, unnest(memoryctl_memory_terms(tsv, entities))"
        " AS term WHERE deleted_at IS NULL GROUP BY 1, 2 ORDER BY 1, 2"
    )
    for pool in both_paths:
        with pool.connection() as conn:
            ids = insert_memories(conn, seeded_specs(seed=3, n=400))
            conn.execute("UPDATE memories SET text = 'rollback of ' || agent_id || ' ' || kind")
            conn.execute("UPDATE memories SET deleted_at = now() WHERE id = ANY(%s)", (ids[::5],))
            conn.execute(
                'UPDATE memories SET entities = \'[{"type": "Customer", "name": "Acme  Corp."}]\' WHERE id = ANY(%s)',
                (ids[:40],),
            )
        for _ in range(2):
            with pool.connection() as conn:
                conn.execute(migration.sql.encode())
            kept = rows(pool, "SELECT agent_id, term, df FROM lexical_terms ORDER BY 1, 2")
            assert kept == rows(pool, recount)
        live = {r["agent_id"]: r["df"] for r in kept if r["term"] == ""}
        assert sum(live.values()) == 320 and {r["term"] for r in kept} == {
            "",
            "rollb",
            "of",
            "a",
            "b",
            "note",
            "dialo",
            "acme",
            "corp",
            "entity acme corp",
        }
        assert sum(r["df"] for r in kept if r["term"] == "entity acme corp") == 32  # 40 less the forgotten
