"""Write commands: add, import, get, forget, sync."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from memoryctl.cli import params, render
from memoryctl.cli.context import ctx_of
from memoryctl.cli.output import emit, err, out
from memoryctl.cli.progress import progress_bar
from memoryctl.errors import InputError
from memoryctl.importer import count_lines
from memoryctl.model import DEFAULT_KIND


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
    flags = params.add(c.agent, text=text, agent=agent, kind=kind, at=at, entity=entity, rel=rel, meta=meta, id_=id_)
    reply = c.call("add", flags)
    raise typer.Exit(emit(reply, as_json, render.added))


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
    reply = c.call("get", params.get(c.agent, memory_id=memory_id, agent=agent))
    raise typer.Exit(emit(reply, as_json, render.memory))


def forget(
    ctx: typer.Context,
    memory_ids: Annotated[list[str], typer.Argument(metavar="ID...", help="UUIDs to forget.")],
    agent: Annotated[str | None, typer.Option("--agent", help="Only within this agent.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Soft-delete memories: hidden from every query at once, purged later by reconcile."""
    c = ctx_of(ctx)
    reply = c.call("forget", params.forget(c.agent, memory_ids=memory_ids, agent=agent))
    raise typer.Exit(emit(reply, as_json, render.forgotten))


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
