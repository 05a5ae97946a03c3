"""The operations the CLI and the service share: parameters in, the ``--json`` document out.

One table (``OPERATIONS``) says, per operation, which parameters it takes (name, JSON type,
whether required, what it means) and runs it against a ``MemoryClient``. The CLI builds the
parameters from its flags and either calls the running service or ``run`` in-process; the service
validates a request body against the same table; the OpenAPI description is generated from it. So
the two paths cannot drift: they are one code path with a socket in the middle or not.

A ``Reply`` is what a command prints: ``data`` (exactly its ``--json`` output), the exit code, and
the ``warnings`` it writes to stderr in every output mode. Human renderings are drawn from
``data`` by the CLI, never from objects only one path has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from memoryctl.errors import ExitCode, InputError
from memoryctl.serve.wire import Reply

if TYPE_CHECKING:
    from memoryctl.client import MemoryClient, WriteOutcome

JsonType = Literal["string", "integer", "number", "boolean", "array", "object"]
_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}
BAD_LINES_SHOWN = 50


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    type: JsonType
    description: str
    required: bool = False
    items: JsonType | None = None  # element type of an array


Progress = Callable[[int], None]
Runner = Callable[["MemoryClient", dict[str, Any], Path | None, Progress | None], Reply]


@dataclass(frozen=True, slots=True)
class Operation:
    name: str
    summary: str
    params: tuple[Param, ...]
    run: Runner
    upload: bool = False  # the request body is a JSONL file, the parameters travel in the query string
    read_only: bool = True

    def validate(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Check names and JSON types; a bad request is an ``InputError`` that names the parameter."""
        known = {p.name: p for p in self.params}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise InputError(
                f"{self.name}: unknown parameter(s) {', '.join(unknown)}",
                hint=f"{self.name} takes {', '.join(known) or 'no parameters'}",
            )
        out: dict[str, Any] = {}
        for p in self.params:
            value = raw.get(p.name)
            if value is None:
                if p.required:
                    raise InputError(f"{self.name}: parameter {p.name!r} is required")
                continue
            if not _is(value, p.type) or (p.type == "array" and p.items and not all(_is(v, p.items) for v in value)):
                of = f" of {p.items}" if p.items else ""
                raise InputError(f"{self.name}: parameter {p.name!r} must be {p.type}{of}, not {value!r}")
            out[p.name] = value
        return out


def _is(value: Any, kind: JsonType) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _PY_TYPES[kind])


def run(
    client: MemoryClient,
    name: str,
    params: Mapping[str, Any],
    *,
    upload: Path | None = None,
    progress: Progress | None = None,
) -> Reply:
    """Validate and run one operation in this process (the service calls this too)."""
    op = OPERATIONS.get(name)
    if op is None:
        raise InputError(f"no operation {name!r}", hint=f"one of {', '.join(OPERATIONS)}")
    return op.run(client, op.validate(params), upload, progress)


# ---- shared pieces ------------------------------------------------------------------------------
def _agent(client: MemoryClient, p: dict[str, Any]) -> str | None:
    from memoryctl.model import validate_agent_id

    if p.get("all_agents"):
        return None
    return validate_agent_id(p["agent"]) if p.get("agent") else client.settings.default_agent


def _only_agent(p: dict[str, Any]) -> str | None:
    """An optional restriction (get, forget): no default agent."""
    from memoryctl.model import validate_agent_id

    return validate_agent_id(p["agent"]) if p.get("agent") else None


def pending_warning(outcome: WriteOutcome) -> Reply:
    """What is stored but not yet searchable: exit 3 and the message when a store is behind."""
    if not outcome.degraded:
        return Reply(None)
    stores = ", ".join(outcome.degraded)
    reasons = "; ".join(f"{t}: {e}" for t, e in outcome.delivery.failed.items())
    return Reply(
        None,
        int(ExitCode.PARTIAL),
        [
            f"stored in PostgreSQL; delivery to {stores} is pending ({reasons or 'will retry'}).",
            "hint: nothing is lost — run `memoryctl sync` once the store is back",
        ],
    )


# ---- reads -------------------------------------------------------------------------------------
QUERY_PARAMS = (
    Param("text", "string", "What to recall (semantic search)."),
    Param("agent", "string", "Agent scope (default: the service's default_agent)."),
    Param("all_agents", "boolean", "Operator: search every agent."),
    Param("entity", "string", "Graph start entity TYPE:NAME."),
    Param("via", "array", "Relationship types to follow.", items="string"),
    Param("hops", "integer", "Graph hops (1-3), default 1."),
    Param("direction", "string", "out | in | both (default)."),
    Param("since", "string", "ISO timestamp or a duration like 7d."),
    Param("until", "string", "ISO timestamp."),
    Param("where", "array", '"field OP value" filters.', items="string"),
    Param("combine", "string", "and (default) | or."),
    Param("limit", "integer", "Hits, 1-1000 (default 10)."),
    Param("threshold", "number", "Minimum cosine similarity."),
    Param("retrieval", "string", "hybrid (default: vector + lexical, fused) | dense | lexical."),
    Param(
        "half_life",
        "string",
        "Prefer newer memories among comparably relevant ones, e.g. 30d; 'off' overrides a configured"
        " one. Default: [query] half_life, none (relevance alone).",
    ),
)


def _query(client: MemoryClient, p: dict[str, Any], _upload: Path | None, _progress: Progress | None) -> Reply:
    from memoryctl.model import EntityRef, parse_datetime, parse_half_life
    from memoryctl.query.spec import GraphFilter, MemoryQuery, Where, parse_since

    if p.get("via") and not p.get("entity"):
        raise InputError("--via needs --entity (the node to start from)")
    combine = p.get("combine", "and")
    if combine not in ("and", "or"):
        raise InputError(f"--combine must be and or or, not {combine!r}")
    hops, limit = p.get("hops", 1), p.get("limit", 10)
    if not 1 <= hops <= 3:
        raise InputError(f"--hops must be 1-3, not {hops}")
    if not 1 <= limit <= 1000:
        raise InputError(f"--limit must be 1-1000, not {limit}")
    entity = p.get("entity")
    graph = (
        GraphFilter(EntityRef.parse(entity), tuple(p.get("via") or ()), hops, p.get("direction", "both"))
        if entity
        else None
    )
    # "off" overrides a configured half-life; none given: the agent's configured one, if any.
    half_life = parse_half_life(p["half_life"]) if p.get("half_life") else None
    q = MemoryQuery(
        text=p.get("text"),
        agent_id=_agent(client, p),
        all_agents=bool(p.get("all_agents")),
        since=parse_since(p["since"]) if p.get("since") else None,
        until=parse_datetime(p["until"]) if p.get("until") else None,
        graph=graph,
        where=[Where.parse(w) for w in p.get("where") or []],
        combine=combine,
        limit=limit,
        threshold=p.get("threshold"),
        retrieval=p.get("retrieval", "hybrid"),
        half_life=half_life,
        decay=half_life is not None or not p.get("half_life"),
    )
    result = client.query(q)
    reply = Reply(result.as_dict())
    if result.degraded:
        reply.exit_code = int(ExitCode.PARTIAL)
        reply.warnings = [f"degraded: {', '.join(result.degraded)}", *(f"  {n}" for n in result.explain["notes"])]
    return reply


def _get(client: MemoryClient, p: dict[str, Any], _upload: Path | None, _progress: Progress | None) -> Reply:
    from memoryctl.model import parse_uuid

    return Reply(client.get(parse_uuid(p["id"]), agent_id=_only_agent(p)).to_json())


def _stats(client: MemoryClient, p: dict[str, Any], _upload: Path | None, _progress: Progress | None) -> Reply:
    from memoryctl.model import parse_datetime, parse_duration
    from memoryctl.query.spec import parse_since

    bucket, metric, kind = p.get("bucket", "1d"), p.get("metric"), p.get("kind")
    width = parse_duration(bucket)
    if width.total_seconds() < 60:
        raise InputError("--bucket must be at least 1m")
    start = parse_since(p.get("since", "7d"))
    end = parse_datetime(p["until"]) if p.get("until") else datetime.now(UTC)
    if (end - start) / width > 10_000:
        raise InputError("that is more than 10,000 buckets", hint="use a wider --bucket or a shorter range")
    agent_id = _agent(client, p)
    rows = client.stats(agent_id=agent_id, since=start, until=end, width=width, metric=metric, kind=kind)
    buckets = [
        {
            "bucket": r["bucket"].isoformat(),
            "count": r["count"],
            **({"n": r["n_metric"] or 0, "avg": r["avg"], "min": r["min"], "max": r["max"]} if metric else {}),
        }
        for r in rows
    ]
    return Reply(
        {"agent_id": agent_id, "bucket_s": width.total_seconds(), "metric": metric, "kind": kind, "buckets": buckets}
    )


def _health(client: MemoryClient, p: dict[str, Any], _upload: Path | None, _progress: Progress | None) -> Reply:
    report = client.health(deadline_s=p.get("deadline", 1.8))
    return Reply(report.as_dict(), report.exit_code)


# ---- writes ------------------------------------------------------------------------------------
def _add(client: MemoryClient, p: dict[str, Any], _upload: Path | None, _progress: Progress | None) -> Reply:
    import uuid

    from memoryctl.model import (
        DEFAULT_KIND,
        EntityRef,
        Memory,
        parse_datetime,
        parse_uuid,
        relation_from_spec,
        utcnow,
        validate_meta_key,
    )

    mid = parse_uuid(p["id"]) if p.get("id") else uuid.uuid4()
    memory = Memory(
        id=mid,
        text=p["text"],
        agent_id=_agent(client, p) or client.settings.default_agent,
        kind=p.get("kind", DEFAULT_KIND),
        created_at=parse_datetime(p["at"]) if p.get("at") else utcnow(),
        metadata={validate_meta_key(k): v for k, v in (p.get("metadata") or {}).items()},
        entities=[EntityRef.parse(e) for e in p.get("entities") or []],
        relations=[relation_from_spec(r, mid) for r in p.get("relations") or []],
    )
    outcome = client.add([memory])
    reply = pending_warning(outcome)
    reply.data = {"id": str(mid), "pending": outcome.pending}
    return reply


def _import(client: MemoryClient, p: dict[str, Any], upload: Path | None, progress: Progress | None) -> Reply:
    if upload is None:
        raise InputError("import needs a JSONL body")
    strict = bool(p.get("strict"))
    outcome = client.import_jsonl(upload, agent_id=p.get("agent"), strict=strict, progress=progress)
    data = {"file": p.get("file") or str(upload), "strict": strict, **outcome.as_dict()}
    if strict and outcome.invalid:
        return Reply(
            data,
            int(ExitCode.USAGE),
            [
                f"error: import refused (--strict): {len(outcome.invalid)} invalid line(s); nothing was written",
                "hint: fix the lines listed, or import without --strict to skip them",
            ],
        )
    reply = pending_warning(outcome)
    reply.data = data
    if outcome.invalid and reply.exit_code == ExitCode.OK:
        # Bad input and nothing else: 2, as documented for bad input (3 says a store is behind).
        reply.exit_code = int(ExitCode.USAGE)
        reply.warnings = [
            f"error: {len(outcome.invalid)} invalid line(s) skipped; the others were imported",
            "hint: fix the lines listed (by number) and import the file again: unchanged lines stay as they are",
        ]
    return reply


def _forget(client: MemoryClient, p: dict[str, Any], _upload: Path | None, _progress: Progress | None) -> Reply:
    from memoryctl.model import parse_uuid

    if not p["ids"]:
        raise InputError("forget needs at least one id")
    outcome = client.forget([parse_uuid(i) for i in p["ids"]], agent_id=_only_agent(p))
    reply = pending_warning(outcome)
    reply.data = {"forgotten": [str(i) for i in outcome.ids], "pending": outcome.pending}
    return reply


def _sync(client: MemoryClient, p: dict[str, Any], _upload: Path | None, _progress: Progress | None) -> Reply:
    report, pending = client.sync(trigger=p.get("trigger"), actor=p.get("actor"))
    reply = Reply({**report.as_dict(), "pending": pending})
    if any(pending.values()):
        stores = ", ".join(s for s, n in pending.items() if n)
        # Nothing failed and nothing was delivered: rows another delivery holds (SKIP LOCKED).
        reasons = "; ".join(f"{t}: {e}" for t, e in report.failed.items()) or (
            "another delivery (an import, or memoryctl serve) is writing them now; run sync again when it ends"
        )
        reply.exit_code = int(ExitCode.PARTIAL)
        reply.warnings = [f"still pending for {stores}: {reasons}"]
    return reply


def _init(client: MemoryClient, p: dict[str, Any], _upload: Path | None, _progress: Progress | None) -> Reply:
    result = client.init()
    return Reply(result, int(ExitCode.PARTIAL) if result["degraded"] else int(ExitCode.OK))


OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        Operation(
            "query",
            "One ranked answer: vector similarity, graph traversal, relational/time filters.",
            QUERY_PARAMS,
            _query,
        ),
        Operation(
            "get",
            "One memory as stored in PostgreSQL.",
            (
                Param("id", "string", "The memory's UUID.", required=True),
                Param("agent", "string", "Only if it belongs to this agent."),
            ),
            _get,
        ),
        Operation(
            "stats",
            "Counts and avg/min/max of a numeric metadata field per time bucket.",
            (
                Param("agent", "string", "Agent scope (default: the service's default_agent)."),
                Param("all_agents", "boolean", "Every agent."),
                Param("bucket", "string", "Bucket width, e.g. 1h, 1d (default 1d)."),
                Param("since", "string", "ISO timestamp or duration (default 7d)."),
                Param("until", "string", "ISO timestamp (default now)."),
                Param("metric", "string", "Numeric metadata key to aggregate."),
                Param("kind", "string", "Only memories of this kind."),
            ),
            _stats,
        ),
        Operation(
            "health",
            "Every component probed under a deadline (exit code 0 / 1 / 3).",
            (Param("deadline", "number", "Seconds to wait for all probes (default 1.8)."),),
            _health,
        ),
        Operation(
            "add",
            "Store one memory (PostgreSQL first, then the vector store and the graph).",
            (
                Param("text", "string", "The memory's text.", required=True),
                Param("agent", "string", "Agent namespace (default: the service's default_agent)."),
                Param("kind", "string", "Kind, e.g. note, dialogue, event."),
                Param("at", "string", "created_at, ISO 8601 (default now)."),
                Param("entities", "array", "TYPE:NAME entities.", items="string"),
                Param("relations", "array", '"FROM -REL-> TO" relations.', items="string"),
                Param("metadata", "object", "Metadata (JSON values)."),
                Param("id", "string", "Use this UUID (idempotent re-adds)."),
            ),
            _add,
            read_only=False,
        ),
        Operation(
            "import",
            "Import a JSONL body, one memory per line; bad lines reported and skipped.",
            (
                Param("agent", "string", "Put every line in this agent."),
                Param("strict", "boolean", "Refuse the whole body if any line is bad."),
                Param("file", "string", "A name for the source, echoed in the reply."),
            ),
            _import,
            upload=True,
            read_only=False,
        ),
        Operation(
            "forget",
            "Soft-delete memories: hidden at once, purged later by reconcile.",
            (
                Param("ids", "array", "UUIDs to forget.", required=True, items="string"),
                Param("agent", "string", "Only within this agent."),
            ),
            _forget,
            read_only=False,
        ),
        Operation(
            "sync",
            "Deliver everything pending in the outbox (idempotent).",
            (
                Param("trigger", "string", "Recorded with the run (cli, cron, …)."),
                Param("actor", "string", "Recorded with the run (user name)."),
            ),
            _sync,
            read_only=False,
        ),
        Operation(
            "init",
            "Create or upgrade the schema, the vector collection and the graph constraints.",
            (),
            _init,
            read_only=False,
        ),
    )
}
