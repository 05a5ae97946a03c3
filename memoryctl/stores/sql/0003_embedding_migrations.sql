-- Resumable embedding-model migrations (`memoryctl migrate`): one row per target model, holding the
-- keyset checkpoint of the copy phase so a killed run continues where it stopped, and the time the
-- copy started so the catch-up pass knows which rows changed meanwhile.
CREATE TABLE IF NOT EXISTS embedding_migrations (
    id            bigserial   PRIMARY KEY,
    source_model  text,
    target_model  text        NOT NULL,
    target_spec   jsonb       NOT NULL DEFAULT '{}'::jsonb,
    status        text        NOT NULL DEFAULT 'copying'
                              CHECK (status IN ('copying', 'verifying', 'swapped', 'rolled_back', 'abandoned')),
    started_at    timestamptz NOT NULL DEFAULT now(),
    copy_since    timestamptz NOT NULL DEFAULT now(),
    last_id       uuid,
    copied        bigint      NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    details       jsonb       NOT NULL DEFAULT '{}'::jsonb
);
-- At most one unfinished migration per target model: a second `migrate` resumes it.
CREATE UNIQUE INDEX IF NOT EXISTS embedding_migrations_open
    ON embedding_migrations (target_model) WHERE status IN ('copying', 'verifying');
-- The catch-up pass of a migration selects rows changed since it started.
CREATE INDEX IF NOT EXISTS memories_updated_at ON memories (updated_at);
