-- Path without TimescaleDB: plain tables, a unique id, and BRIN indexes on the time columns
-- (rows arrive roughly in time order, so BRIN stays tiny and still prunes time ranges).
CREATE UNIQUE INDEX IF NOT EXISTS memories_id_key ON memories (id);
CREATE INDEX IF NOT EXISTS memories_created_brin ON memories USING brin (created_at);
CREATE INDEX IF NOT EXISTS memory_events_time_brin ON memory_events USING brin (time);
