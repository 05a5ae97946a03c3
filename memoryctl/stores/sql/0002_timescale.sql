-- Path with TimescaleDB: hypertables on the time columns, compression and retention for events.
CREATE EXTENSION IF NOT EXISTS timescaledb;
SELECT create_hypertable('memories', by_range('created_at', INTERVAL '7 days'), if_not_exists => TRUE, migrate_data => TRUE);
CREATE INDEX IF NOT EXISTS memories_id ON memories (id);
SELECT create_hypertable('memory_events', by_range('time', INTERVAL '1 day'), if_not_exists => TRUE, migrate_data => TRUE);
ALTER TABLE memory_events SET (timescaledb.compress, timescaledb.compress_segmentby = 'agent_id');
SELECT add_compression_policy('memory_events', INTERVAL '7 days', if_not_exists => TRUE);
SELECT add_retention_policy('memory_events', INTERVAL '180 days', if_not_exists => TRUE);
