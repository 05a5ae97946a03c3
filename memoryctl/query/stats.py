"""``memoryctl stats``: per time bucket, the live memories' count and the n/avg/min/max of one
numeric metadata field (a sentiment trend, say).

Two sources, one answer:

- ``memories`` itself: ``date_bin`` over ``created_at`` (BRIN index or hypertable chunks prune the
  range). Always right; the cost grows with the rows in the range.
- With TimescaleDB, the continuous aggregate ``memory_stats_hourly`` (migration 0004): per hour,
  agent and kind, the count and ``[n, sum, min, max]`` of every numeric metadata key. A bucket a
  whole number of hours wide is the sum of its hours, so it is read from the aggregate; the partial
  hours at the edges of ``[since, until)`` come from ``memories``. The hours read are refreshed
  first (``refresh_continuous_aggregate`` recomputes only what writes invalidated: a no-op when
  nothing changed), so an import of old memories or a soft delete is never missing from the answer.

Averages are sums divided by counts on both paths; the two may differ in the last bits of a float
(summation order), never more. Every user value is a bound parameter, the metric key too.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from memoryctl.stores.pg import Pool, pg_errors

ORIGIN = datetime(2000, 1, 3, tzinfo=UTC)  # a Monday, so weekly buckets start on Mondays
HOUR = timedelta(hours=1)
AGGREGATE = "memory_stats_hourly"

_BUCKETS = (
    "WITH buckets AS (SELECT generate_series(date_bin(%(width)s::interval, %(since)s::timestamptz,"
    " %(origin)s::timestamptz), %(until)s::timestamptz, %(width)s::interval) AS bucket)"
)
_SCOPE = "(%(agent)s::text IS NULL OR agent_id = %(agent)s) AND (%(kind)s::text IS NULL OR kind = %(kind)s)"
_VALUE = "CASE WHEN jsonb_typeof(metadata -> %(metric)s) = 'number' THEN (metadata ->> %(metric)s)::float8 END"
# One row per memory in the range (plain path) or per edge memory (aggregate path), as parts:
# t, n, n_metric, sum, min, max. Both paths add parts up the same way. The f-strings below join the
# constant fragments above; every value is a %(name)s parameter.
_RAW_PARTS = (
    f"SELECT created_at AS t, 1::bigint AS n, ({_VALUE} IS NOT NULL)::int::bigint AS mn,"  # noqa: S608
    f" {_VALUE} AS ms, {_VALUE} AS mi, {_VALUE} AS ma"
    f" FROM memories WHERE deleted_at IS NULL AND {_SCOPE}"
    " AND created_at >= %(since)s AND created_at < %(until)s"
)
_AGGREGATE_PARTS = (
    "SELECT bucket AS t, n, coalesce((metrics -> %(metric)s ->> 0)::bigint, 0) AS mn,"  # noqa: S608
    " (metrics -> %(metric)s ->> 1)::float8 AS ms, (metrics -> %(metric)s ->> 2)::float8 AS mi,"
    f" (metrics -> %(metric)s ->> 3)::float8 AS ma FROM {AGGREGATE}"
    f" WHERE bucket >= %(lo)s AND bucket < %(hi)s AND {_SCOPE}"
)
_TOTALS = (
    " SELECT b.bucket, coalesce(a.n, 0) AS count, a.n_metric, a.avg, a.min, a.max FROM buckets b LEFT JOIN"
    " (SELECT date_bin(%(width)s::interval, t, %(origin)s::timestamptz) AS bucket, sum(n)::bigint AS n,"
    " sum(mn)::bigint AS n_metric, sum(ms) / nullif(sum(mn), 0) AS avg, min(mi) AS min, max(ma) AS max"
    " FROM parts GROUP BY 1) a ON a.bucket = b.bucket WHERE b.bucket < %(until)s ORDER BY b.bucket"
)
PLAIN_SQL = f"{_BUCKETS}, parts AS ({_RAW_PARTS}){_TOTALS}"
AGGREGATE_SQL = (
    f"{_BUCKETS}, parts AS ({_AGGREGATE_PARTS} UNION ALL {_RAW_PARTS}"
    " AND (created_at < %(lo)s OR created_at >= %(hi)s))"
    f"{_TOTALS}"
)


def _floor_hour(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def aggregate_window(since: datetime, until: datetime) -> tuple[datetime, datetime]:
    """The whole hours inside ``[since, until)``: ``[lo, hi)``, empty (``lo == hi``) when there are none."""
    lo = _floor_hour(since)
    if lo < since:
        lo += HOUR
    return lo, max(lo, _floor_hour(until))


def uses_aggregate(conn: Any, width_s: float) -> bool:
    """The aggregate answers whole-hour buckets in a database that has it (the Timescale path)."""
    if width_s % 3600:
        return False
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL AS ok", (AGGREGATE,)).fetchone()
    return bool(row and row["ok"])


def refresh(conn: Any, lo: datetime, hi: datetime) -> None:
    """Bring the aggregate's hours in ``[lo, hi)`` up to date (a procedure: outside a transaction)."""
    if lo >= hi:
        return
    conn.autocommit = True
    try:
        conn.execute(f"CALL refresh_continuous_aggregate('{AGGREGATE}', %s::timestamptz, %s::timestamptz)", (lo, hi))
    finally:
        conn.autocommit = False


def stats(
    pool: Pool,
    *,
    agent_id: str | None,
    since: datetime,
    until: datetime,
    width_s: float,
    metric: str | None,
    kind: str | None,
    aggregate: bool | None = None,
) -> list[dict[str, Any]]:
    """Buckets over ``[since, until)``; ``aggregate`` forces a source (tests compare the two)."""
    if aggregate and width_s % 3600:
        raise ValueError("the aggregate answers whole-hour buckets only")
    lo, hi = aggregate_window(since, until)
    params = {
        "width": f"{int(width_s)} seconds",
        "origin": ORIGIN,
        "since": since,
        "until": until,
        "lo": lo,
        "hi": hi,
        "metric": metric or "",
        "agent": agent_id,
        "kind": kind,
    }
    with pg_errors(), pool.connection() as conn:
        if aggregate is None:
            aggregate = uses_aggregate(conn, width_s)
            conn.commit()
        if aggregate:
            refresh(conn, lo, hi)
        return list(conn.execute((AGGREGATE_SQL if aggregate else PLAIN_SQL).encode(), params))
