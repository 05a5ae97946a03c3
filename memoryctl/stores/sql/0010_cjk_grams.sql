-- Chinese, Japanese and Korean text in the lexical leg. PostgreSQL's text-search parser splits
-- words at spaces and punctuation; Chinese and Japanese put none between words, so a whole clause
-- ("我喜欢猫") became one lexeme and no question word short of that clause ever matched it. The
-- standard answer of search engines without a dictionary (Lucene's CJKBigramFilter, Elasticsearch's
-- cjk analyzer) is overlapping character bigrams: "我喜欢猫" is indexed as 我喜 喜欢 欢猫, and a
-- question's "喜欢" matches. pg_trgm was measured and rejected: it pads every word with spaces, so
-- a two-character word inside a clause shares no trigram with it (similarity('我喜欢猫', '喜欢')
-- is 0), its index serves substring search only from three characters on (most Chinese words have
-- two), and whether it sees these characters at all depends on the database's locale.
--
-- memoryctl_cjk_grams(text, unigrams): the bigrams of every run of Han, Hiragana, Katakana and
-- Hangul characters, space-separated; with ``unigrams`` also each character alone (what a memory
-- is indexed with, so a one-character question word, "猫", finds it), and a run of one character
-- is always itself. A question is split without unigrams (query/lexical.py): its bigrams say
-- which words it asks about. Hangul is split too, as Lucene does: Korean writes spaces, but glues
-- particles to words (고양이가), which the bigrams see through.
CREATE OR REPLACE FUNCTION memoryctl_cjk_grams(t text, unigrams boolean) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT coalesce(string_agg(g, ' '), '') FROM (
    SELECT substr(run, i, 2) AS g
    FROM regexp_matches(t, '[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]+', 'g') AS m(a),
         LATERAL (SELECT a[1] AS run) AS r, LATERAL generate_series(1, greatest(length(run) - 1, 1)) AS i
    UNION ALL
    SELECT c FROM regexp_split_to_table(
      CASE WHEN unigrams THEN regexp_replace(t, '[^\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]', '', 'g')
      ELSE '' END, '') AS c WHERE c <> ''
  ) AS grams
$$;

-- A memory's words: its text, its text's CJK grams, its entities' names (0005's column otherwise).
DROP INDEX IF EXISTS memories_tsv;
ALTER TABLE memories DROP COLUMN IF EXISTS tsv;
ALTER TABLE memories ADD COLUMN tsv tsvector GENERATED ALWAYS AS (
    to_tsvector('simple', text)
    || to_tsvector('simple', memoryctl_cjk_grams(text, true))
    || jsonb_to_tsvector('simple', jsonb_path_query_array(entities, '$[*].name'), '["string"]')
) STORED;
CREATE INDEX IF NOT EXISTS memories_tsv ON memories USING gin (tsv);

-- The word statistics follow the new words (0009's statements).
TRUNCATE lexical_terms;
INSERT INTO lexical_terms (agent_id, term, df)
SELECT agent_id, term, count(*) FROM memories, unnest(memoryctl_memory_terms(tsv, entities)) AS term
WHERE deleted_at IS NULL GROUP BY agent_id, term;
