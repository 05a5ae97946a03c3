-- The names of the entities an agent's live memories carry, counted in lexical_terms beside the
-- words: the query engine asks which of them a question says (query/dense_question.py) before it embeds
-- the question, and the dense leg embeds the question without them (a small bi-encoder weighs a
-- name so heavily that "thanks Bob" outranked Bob's own turns for "the risks Bob raised"; who is
-- named is the entity leg's and the lexical leg's to judge, both match names exactly).
--
-- A name's term is 'entity ' followed by its words, lower-cased, one space apart (query/dense_question.py
-- builds the question's side the same way). No word of a tsvector holds a space, so these terms
-- never meet a question word's key, and the empty word still counts each memory once.
-- Whoever changes these functions must rebuild the table (the statements below).
CREATE OR REPLACE FUNCTION memoryctl_entity_terms(entities jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT coalesce(array_agg(DISTINCT 'entity ' || n), '{}') FROM (
    SELECT array_to_string(ARRAY(
      SELECT w FROM regexp_split_to_table(lower(e ->> 'name'), '\W+') AS w WHERE w <> ''), ' ') AS n
    FROM jsonb_array_elements(entities) AS e WHERE jsonb_typeof(e -> 'name') = 'string'
  ) AS names WHERE n <> ''
$$;

-- Every term lexical_terms counts for one memory: its words, its entities' names, and the empty
-- word (the memory itself).
CREATE OR REPLACE FUNCTION memoryctl_memory_terms(v tsvector, entities jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT memoryctl_lexical_terms(v) || memoryctl_entity_terms(entities) || ''::text
$$;

-- A query over every agent (--all-agents) looks terms up without an agent: by this index, not a
-- scan of every agent's words (the lexical leg's weights too).
CREATE INDEX IF NOT EXISTS lexical_terms_term ON lexical_terms (term);

-- Rebuilt from the memories (the same result however often it runs: migrations must be idempotent).
TRUNCATE lexical_terms;
INSERT INTO lexical_terms (agent_id, term, df)
SELECT agent_id, term, count(*) FROM memories, unnest(memoryctl_memory_terms(tsv, entities)) AS term
WHERE deleted_at IS NULL GROUP BY agent_id, term;
