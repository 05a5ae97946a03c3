-- The order memories were written in, for memories written at the same instant. A loader that
-- stamps every turn of a conversation's session with the session's time (as a data set with
-- session dates only does) leaves created_at with no order between the turns; the writer inserts
-- a batch in the caller's order, so a sequence taken at insert keeps the conversation's order.
-- Readers order by (created_at, seq): time first, the write order among equal times. An update
-- keeps its memory's seq (ON CONFLICT DO UPDATE does not set it). Memories written before this
-- migration have none (NULL): among equal times they stay unordered, as before.
-- ADD COLUMN without a default and SET DEFAULT afterwards rewrite no row (a hypertable included).
CREATE SEQUENCE IF NOT EXISTS memories_write_seq AS bigint;
ALTER TABLE memories ADD COLUMN IF NOT EXISTS seq bigint;
ALTER TABLE memories ALTER COLUMN seq SET DEFAULT nextval('memories_write_seq');
ALTER SEQUENCE memories_write_seq OWNED BY memories.seq;
