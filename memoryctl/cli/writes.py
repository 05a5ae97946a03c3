"""Write commands: add, import, get, forget, sync."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from memoryctl.cli.context import ctx_of
from memoryctl.cli.output import emit, err, out
from memoryctl.cli.progress import progress_bar
from memoryctl.errors import InputError
from memoryctl.importer import count_lines
from memoryctl.model import DEFAULT_KIND, parse_uuid, validate_meta_key


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
    # The id is chosen here, so that a retry after a lost reply from the service is idempotent.
    mid = parse_uuid(id_) if id_ else uuid.uuid4()
    params = {
        "id": str(mid),
        "text": text,
        "agent": c.agent(agent),
        "kind": kind,
        "at": at,
        "metadata": parse_params(meta or [], "--meta") or None,
        "entities": entity or None,
        "relations": rel or None,
    }
    reply = c.call("add", params)
    human: Any = lambda data: out.print(data["id"], markup=False, highlight=False)  # noqa: E731
    raise typer.Exit(emit(reply, as_json, human))


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
    params = {"agent": agent, "strict": strict, "file": str(file)}
    bar = not as_json and c.service is None  # the service reports no progress
    total = count_lines(file) if bar and err.is_terminal else None
    with progress_bar(bar, "importing", total) as advance:
        reply = c.call("import", params, upload=file, progress=advance)

    def human(data: dict[str, Any]) -> None:
        from rich.table import Table

        table = Table(title=f"import {file}", show_header=False)
        for label, value in (
            ("inserted", data["inserted"]),
            ("updated", data["updated"]),
            ("unchanged", data["unchanged"]),
            ("invalid lines", len(data["invalid"])),
            *((f"pending {store}", n) for store, n in data["pending"].items()),
        ):
            table.add_row(label, str(value))
        out.print(table)
        for bad in data["invalid"][:50]:
            err.print(f"line {bad['line']}: {bad['error']}", markup=False, highlight=False)
        if len(data["invalid"]) > 50:
            err.print(f"… and {len(data['invalid']) - 50} more bad lines", markup=False)

    raise typer.Exit(emit(reply, as_json, human))


def get(
    ctx: typer.Context,
    memory_id: Annotated[str, typer.Argument(metavar="ID", help="The memory's UUID.")],
    agent: Annotated[str | None, typer.Option("--agent", help="Only if it belongs to this agent.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show one memory as stored in PostgreSQL (the source of truth)."""
    c = ctx_of(ctx)
    params = {"id": str(parse_uuid(memory_id)), "agent": c.agent(agent) if agent else None}
    reply = c.call("get", params)

    def human(data: dict[str, Any]) -> None:
        from rich.table import Table

        table = Table(show_header=False)
        for key, value in data.items():
            table.add_row(key, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
        out.print(table)

    raise typer.Exit(emit(reply, as_json, human))


def forget(
    ctx: typer.Context,
    memory_ids: Annotated[list[str], typer.Argument(metavar="ID...", help="UUIDs to forget.")],
    agent: Annotated[str | None, typer.Option("--agent", help="Only within this agent.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Soft-delete memories: hidden from every query at once, purged later by reconcile."""
    c = ctx_of(ctx)
    params = {"ids": [str(parse_uuid(i)) for i in memory_ids], "agent": c.agent(agent) if agent else None}
    reply = c.call("forget", params)
    human: Any = lambda data: out.print(f"forgotten: {len(data['forgotten'])}", markup=False)  # noqa: E731
    raise typer.Exit(emit(reply, as_json, human))


def sync(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Deliver everything pending in the outbox to Qdrant and Neo4j (idempotent)."""
    from memoryctl.ops.runs import current_actor, current_trigger

    c = ctx_of(ctx)
    reply = c.call("sync", {"trigger": current_trigger(), "actor": current_actor()})

    def human(data: dict[str, Any]) -> None:
        delivered = ", ".join(f"{t} {n}" for t, n in data["delivered"].items())
        waiting = ", ".join(f"{s} {n}" for s, n in data["pending"].items())
        out.print(f"delivered: {delivered}; pending: {waiting}", markup=False)

    raise typer.Exit(emit(reply, as_json, human))
