"""``memoryctl outbox list|retry|drop``: the deliveries set aside after failing alone.

Delivery narrows a failed batch down to the memories that fail alone and sets those aside with
their error (memoryctl.delivery), so one bad record never holds back the rest. They stay in the
outbox, out of the queue, until an operator looks: ``list`` shows them, ``retry`` puts them back
(after fixing the cause), ``drop`` gives up on them (reconcile then reports the memory as missing in
that store). PostgreSQL only: these run in-process, beside a running ``memoryctl serve`` too.
"""

from __future__ import annotations

from typing import Annotated

import typer

from memoryctl.cli.context import ctx_of
from memoryctl.cli.output import err, out, print_json
from memoryctl.errors import InputError

outbox_app = typer.Typer(help="Deliveries set aside after failing alone: list, retry, drop.", no_args_is_help=True)

Ids = Annotated[list[int] | None, typer.Argument(metavar="[ROW]...", help="Outbox row ids (from `outbox list`).")]
All = Annotated[bool, typer.Option("--all", help="Every row set aside.")]


@outbox_app.command("list")
def list_(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, max=100_000)] = 1000,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The rows set aside: which memory, which store, how often it failed, and the error."""
    rows = ctx_of(ctx).client.set_aside(limit=limit)
    if as_json:
        print_json(rows)
        return
    from rich.table import Table

    table = Table(title=f"outbox: {len(rows)} set aside")
    for col in ("row", "memory", "agent", "store", "op", "attempts", "queued", "error"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            str(r["id"]),
            str(r["memory_id"]),
            r["agent_id"] or "-",
            r["target"],
            r["op"],
            str(r["attempts"]),
            r["created_at"].isoformat(timespec="seconds"),
            r["last_error"] or "",
        )
    out.print(table)


@outbox_app.command("retry")
def retry(ctx: typer.Context, rows: Ids = None, all_: All = False) -> None:
    """Put rows set aside back in the queue (after fixing what made them fail)."""
    n = ctx_of(ctx).client.retry_set_aside(_chosen(rows, all_))
    out.print(f"back in the queue: {n}", highlight=False)
    if n:
        err.print("the next write, `memoryctl sync` or the service's delivery takes them", highlight=False)


@outbox_app.command("drop")
def drop(ctx: typer.Context, rows: Ids = None, all_: All = False) -> None:
    """Give up on rows set aside: that store will not get those memories (reconcile reports them)."""
    n = ctx_of(ctx).client.drop_set_aside(_chosen(rows, all_))
    out.print(f"dropped: {n}", highlight=False)


def _chosen(rows: list[int] | None, all_: bool) -> list[int] | None:
    if bool(rows) == all_:
        raise InputError("name the rows or pass --all (not both)", hint="`memoryctl outbox list` shows the rows")
    return None if all_ else list(rows or [])
