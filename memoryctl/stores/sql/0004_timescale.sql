-- `memoryctl stats` over a continuous aggregate: per hour, agent and kind, the live memories'
-- count and, for every numeric top-level metadata key, [n, sum, min, max]. Any bucket width that is
-- a whole number of hours is a sum of these rows (query/stats.py; partial hours at the edges of a
-- range come from `memories` itself), so the answers equal the plain path's.
CREATE FUNCTION memoryctl_metrics_step(state jsonb, metadata jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT coalesce(state, '{}'::jsonb) || coalesce((
    SELECT jsonb_object_agg(e.key, CASE
      WHEN state ? e.key THEN jsonb_build_array(
        (state -> e.key ->> 0)::bigint + 1, (state -> e.key ->> 1)::float8 + x.v,
        least((state -> e.key ->> 2)::float8, x.v), greatest((state -> e.key ->> 3)::float8, x.v))
      ELSE jsonb_build_array(1, x.v, x.v, x.v) END)
    FROM jsonb_each(metadata) e CROSS JOIN LATERAL (SELECT (e.value #>> '{}')::float8 AS v) x
    WHERE jsonb_typeof(e.value) = 'number'), '{}'::jsonb)
$$;
CREATE AGGREGATE memoryctl_metrics(jsonb) (SFUNC = memoryctl_metrics_step, STYPE = jsonb, INITCOND = '{}');

CREATE MATERIALIZED VIEW memory_stats_hourly WITH (timescaledb.continuous, timescaledb.materialized_only = false) AS
SELECT time_bucket(INTERVAL '1 hour', created_at) AS bucket, agent_id, kind,
       count(*) AS n, memoryctl_metrics(metadata) AS metrics
FROM memories WHERE deleted_at IS NULL
GROUP BY 1, 2, 3
WITH NO DATA;
-- The policy keeps the aggregate warm; `stats` refreshes the range it reads first, so late writes
-- (imports of old memories, soft deletes) never make it answer differently from `memories`.
SELECT add_continuous_aggregate_policy('memory_stats_hourly', start_offset => NULL,
  end_offset => INTERVAL '1 hour', schedule_interval => INTERVAL '30 minutes', if_not_exists => TRUE);
