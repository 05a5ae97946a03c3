"""Every operation of ``memoryctl``, declared once (``memoryctl.declaration.declare`` says what a
declaration holds). The command line, the service's HTTP routes and OpenAPI document, and the MCP
tools are generated from this table; ``README.md`` documents the same commands and flags.

Standard library only: the console script's fast path imports it on every call.
"""

from __future__ import annotations

import functools

from memoryctl.declaration import replies as R
from memoryctl.declaration.declare import OneOf, Operation, Param, Requires
from memoryctl.query_terms import COMBINES, DIRECTIONS, MAX_HOPS, MAX_LIMIT, RETRIEVALS

DEFAULT_KIND = "note"  # memoryctl.model.DEFAULT_KIND

OK, FAILED, USAGE = (0, "ok"), (1, "failed (error and hint on stderr)"), (2, "bad input or usage")
PARTIAL = (3, "partial: a store is degraded or behind (the hint says what to run)")
STANDARD = (OK, FAILED, USAGE)

# ---- shared parameters ---------------------------------------------------------------------------
AGENT = Param("agent", "string", "Agent scope (default: the configured default_agent).")
ALL_AGENTS = Param("all_agents", "boolean", "Operator: every agent.", default=False)
ONLY_AGENT = Param("agent", "string", "Only this agent's memories.", short="-a")
JSON = Param("json", "boolean", "Print the result as JSON (the documented contract).", default=False)
EXPLAIN = Param("explain", "boolean", "Show the plan, per-step timings and counts.", default=False)
PROMETHEUS = Param("prometheus", "boolean", "Prometheus text format (textfile collector).", default=False)
# Who ran a maintenance command, recorded with its run: the command line fills them in, so that a
# run through the service is recorded with its caller's trigger (cron) and user, not the service's.
WHO = (
    Param("trigger", "string", "Recorded with the run (cli, cron, …).", fill="trigger", cli=False),
    Param("actor", "string", "Recorded with the run (a user name).", fill="actor", cli=False),
)
OUTBOX_ROWS = (
    Param("rows", "array", "Outbox row ids (from `outbox list`).", items="integer", flag=None, metavar="[ROW]..."),
    Param("all", "boolean", "Every row set aside.", default=False),
)
OUTBOX_PICK = OneOf(
    ("rows", "all"), "name the rows or pass --all (not both)", hint="`memoryctl outbox list` shows the rows"
)
BATCH = Param("batch", "integer", "Memories per embed/upsert batch.", default=512, low=1, high=10_000)


# An agent's write of memories (add, forget): an agent token may run it, an MCP tool, exit 3 when a
# store is behind.
AGENT_WRITE = functools.partial(
    Operation, writes=True, access="agent", exits=(*STANDARD, PARTIAL), outputs=(JSON,), mcp=True
)


# A job: writes, answers a JSON report, and may run for minutes (no reply timeout).
JOB = functools.partial(Operation, writes=True, outputs=(JSON,), long=True)


def _memories(name: str) -> str:
    return f"memoryctl.operations.memories:{name}"


def _maintenance(name: str) -> str:
    return f"memoryctl.operations.maintenance:{name}"


QUERY = Operation(
    "query",
    "One ranked answer from vector similarity, graph traversal and relational/time filters.",
    (
        Param("text", "string", "What to recall (semantic search).", flag=None),
        AGENT,
        Param("all_agents", "boolean", "Operator: search every agent.", default=False),
        Param("entity", "string", "Graph start entity TYPE:NAME."),
        Param("via", "array", "Relationship type to follow, repeatable.", items="string"),
        Param("hops", "integer", "Graph hops (1-3).", default=1, low=1, high=MAX_HOPS),
        Param("direction", "string", "out | in | both.", default="both", choices=DIRECTIONS),
        Param("since", "string", "ISO timestamp or a duration like 7d."),
        Param("until", "string", "ISO timestamp."),
        Param("where", "array", '"field OP value", repeatable.', items="string"),
        Param("combine", "string", "and | or.", default="and", choices=COMBINES),
        Param("limit", "integer", "Hits to return (1-1000).", default=10, low=1, high=MAX_LIMIT),
        Param("threshold", "number", "Minimum cosine similarity.", low=-1.0, high=1.0),
        Param(
            "retrieval",
            "string",
            "hybrid (vector + lexical, fused) | dense | lexical.",
            default="hybrid",
            choices=RETRIEVALS,
        ),
        Param(
            "rerank",
            "boolean",
            "Re-rank the top candidates of a text query with the cross-encoder (docs/retrieval.md)."
            " Default: [query] rerank, off.",
            flag="--rerank",
            off_flag="--no-rerank",
        ),
        Param(
            "half_life",
            "string",
            "Prefer newer memories among comparably relevant ones (within a twentieth of this query's"
            " relevance spread), with this half-life, e.g. 30d; 'off' overrides a configured one."
            " Default: [query] half_life, none (relevance alone).",
        ),
    ),
    _memories("query"),
    reply=R.QueryReply,
    access="agent",
    exits=(*STANDARD, PARTIAL),
    outputs=(JSON, EXPLAIN),
    requires=(Requires("via", "entity", "--via needs --entity (the node to start from)"),),
    mcp=True,
)

OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        QUERY,
        Operation(
            "get",
            "Show one memory as stored in PostgreSQL (the source of truth).",
            (
                Param("id", "string", "The memory's UUID.", required=True, flag=None, metavar="ID"),
                Param("agent", "string", "Only if it belongs to this agent."),
            ),
            _memories("get"),
            reply=R.MemoryReply,
            access="agent",
            exits=(OK, (1, "no such memory, or it failed"), USAGE),
            outputs=(JSON,),
            mcp=True,
        ),
        AGENT_WRITE(
            "add",
            "Store one memory (PostgreSQL first, then the vector store and the graph) and print its id.",
            (
                Param("text", "string", "The memory's text.", required=True, flag=None),
                Param("agent", "string", "Agent namespace (default: config default_agent)."),
                Param("kind", "string", "Kind, e.g. note, dialogue, event.", default=DEFAULT_KIND),
                Param("at", "string", "created_at, ISO 8601 (default: now)."),
                Param("entities", "array", "TYPE:NAME, repeatable.", items="string", flag="--entity"),
                Param(
                    "relations",
                    "array",
                    '"FROM -REL-> TO"; FROM/TO is TYPE:NAME, this or memory:<uuid>.',
                    items="string",
                    flag="--rel",
                ),
                Param("metadata", "object", "key=value (JSON values allowed), repeatable.", flag="--meta", pairs=True),
                Param("id", "string", "Use this UUID (idempotent re-adds).", fill="uuid"),
            ),
            _memories("add"),
            reply=R.Added,
        ),
        JOB(
            "import",
            "Import memories from JSONL; bad lines are reported by number and skipped.",
            (
                Param(
                    "file",
                    "string",
                    "JSONL file, one memory per line ('-' for stdin is not supported).",
                    flag=None,
                ),
                Param("agent", "string", "Put every line in this agent (overrides agent_id)."),
                Param("strict", "boolean", "Refuse the whole file if any line is bad.", default=False),
            ),
            _memories("import_"),
            reply=R.Imported,
            access="agent",
            exits=(OK, FAILED, (2, "bad lines (reported and skipped), or --strict refused the file"), PARTIAL),
            upload="file",
        ),
        AGENT_WRITE(
            "forget",
            "Soft-delete memories: hidden from every query at once, purged later by reconcile.",
            (
                Param("ids", "array", "UUIDs to forget.", required=True, items="string", flag=None, metavar="ID..."),
                Param("agent", "string", "Only within this agent."),
            ),
            _memories("forget"),
            reply=R.Forgotten,
            destructive=True,
        ),
        JOB(
            "sync",
            "Deliver everything pending in the outbox to the vector store and the graph (idempotent).",
            WHO,
            _memories("sync"),
            reply=R.Synced,
            exits=(*STANDARD, (3, "still pending: a store is down or another delivery holds the rows")),
        ),
        Operation(
            "stats",
            "Counts and avg/min/max of a numeric metadata field per time bucket (e.g. a sentiment trend).",
            (
                AGENT,
                ALL_AGENTS,
                Param("bucket", "string", "Bucket width, e.g. 1h, 1d, 1w.", default="1d"),
                Param("since", "string", "ISO timestamp or duration (7d).", default="7d"),
                Param("until", "string", "ISO timestamp (default: now)."),
                Param("metric", "string", "Numeric metadata key to aggregate."),
                Param("kind", "string", "Only memories of this kind."),
            ),
            _memories("stats"),
            reply=R.Stats,
            access="agent",
            outputs=(JSON,),
            mcp=True,
        ),
        Operation(
            "health",
            "Probe every component; exit 0 healthy, 1 unhealthy, 3 degraded.",
            (
                Param("deadline", "number", "Seconds to wait for all probes.", default=1.8, low=0.1, high=60),
                PROMETHEUS,
            ),
            _memories("health"),
            reply=R.Health | R.Prometheus,
            service_status=True,
            access="any",
            exits=((0, "healthy"), (1, "unhealthy"), USAGE, (3, "degraded")),
            outputs=(Param("json", "boolean", "Machine-readable report.", default=False),),
            mcp=True,
        ),
        JOB(
            "init",
            "Create or upgrade the schema (PostgreSQL), the vector collection and graph constraints.",
            (),
            _memories("init"),
            reply=R.Initialised,
            exits=(*STANDARD, (3, "a store is unavailable (initialised when it is back)")),
        ),
        Operation(
            "cypher",
            "Raw Cypher for power users, in a READ transaction (write clauses are refused).",
            (
                Param(
                    "statement",
                    "string",
                    "A read-only Cypher query; $agent_id is bound to the agent.",
                    required=True,
                    flag=None,
                ),
                Param("params", "object", "k=v (JSON values allowed), repeatable.", flag="--param", pairs=True),
                AGENT,
            ),
            _maintenance("cypher"),
            reply=R.Rows,
            outputs=(JSON,),
        ),
        Operation(
            "runs",
            "List recent maintenance runs (sync, reconcile, migrate, reembed, nightly).",
            (
                Param("command", "string", "Only runs of this command."),
                Param("limit", "integer", "Runs to list (1-1000).", default=20, low=1, high=1000),
            ),
            _maintenance("runs"),
            reply=R.Rows,
            outputs=(JSON,),
        ),
        Operation(
            "reconcile",
            "Compare PostgreSQL, the vector store and the graph: orphans, missing, stale, purge-due.",
            (
                Param("repair", "boolean", "Fix what is found (idempotent). Default: report only.", default=False),
                ONLY_AGENT,
                *WHO,
            ),
            _maintenance("reconcile"),
            reply=R.Reconciled,
            writes=True,
            exits=(
                (0, "nothing left to do"),
                FAILED,
                USAGE,
                (3, "drift found and not repaired, or a store skipped"),
            ),
            outputs=(Param("json", "boolean", "Machine-readable report.", default=False),),
            long=True,
        ),
        JOB(
            "migrate",
            "Re-embed every memory into a new model's collection, verify, swap atomically; resumable.",
            (
                Param(
                    "to_model",
                    "string",
                    "Target embedder: KIND, KIND:MODEL, or key=value list "
                    "(kind=hash,dim=256 / kind=http,model=BAAI/bge-m3,url=http://10.77.0.3:8001).",
                ),
                BATCH,
                Param("rollback", "boolean", "Swap back to the previous model.", default=False),
                Param("cleanup", "boolean", "Drop retired collections past --grace.", default=False),
                Param("abandon", "boolean", "Give up an unfinished migration.", default=False),
                Param("grace", "string", "Cleanup keeps retired collections this long.", default="7d"),
                Param("sample", "integer", "Verification queries.", default=50, low=0, high=10_000),
                Param("min_recall", "number", "Refuse the swap below this self-recall@10.", low=0.0, high=1.0),
                *WHO,
            ),
            _maintenance("migrate"),
            reply=R.Migrated,
            one_of=(
                OneOf(
                    ("to_model", "rollback", "cleanup", "abandon"),
                    "give exactly one of --to-model, --rollback, --cleanup, --abandon",
                    hint="e.g. memoryctl migrate --to-model kind=hash,dim=256",
                ),
            ),
            exits=(*STANDARD, (3, "stopped at verification (nothing swapped)")),
        ),
        JOB(
            "reembed",
            "Re-embed in place, in the active collection, memories whose text changed since embedding.",
            (
                Param("changed", "boolean", "Only memories whose text changed (content hash).", default=False),
                ONLY_AGENT,
                BATCH,
                *WHO,
            ),
            _maintenance("reembed"),
            reply=R.Reembedded,
        ),
        JOB(
            "nightly",
            "Train → gate → promote LoRA adapters, re-embed changed texts, reconcile, record the run.",
            WHO,
            _maintenance("nightly"),
            reply=R.Nightly,
        ),
        Operation(
            "feedback",
            "Record whether a recalled memory was useful: the embedding LoRA learns from these pairs.",
            (
                Param("query_id", "string", "query_id from `memoryctl query --json`.", required=True, flag=None),
                Param("memory_id", "string", "The recalled memory.", required=True, flag=None),
                Param(
                    "useful",
                    "boolean",
                    "Was the recall useful? (--useful or --not-useful)",
                    required=True,
                    flag="--useful",
                    off_flag="--not-useful",
                ),
            ),
            _maintenance("feedback"),
            reply=R.Recorded,
            writes=True,
        ),
        Operation(
            "adapters",
            "List LoRA adapter versions of a kind, roll the served one back to the previous version, or"
            " load the active generation adapter into vLLM again (after vLLM restarted).",
            (
                Param(
                    "kind",
                    "string",
                    "embedding | generation",
                    required=True,
                    flag=None,
                    choices=("embedding", "generation"),
                ),
                Param("rollback", "boolean", "Serve the previous version again.", default=False),
                Param(
                    "serve_active",
                    "boolean",
                    "Load the active generation adapter into vLLM if it does not list it (a restart forgets it).",
                    default=False,
                ),
                Param(
                    "wait",
                    "boolean",
                    "With --serve-active: first wait until vLLM answers, up to [nightly] vllm_ready_s (for the"
                    " memoryctl-adapter-serve unit, which runs it as vllm@generate starts).",
                    default=False,
                ),
            ),
            _maintenance("adapters"),
            reply=R.Rows,
            requires=(
                Requires(
                    "wait",
                    "serve_active",
                    "--wait is for --serve-active",
                    hint="memoryctl adapters generation --serve-active --wait",
                ),
            ),
            writes=True,
            outputs=(JSON,),
        ),
        Operation(
            "backup status",
            "Per store: the newest backup, the newest restorable point, sizes. Exit 0 fresh, 3 stale, 1 unreadable.",
            (PROMETHEUS,),
            _maintenance("backup_status"),
            reply=R.Backups | R.Prometheus,
            exits=((0, "fresh"), (1, "unreadable"), USAGE, (3, "stale")),
            outputs=(Param("json", "boolean", "Machine-readable report.", default=False),),
        ),
        JOB(
            "backup qdrant",
            "Snapshot every Qdrant collection (one file per shard) and ship the set to the snapshot target.",
            WHO,
            _maintenance("backup_qdrant"),
            reply=R.Document,
            profiles=("cluster",),
        ),
        JOB(
            "restore qdrant",
            "Restore Qdrant from a snapshot set, then catch up with PostgreSQL. Exit 3 if drift is left.",
            (
                Param("set", "string", "Snapshot set (default: the newest complete)."),
                Param(
                    "catch_up",
                    "boolean",
                    "Afterwards deliver the outbox and what changed since the snapshot (sync, then reconcile"
                    " --repair of the vector store).",
                    default=True,
                    off_flag="--no-catch-up",
                ),
                *WHO,
            ),
            _maintenance("restore_qdrant"),
            reply=R.Document,
            profiles=("cluster",),
            exits=(*STANDARD, (3, "drift left after the catch-up")),
        ),
        JOB(
            "rebuild graph",
            "Rebuild the graph store from PostgreSQL (idempotent; writes may continue meanwhile).",
            (
                Param("batch", "integer", "Memories per read/write batch.", default=1000, low=1, high=10_000),
                Param(
                    "prune",
                    "boolean",
                    "Remove graph memories PostgreSQL does not have.",
                    default=True,
                    off_flag="--no-prune",
                ),
                *WHO,
            ),
            _maintenance("rebuild_graph"),
            reply=R.Document,
        ),
        Operation(
            "outbox list",
            "The deliveries set aside after failing alone: which memory, which store, how often, and the error.",
            (Param("limit", "integer", "Rows to list.", default=1000, low=1, high=100_000),),
            _maintenance("outbox_list"),
            reply=R.Rows,
            outputs=(JSON,),
        ),
        Operation(
            "outbox retry",
            "Put rows set aside back in the queue (after fixing what made them fail).",
            OUTBOX_ROWS,
            _maintenance("outbox_retry"),
            reply=R.Retried,
            one_of=(OUTBOX_PICK,),
            writes=True,
        ),
        Operation(
            "outbox drop",
            "Give up on rows set aside: that store will not get those memories (reconcile reports them).",
            OUTBOX_ROWS,
            _maintenance("outbox_drop"),
            reply=R.Dropped,
            one_of=(OUTBOX_PICK,),
            destructive=True,
            writes=True,
        ),
        Operation(
            "demo",
            "Load a small sample of memories and run example queries (vector, graph, relational, or, stats).",
            (),
            _maintenance("demo"),
            reply=R.Document,
            writes=True,
            outputs=(Param("explain", "boolean", "Also print each query's plan.", default=False),),
            long=True,
        ),
        Operation(
            "token issue",
            "Issue a bearer token bound to one agent, or an operator token (--operator), for HTTP, MCP"
            " and the console; printed once, kept hashed.",
            (
                Param("agent", "string", "The agent the token may read and write.", flag=None, metavar="AGENT"),
                Param(
                    "operator",
                    "boolean",
                    "An operator token: every agent and operation (the console records its actions with its name).",
                    default=False,
                ),
                Param("name", "string", "A label to tell tokens apart (default: the agent, or operator)."),
            ),
            _maintenance("token_issue"),
            reply=R.TokenIssued | R.OperatorTokenIssued,
            one_of=(
                OneOf(
                    ("agent", "operator"),
                    "name the token's agent or pass --operator (not both)",
                    hint="memoryctl token issue support-bot, or memoryctl token issue --operator --name alice",
                ),
            ),
            writes=True,
            outputs=(JSON,),
        ),
        Operation(
            "token list",
            "The tokens issued, agent and operator (their ids, agents and labels; never the tokens).",
            (),
            _maintenance("token_list"),
            reply=list[R.TokenRow | R.OperatorTokenRow],
            outputs=(JSON,),
        ),
        Operation(
            "token revoke",
            "Revoke issued tokens by id: refused from the next request on (console sessions included).",
            (
                Param(
                    "ids", "array", "Token ids from `memoryctl token list`.", required=True, items="string", flag=None
                ),
            ),
            _maintenance("token_revoke"),
            reply=R.Revoked,
            writes=True,
            exits=(OK, (1, "no such token"), USAGE),
            outputs=(JSON,),
        ),
        Operation(
            "config show",
            "Print the effective configuration (file + environment + flags), secrets masked.",
            (),
            "memoryctl.cli.local:config_show",
            reply=R.Document,
            local=True,
            outputs=(JSON,),
        ),
        Operation(
            "serve",
            "Hold the model and the stores open and answer the CLI's operations (Unix socket, HTTP, MCP).",
            (
                Param(
                    "http",
                    "string",
                    "Also answer HTTP on HOST:PORT (loopback or the mesh address); token required.",
                ),
                Param("verbose", "boolean", "Log every request.", default=False, short="-v"),
            ),
            "memoryctl.cli.local:serve",
            local=True,
        ),
        Operation(
            "mcp",
            "Answer MCP over stdin/stdout for a local agent: through the running service, else in-process.",
            (Param("agent", "string", "The agent the tools default to (default: config default_agent)."),),
            "memoryctl.cli.local:mcp",
            local=True,
        ),
    )
}

#: The command groups of the command line (``memoryctl backup status``) and their help.
GROUPS = {
    "backup": "Backups: what is kept and how old it is; Qdrant snapshot sets.",
    "restore": "Restore a store derived from PostgreSQL.",
    "rebuild": "Rebuild a store from PostgreSQL.",
    "outbox": "Deliveries set aside after failing alone: list, retry, drop.",
    "token": "Issued tokens: issue, list, revoke (HTTP, MCP and console callers: one agent, or --operator).",
    "config": "Inspect the effective configuration.",
}
