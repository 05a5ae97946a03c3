"""What every operation answers: its reply type, declared once beside its parameters
(``memoryctl.declaration.table``). The OpenAPI 200 schemas, the MCP tools' ``outputSchema`` and
the README's contract table are generated from these (``memoryctl.declaration.shape``); the
operations build them and ``shape.dump`` writes the ``--json`` document from them.

A field typed ``dict[str, Any]`` or ``Any`` is a document whose keys depend on the store or the
step that wrote it (a health component, a nightly step's figures); its description says what it holds.
Standard library only (the console script's fast path imports the table).
"""

from __future__ import annotations

from typing import Any

from memoryctl.declaration.shape import Shape, field

ROWS = "per store (vector, graph): memories awaiting delivery"


class Entity(Shape):
    """A graph entity: TYPE:NAME."""

    type: str = field("the entity's type, e.g. User")
    name: str = field("the entity's name, e.g. Alice")


class Hit(Shape):
    """One memory of a query's answer, with its scores."""

    id: str = field("the memory's UUID")
    score: float = field("the rank score (higher first)")
    scores: dict[str, float] = field("per signal: vector, lexical, relevance, decay, …")
    text: str = field("the memory's text")
    created_at: str = field("ISO 8601")
    kind: str = field("note, dialogue, event, …")
    agent_id: str = field("the agent the memory belongs to")
    entities: list[Entity] = field("the entities it mentions")
    metadata: dict[str, Any] = field("its key=value metadata")
    relationships: list[dict[str, Any]] = field("graph edges that led to it: type, direction, node")
    sources: list[str] = field("the stores that found it: postgres, qdrant, neo4j")


class Step(Shape):
    """One store call or engine step of a query (``--explain``)."""

    name: str = field("what the step did")
    store: str = field("the store it asked")
    detail: dict[str, Any] = field("its parameters and figures")
    ms: float = field("milliseconds")
    rows_in: int | None = field("rows it was given")
    rows_out: int | None = field("rows it returned")
    status: str = field("ok, skipped or failed")
    error: str | None = field("why it failed")


class Explain(Shape):
    """The plan that ran and its steps."""

    plan: str = field("the plan, with its runtime figures")
    query: dict[str, Any] = field("the query as the engine read it")
    steps: list[Step] = field("every store call, in order")
    total_ms: float = field("milliseconds, the whole query")
    notes: list[str] = field("what the planner chose and why (a degraded store, a fallback)")


class QueryReply(Shape):
    """One ranked answer."""

    query_id: str = field("this query's UUID (for `memoryctl feedback`)")
    hits: list[Hit] = field("the ranked memories, best first")
    degraded: list[str] = field("stores that did not answer: the answer is partial (exit 3)")
    explain: Explain = field("the plan, per-step timings and counts")


class MemoryReply(Shape):
    """One memory as stored in PostgreSQL."""

    id: str = field("the memory's UUID")
    agent_id: str = field("the agent it belongs to")
    text: str = field("its text")
    kind: str = field("note, dialogue, event, …")
    created_at: str = field("ISO 8601")
    updated_at: str = field("ISO 8601, last change")
    content_hash: str = field("hash of the text (what reembed --changed compares)")
    metadata: dict[str, Any] = field("key=value metadata")
    entities: list[Entity] = field("the entities it mentions")
    relations: list[dict[str, Any]] = field("its relations: from, type, to")
    deleted_at: str | None = field("ISO 8601 when forgotten (purged later), else null")


class Added(Shape):
    """The memory stored."""

    id: str = field("its UUID")
    pending: dict[str, int] = field(ROWS)


class Forgotten(Shape):
    """The memories forgotten (hidden at once, purged by reconcile)."""

    forgotten: list[str] = field("their UUIDs")
    pending: dict[str, int] = field(ROWS)


class Delivery(Shape):
    """What one delivery of the outbox did."""

    delivered: dict[str, int] = field("per store: memories delivered")
    failed: dict[str, str] = field("per store: why its delivery failed")
    seconds: float = field("how long it took")


class BadLine(Shape):
    """A line of an import that was skipped."""

    line: int = field("its number, from 1")
    error: str = field("what is wrong with it")


class Imported(Shape):
    """What an import did."""

    file: str = field("the file imported")
    strict: bool = field("--strict: any bad line refuses the file")
    inserted: int = field("new memories")
    updated: int = field("memories whose content changed")
    unchanged: int = field("lines equal to what is stored")
    invalid: list[BadLine] = field("the lines skipped, by number")
    pending: dict[str, int] = field(ROWS)
    delivery: Delivery = field("the delivery after the import")


class Synced(Shape):
    """What a drain of the outbox did."""

    delivered: dict[str, int] = field("per store: memories delivered")
    failed: dict[str, str] = field("per store: why its delivery failed")
    seconds: float = field("how long it took")
    pending: dict[str, int] = field(ROWS)


class Bucket(Shape):
    """One time bucket of `stats` (n, avg, min, max only with --metric)."""

    bucket: str = field("the bucket's start, ISO 8601")
    count: int = field("memories in it")
    n: int | None = field("memories with the metric", omit_none=True)
    avg: float | None = field("the metric's mean", omit_none=True)
    min: float | None = field("the metric's minimum", omit_none=True)
    max: float | None = field("the metric's maximum", omit_none=True)


class Stats(Shape):
    """Counts and a numeric metadata field per time bucket."""

    agent_id: str | None = field("the agent (null: every agent)")
    bucket_s: float = field("the bucket width in seconds")
    metric: str | None = field("the metadata field summarised (--metric)")
    kind: str | None = field("only this kind (--kind)")
    buckets: list[Bucket] = field("oldest first")


class Health(Shape):
    """Every component of the stack (exit 0 healthy, 1 unhealthy, 3 degraded)."""

    status: str = field("ok, degraded or down")
    version: str = field("memoryctl's version")
    checked_at: str = field("ISO 8601")
    seconds: float = field("how long the probes took")
    components: dict[str, dict[str, Any]] = field(
        "per component: status, latency_ms, error and what the probe reports (docs/operations.md)"
    )


class Prometheus(Shape):
    """The report in Prometheus text format (--prometheus)."""

    prometheus: str = field("text exposition format, for the textfile collector")


class Initialised(Shape):
    """What `init` set up."""

    migrations_applied: list[dict[str, Any]] = field("schema migrations applied now (empty: up to date)")
    schema: list[dict[str, Any]] = field("the schema's migrations: version, variant")
    vector_model: str | None = field("the active embedding model (null: no vector store)")
    degraded: dict[str, str] = field("per store not reached: why (exit 3)")
    graph: bool = field("the graph store is there")


class StoreDrift(Shape):
    """One derived store compared with PostgreSQL."""

    scanned: int = field("ids compared")
    orphan: int = field("in the store, not in PostgreSQL")
    missing: int = field("in PostgreSQL, not in the store")
    stale: int = field("content hash or model differs")
    pending: int = field("awaiting delivery (not drift)")
    raced: int = field("changed while compared (not drift)")
    repaired: int = field("fixed with --repair")
    samples: dict[str, list[str]] = field("a few ids per finding")


class Reconciled(Shape):
    """The three stores compared (and repaired with --repair)."""

    agent_id: str | None = field("only this agent (null: every agent)")
    repair: bool = field("--repair")
    drift: int = field("findings")
    unrepaired: int = field("findings left after --repair")
    postgres: dict[str, int] = field("scanned: rows read")
    stores: dict[str, StoreDrift] = field("per derived store")
    purge_due: int = field("forgotten memories past their grace period")
    purged: int = field("of those, purged now")
    purge_samples: list[str] = field("a few of their ids")
    model: dict[str, Any] = field("the embedding model of PostgreSQL and of the collection")
    skipped: dict[str, str] = field("per store not compared: why")
    delivery: Delivery = field("the delivery run first")
    errors: list[str] = field("what failed")
    seconds: float = field("how long it took")
    ids_per_s: float = field("ids compared per second")


class Pipeline(Shape):
    """The embed/upsert pipeline's figures."""

    embedded: int = field("memories embedded")
    removed: int = field("points removed")
    batches: int = field("batches")
    embed_s: float = field("seconds embedding")
    upsert_s: float = field("seconds writing")
    wait_s: float = field("seconds waiting")


class Migrated(Shape):
    """A model migration, rollback, cleanup or abandon."""

    action: str = field("migrate, rollback, cleanup or abandon")
    source_model: str | None = field("the model served before")
    target_model: str | None = field("the model migrated to")
    status: str = field("started, swapped, verify-failed, …")
    resumed_from: int = field("memories already copied by an earlier run")
    copied: int = field("memories copied now")
    caught_up: int = field("writes made meanwhile, caught up")
    removed: int = field("points removed")
    verify: dict[str, Any] = field("self-recall@10 and the sample")
    swapped: bool = field("the alias points at the new collection")
    dropped: list[str] = field("collections dropped (cleanup)")
    kept: list[dict[str, Any]] = field("retired collections kept (within --grace)")
    config_hint: str | None = field("what to put in the configuration")
    pipeline: Pipeline = field("the re-embed's figures")
    phases: dict[str, float] = field("seconds per phase")
    seconds: float = field("how long it took")
    adapter_registry: dict[str, Any] | None = field("--rollback: what the adapter registry now says", omit_none=True)


class Reembedded(Shape):
    """Memories re-embedded in place."""

    model_id: str = field("the active model")
    scanned: int = field("memories compared")
    changed: int = field("memories whose text changed")
    pipeline: Pipeline = field("the re-embed's figures")
    seconds: float = field("how long it took")


class Nightly(Shape):
    """The night's run (exit 1 when a step failed)."""

    status: str = field("ok or failed")
    window: dict[str, str | None] = field("the feedback window trained on")
    steps: list[dict[str, Any]] = field("per step: name, status, seconds and its figures (docs/nightly.md)")
    seconds: float = field("how long it took")
    pruned: dict[str, Any] | None = field("merged embedding versions removed", omit_none=True)


class Recorded(Shape):
    """Feedback recorded."""

    recorded: bool = field("true")


class Backups(Shape):
    """Per store: the newest backup and restorable point (exit 3 stale, 1 unreadable)."""

    checked_at: str = field("ISO 8601")
    max_age_s: float = field("[backup] max_age in seconds")
    stores: dict[str, dict[str, Any]] = field(
        "per store: method, configured, last_backup, last_backup_age_s, newest_restorable, bytes, count,"
        " stale, archive_failing, error"
    )


class Retried(Shape):
    """Rows put back in the queue."""

    retried: int = field("how many")


class Dropped(Shape):
    """Rows given up on."""

    dropped: int = field("how many")


class TokenIssued(Shape):
    """A new agent token (shown once)."""

    id: str = field("its id (for `token revoke`)")
    agent: str = field("the agent it is bound to")
    name: str = field("its label")
    token: str = field("the bearer token itself: keep it, only its hash is stored")


class TokenRow(Shape):
    """An issued agent token (never the token)."""

    id: str = field("its id")
    agent: str = field("the agent it is bound to")
    name: str = field("its label")
    created_at: str = field("ISO 8601")


class OperatorTokenIssued(Shape):
    """A new operator token (shown once): every agent and operation."""

    id: str = field("its id (for `token revoke`)")
    operator: bool = field("true: an operator token")
    name: str = field("its label (the console records actions with it)")
    token: str = field("the bearer token itself: keep it, only its hash is stored")


class OperatorTokenRow(Shape):
    """An issued operator token (never the token)."""

    id: str = field("its id")
    operator: bool = field("true: an operator token")
    name: str = field("its label")
    created_at: str = field("ISO 8601")


class Revoked(Shape):
    """Agent tokens revoked."""

    revoked: list[str] = field("their ids")


#: A document whose fields come from the store or the step (described, not typed).
Document = dict[str, Any]
Rows = list[dict[str, Any]]
