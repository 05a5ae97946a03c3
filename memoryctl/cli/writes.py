"""Write commands: add, import, get, forget, sync."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from memoryctl.cli.context import ctx_of
from memoryctl.cli.output import err, out, print_json
from memoryctl.cli.progress import progress_bar
from memoryctl.client import WriteOutcome
from memoryctl.errors import ExitCode, InputError
from memoryctl.importer import count_lines
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


def parse_params(pairs: list[str], flag: str = "--param") -> dict[str, Any]:
    """``key=value``; the value is JSON when it parses as JSON (numbers, booleans), else a string."""
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise InputError(f"{flag} {pair!r} is not key=value", hint=f"e.g. {flag} sentiment=0.7")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        parsed[validate_meta_key(key.strip())] = value
    return parsed


def report_pending(outcome: WriteOutcome) -> int:
    """Say what is stored but not yet searchable; exit 3 when a store is behind."""
    if outcome.degraded:
        stores = ", ".join(outcome.degraded)
        reasons = "; ".join(f"{t}: {e}" for t, e in outcome.delivery.failed.items())
        err.print(
            f"stored in PostgreSQL; delivery to {stores} is pending ({reasons or 'will retry'}).\n"
            "hint: nothing is lost — run `memoryctl sync` once the store is back",
            markup=False,
            highlight=False,
        )
        return int(ExitCode.PARTIAL)
    return int(ExitCode.OK)


def add(
    ctx: typer.Context,
    text: Annotated[str, typer.Argument(help="The memory's text.")],
    agent: Annotated[
        str | None, typer.Option("--agent", help="Agent namespace (default: config default_agent).")
    ] = None,
    kind: Annotated[str, typer.Option(help="Kind, e.g. note, dialogue, event.")] = DEFAULT_KIND,
    at: Annotated[str | None, typer.Option("--at", help="created_at, ISO 8601 (default: now).")] = None,
    entity: Annotated[list[str] | None, typer.Option("--entity", help="TYPE:NAME, repeatable.")] = None,
    rel: Annotated[
        list[str] | None, typer.Option("--rel", help='"FROM -REL-> TO"; FROM/TO is TYPE:NAME, this or memory:<uuid>.')
    ] = None,
    meta: Annotated[
        list[str] | None, typer.Option("--meta", help="key=value (JSON values allowed), repeatable.")
    ] = None,
    id_: Annotated[str | None, typer.Option("--id", help="Use this UUID (idempotent re-adds).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help='Print {"id": …} as JSON.')] = False,
) -> None:
    """Store one memory (PostgreSQL first, then Qdrant and Neo4j) and print its id."""
    c = ctx_of(ctx)
    mid = parse_uuid(id_) if id_ else uuid.uuid4()
    memory = Memory(
        id=mid,
        text=text,
        agent_id=c.agent(agent),
        kind=kind,
        created_at=parse_datetime(at) if at else utcnow(),
        metadata=parse_params(meta or [], "--meta"),
        entities=[EntityRef.parse(e) for e in entity or []],
        relations=[relation_from_spec(r, mid) for r in rel or []],
    )
    outcome = c.client.add([memory])
    if as_json:
        print_json({"id": str(mid), "pending": outcome.pending})
    else:
        out.print(str(mid), markup=False, highlight=False)
    raise typer.Exit(report_pending(outcome))


def import_(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="JSONL file, one memory per line ('-' for stdin is not supported).")],
    agent: Annotated[
        str | None, typer.Option("--agent", help="Put every line in this agent (overrides agent_id).")
    ] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Refuse the whole file if any line is bad.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Import memories from JSONL; bad lines are reported by number and skipped."""
    c = ctx_of(ctx)
    if not file.is_file():
        raise InputError(f"{file} is not a readable file")
    total = count_lines(file) if not as_json and err.is_terminal else None
    with progress_bar(not as_json, "importing", total) as advance:
        outcome = c.client.import_jsonl(file, agent_id=agent, strict=strict, progress=advance)
    if as_json:
        print_json({"file": str(file), "strict": strict, **outcome.as_dict()})
    else:
        table = Table(title=f"import {file}", show_header=False)
        for label, value in (
            ("inserted", outcome.inserted),
            ("updated", outcome.updated),
            ("unchanged", outcome.unchanged),
            ("invalid lines", len(outcome.invalid)),
            *((f"pending {store}", n) for store, n in outcome.pending.items()),
        ):
            table.add_row(label, str(value))
        out.print(table)
        for bad in outcome.invalid[:50]:
            err.print(f"line {bad.line}: {bad.error}", markup=False, highlight=False)
        if len(outcome.invalid) > 50:
            err.print(f"… and {len(outcome.invalid) - 50} more bad lines", markup=False)
    if strict and outcome.invalid:
        err.print("import refused (--strict): nothing was written; fix the lines above", markup=False)
        raise typer.Exit(int(ExitCode.USAGE))
    code = report_pending(outcome)
    if outcome.invalid and code == ExitCode.OK:
        code = int(ExitCode.PARTIAL)
    raise typer.Exit(code)


def get(
    ctx: typer.Context,
    memory_id: Annotated[str, typer.Argument(metavar="ID", help="The memory's UUID.")],
    agent: Annotated[str | None, typer.Option("--agent", help="Only if it belongs to this agent.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show one memory as stored in PostgreSQL (the source of truth)."""
    c = ctx_of(ctx)
    m = c.client.get(parse_uuid(memory_id), agent_id=c.agent(agent) if agent else None)
    data = m.to_json()
    if as_json:
        print_json(data)
        return
    table = Table(show_header=False)
    for key, value in data.items():
        table.add_row(key, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
    out.print(table)


def forget(
    ctx: typer.Context,
    memory_ids: Annotated[list[str], typer.Argument(metavar="ID...", help="UUIDs to forget.")],
    agent: Annotated[str | None, typer.Option("--agent", help="Only within this agent.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Soft-delete memories: hidden from every query at once, purged later by reconcile."""
    c = ctx_of(ctx)
    outcome = c.client.forget([parse_uuid(i) for i in memory_ids], agent_id=c.agent(agent) if agent else None)
    if as_json:
        print_json({"forgotten": [str(i) for i in outcome.ids], "pending": outcome.pending})
    else:
        out.print(f"forgotten: {len(outcome.ids)}", markup=False)
    raise typer.Exit(report_pending(outcome))


def sync(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Deliver everything pending in the outbox to Qdrant and Neo4j (idempotent)."""
    c = ctx_of(ctx)
    report, pending = c.client.sync()
    if as_json:
        print_json({**report.as_dict(), "pending": pending})
    else:
        delivered = ", ".join(f"{c.client.store_name(t)} {n}" for t, n in report.delivered.items())
        waiting = ", ".join(f"{s} {n}" for s, n in pending.items())
        out.print(f"delivered: {delivered}; pending: {waiting}", markup=False)
    if any(pending.values()):
        stores = ", ".join(s for s, n in pending.items() if n)
        err.print(
            f"still pending for {stores}: " + "; ".join(f"{t}: {e}" for t, e in report.failed.items()), markup=False
        )
        raise typer.Exit(int(ExitCode.PARTIAL))
