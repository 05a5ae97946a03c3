-- Word statistics for the lexical leg, per agent: how many live memories hold each word, and (the
-- empty word, which no tsvector holds) how many live memories the agent has. The lexical leg reads
-- its inverse document frequencies here instead of counting the memories that share a word with
-- the question on every query: at 100,000 memories a common word (a speaker's name, or the
-- benchmark's 23-word vocabulary) made that count, and the leg, linear in three quarters of them.
-- The writer keeps it in the transaction that writes the memories (stores/lexical_terms.py), one
-- upsert per transaction in key order, so that concurrent writers never deadlock on it.
--
-- A word is what the question's words are matched by (query/lexical.py): its first five letters
-- when it has at least five (matched as a prefix), else the whole word. A memory counts once per
-- word whatever the number of its words sharing the prefix, as a document frequency should.
-- Whoever changes memories.tsv or this function must rebuild the table (the statements below).
CREATE OR REPLACE FUNCTION memoryctl_lexical_terms(v tsvector) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT coalesce(array_agg(DISTINCT CASE WHEN length(w) >= 5 THEN left(w, 5) ELSE w END), '{}')
  FROM unnest(tsvector_to_array(v)) AS w
$$;

CREATE TABLE IF NOT EXISTS lexical_terms (
    agent_id text   NOT NULL,
    term     text   NOT NULL,
    df       bigint NOT NULL,
    PRIMARY KEY (agent_id, term)
);

-- Rebuilt from the memories (the same result however often it runs: migrations must be idempotent).
TRUNCATE lexical_terms;
INSERT INTO lexical_terms (agent_id, term, df)
SELECT agent_id, term, count(*) FROM memories, unnest(memoryctl_lexical_terms(tsv) || ''::text) AS term
WHERE deleted_at IS NULL GROUP BY agent_id, term;
