"""What the memory operations do -- query, get, add, import, forget, sync, stats, health, init --
from their validated parameters (``memoryctl.declaration.table``) to the ``Reply`` every surface
prints: ``data`` is exactly the command's ``--json`` document, ``warnings`` what it writes on stderr
in every output mode, and the exit code. Human renderings are drawn from ``data`` by the command
line (``memoryctl.cli.render``), never from objects only one path has.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memoryctl.declaration import replies as R
from memoryctl.errors import ExitCode, InputError
from memoryctl.operations.reply import Reply

if TYPE_CHECKING:
    from memoryctl.client import MemoryClient
    from memoryctl.operations import Call
    from memoryctl.write.pipeline import WriteOutcome


def agent_of(client: MemoryClient, p: dict[str, Any]) -> str:
    """The agent an operation works on: the one given, else the configured default. Every
    operation that has a default agent takes it from here, so that it is decided in one place."""
    from memoryctl.model import validate_agent_id

    # An empty --agent is refused, not taken for "none given": an unset variable in a script
    # ("--agent $AGENT") must not read or write the default agent's memories.
    return validate_agent_id(p["agent"]) if p.get("agent") is not None else client.settings.default_agent


def agent_scope(client: MemoryClient, p: dict[str, Any]) -> str | None:
    """``agent_of``, or None for ``all_agents`` (an operator's question over every agent)."""
    return None if p.get("all_agents") else agent_of(client, p)


def only_agent(p: dict[str, Any]) -> str | None:
    """An optional restriction (get, forget, reconcile): no default agent."""
    from memoryctl.model import validate_agent_id

    return validate_agent_id(p["agent"]) if p.get("agent") is not None else None


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
def query(client: MemoryClient, call: Call) -> Reply:
    from memoryctl.query.spec import MemoryQuery

    result = client.query(MemoryQuery.from_params(call.params, agent_id=agent_scope(client, call.params)))
    reply = Reply(result.as_dict())
    if result.degraded:
        reply.exit_code = int(ExitCode.PARTIAL)
        reply.warnings = [f"degraded: {', '.join(result.degraded)}", *(f"  {n}" for n in result.explain["notes"])]
    return reply


def get(client: MemoryClient, call: Call) -> Reply:
    from memoryctl.model import parse_uuid

    return Reply(client.get(parse_uuid(call.params["id"]), agent_id=only_agent(call.params)).to_json())


def stats(client: MemoryClient, call: Call) -> Reply:
    from memoryctl.model import parse_datetime, parse_duration
    from memoryctl.query.spec import parse_since

    p = call.params
    width = parse_duration(p["bucket"])
    if width.total_seconds() < 60:
        raise InputError("--bucket must be at least 1m")
    start = parse_since(p["since"])
    end = parse_datetime(p["until"]) if p["until"] else datetime.now(UTC)
    if (end - start) / width > 10_000:
        raise InputError("that is more than 10,000 buckets", hint="use a wider --bucket or a shorter range")
    agent_id, metric = agent_scope(client, p), p["metric"]
    rows = client.stats(agent_id=agent_id, since=start, until=end, width=width, metric=metric, kind=p["kind"])
    # Plain rows, not R.Bucket: with --metric, n/avg/min/max are there even when null.
    buckets: list[Any] = [
        {
            "bucket": r["bucket"].isoformat(),
            "count": r["count"],
            **({"n": r["n_metric"] or 0, "avg": r["avg"], "min": r["min"], "max": r["max"]} if metric else {}),
        }
        for r in rows
    ]
    return Reply(
        R.Stats(agent_id=agent_id, bucket_s=width.total_seconds(), metric=metric, kind=p["kind"], buckets=buckets)
    )


def health(client: MemoryClient, call: Call) -> Reply:
    from memoryctl.health.exposition import prometheus
    from memoryctl.health.probes import HealthReport

    report = client.health(deadline_s=call.params["deadline"])
    if client.settings.serve.required and not call.in_service:
        # Asked in-process: the service that should answer did not (the service adds its own status).
        down = {"status": "down", "error": "memoryctl serve is not answering", "latency_ms": 0.0}
        report = HealthReport(components={**report.components, "serve": down})
    if call.params["prometheus"]:
        return Reply({"prometheus": prometheus(report)}, report.exit_code)
    return Reply(report.as_dict(), report.exit_code)


# ---- writes ------------------------------------------------------------------------------------
def add(client: MemoryClient, call: Call) -> Reply:
    import uuid

    from memoryctl.model import EntityRef, Memory, parse_datetime, parse_uuid, relation_from_spec, utcnow
    from memoryctl.model import validate_meta_key as meta_key

    p = call.params
    mid = parse_uuid(p["id"]) if p["id"] else uuid.uuid4()
    memory = Memory(
        id=mid,
        text=p["text"],
        agent_id=agent_of(client, p),
        kind=p["kind"],
        created_at=parse_datetime(p["at"]) if p["at"] else utcnow(),
        metadata={meta_key(k): v for k, v in (p["metadata"] or {}).items()},
        entities=[EntityRef.parse(e) for e in p["entities"] or []],
        relations=[relation_from_spec(r, mid) for r in p["relations"] or []],
    )
    outcome = client.add([memory])
    reply = pending_warning(outcome)
    reply.data = R.Added(id=str(mid), pending=outcome.pending)
    return reply


def import_(client: MemoryClient, call: Call) -> Reply:
    from pathlib import Path

    p = call.params
    if call.upload is None and not p["file"]:
        raise InputError("import needs a JSONL file", hint="memoryctl import memories.jsonl")
    upload = call.upload or Path(p["file"])
    if not upload.is_file():
        raise InputError(f"{p['file']} is not a readable file")
    advance = None
    if call.progress is not None:
        from memoryctl.write.importer import count_lines

        total, report = count_lines(upload), call.progress
        advance = lambda n: report("importing", n, total)  # noqa: E731
    outcome = client.import_jsonl(upload, agent_id=p["agent"], strict=p["strict"], progress=advance)
    data = {"file": p["file"] or str(upload), "strict": p["strict"], **outcome.as_dict()}
    if p["strict"] and outcome.invalid:
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


def forget(client: MemoryClient, call: Call) -> Reply:
    from memoryctl.model import parse_uuid

    p = call.params
    if not p["ids"]:
        raise InputError("forget needs at least one id")
    outcome = client.forget([parse_uuid(i) for i in p["ids"]], agent_id=only_agent(p))
    reply = pending_warning(outcome)
    reply.data = R.Forgotten(forgotten=[str(i) for i in outcome.ids], pending=outcome.pending)
    return reply


def sync(client: MemoryClient, call: Call) -> Reply:
    report, pending = client.sync(trigger=call.params["trigger"], actor=call.params["actor"])
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


def init(client: MemoryClient, call: Call) -> Reply:
    result = client.init()
    return Reply(result, int(ExitCode.PARTIAL) if result["degraded"] else int(ExitCode.OK))
