-- Core tables. PostgreSQL is the source of truth; Qdrant and Neo4j are projections fed by the outbox.
-- The primary key includes created_at because a TimescaleDB hypertable requires every unique
-- index to contain the partitioning column; id uniqueness is kept by the writer (see records.py)
-- and, on the plain-table path, by the unique index created in 0002_plain.sql.
CREATE TABLE IF NOT EXISTS memories (
    id           uuid        NOT NULL,
    agent_id     text        NOT NULL,
    text         text        NOT NULL,
    kind         text        NOT NULL,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    content_hash text        NOT NULL,
    metadata     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    entities     jsonb       NOT NULL DEFAULT '[]'::jsonb,
    relations    jsonb       NOT NULL DEFAULT '[]'::jsonb,
    deleted_at   timestamptz,
    tsv          tsvector GENERATED ALWAYS AS (to_tsvector('simple', text)) STORED,
    PRIMARY KEY (id, created_at)
);
CREATE INDEX IF NOT EXISTS memories_agent_created ON memories (agent_id, created_at DESC);
CREATE INDEX IF NOT EXISTS memories_tsv ON memories USING gin (tsv);
CREATE INDEX IF NOT EXISTS memories_metadata ON memories USING gin (metadata jsonb_path_ops);
CREATE INDEX IF NOT EXISTS memories_deleted ON memories (deleted_at) WHERE deleted_at IS NOT NULL;

-- Access/recall/feedback events: a time series (hypertable with compression/retention when Timescale is present).
CREATE TABLE IF NOT EXISTS memory_events (
    time      timestamptz NOT NULL DEFAULT now(),
    agent_id  text        NOT NULL,
    memory_id uuid,
    query_id  uuid,
    event     text        NOT NULL,
    payload   jsonb       NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX IF NOT EXISTS memory_events_agent_time ON memory_events (agent_id, time DESC);
CREATE INDEX IF NOT EXISTS memory_events_query ON memory_events (query_id) WHERE query_id IS NOT NULL;

-- Pending deliveries to the secondary stores. Rows carry no payload: delivery reads the memory's
-- current state, so delivering twice or out of order converges to the same result.
CREATE TABLE IF NOT EXISTS outbox (
    id              bigserial   PRIMARY KEY,
    memory_id       uuid        NOT NULL,
    target          text        NOT NULL CHECK (target IN ('vector', 'graph')),
    op              text        NOT NULL CHECK (op IN ('upsert', 'purge')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text,
    next_attempt_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS outbox_target_next ON outbox (target, next_attempt_at, id);
CREATE INDEX IF NOT EXISTS outbox_memory ON outbox (memory_id);

-- Embedding models and LoRA adapters known to this stack.
CREATE TABLE IF NOT EXISTS model_versions (
    id           bigserial   PRIMARY KEY,
    kind         text        NOT NULL CHECK (kind IN ('embedding', 'lora-embedding', 'lora-generation')),
    model_id     text        NOT NULL UNIQUE,
    dim          integer,
    base_model   text,
    artifact     text,
    status       text        NOT NULL DEFAULT 'registered'
                             CHECK (status IN ('registered', 'active', 'retired', 'rejected')),
    manifest     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    activated_at timestamptz
);

-- Every maintenance run (sync, reconcile, migrate, reembed, nightly): what, when, who, outcome.
CREATE TABLE IF NOT EXISTS maintenance_runs (
    id          bigserial   PRIMARY KEY,
    command     text        NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    status      text        NOT NULL DEFAULT 'running'
                            CHECK (status IN ('running', 'ok', 'failed', 'skipped', 'partial')),
    trigger     text        NOT NULL DEFAULT 'cli',
    actor       text,
    counts      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    error       text,
    details     jsonb       NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX IF NOT EXISTS maintenance_runs_command ON maintenance_runs (command, started_at DESC);
