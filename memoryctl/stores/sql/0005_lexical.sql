-- The lexical leg of hybrid retrieval searches a memory's text AND the names of its entities: a
-- turn said by the entity Speaker:Fatima is found by "Fatima's pipeline worries" even when its
-- text never names her (measured with benchmarks/recall.py: +0.11 recall@10 on conversations whose
-- turns carry the speaker only as an entity, no change where the text already names them).
-- Replaces the text-only column of 0001; the 'simple' configuration stays (no language assumed).
DROP INDEX IF EXISTS memories_tsv;
ALTER TABLE memories DROP COLUMN IF EXISTS tsv;
ALTER TABLE memories ADD COLUMN tsv tsvector GENERATED ALWAYS AS (
    to_tsvector('simple', text)
    || jsonb_to_tsvector('simple', jsonb_path_query_array(entities, '$[*].name'), '["string"]')
) STORED;
CREATE INDEX IF NOT EXISTS memories_tsv ON memories USING gin (tsv);
