"""Backup commands: ``backup status|qdrant``, ``restore qdrant``, ``rebuild graph`` (docs/backup.md).

PostgreSQL's own backups and its point-in-time restore are pgBackRest's (scheduled on the backup
node by the deploy; the restore procedure is in docs/backup.md): they need the server stopped and
root on the db node, which is not memoryctl's to do. memoryctl reports on them, and restores the
two stores derived from PostgreSQL.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from memoryctl.cli.context import ctx_of
from memoryctl.cli.output import out, print_json
from memoryctl.errors import ExitCode

# The backup modules (psycopg, httpx) and rich's table are imported by the commands that use them:
# every other command's start-up stays light (tests/unit/test_startup.py).

backup_app = typer.Typer(help="Backups: what is kept and how old it is; Qdrant snapshot sets.", no_args_is_help=True)
restore_app = typer.Typer(help="Restore a store derived from PostgreSQL.", no_args_is_help=True)
rebuild_app = typer.Typer(help="Rebuild a store from PostgreSQL.", no_args_is_help=True)


@backup_app.command("status")
def status(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable report.")] = False,
    as_prometheus: Annotated[
        bool, typer.Option("--prometheus", help="Prometheus text format (textfile collector).")
    ] = False,
) -> None:
    """Per store: the newest backup, the newest restorable point, sizes. Exit 0 fresh, 3 stale, 1 unreadable."""
    from rich.table import Table

    from memoryctl.backup.status import prometheus

    report = ctx_of(ctx).client.backup_status()
    if as_prometheus:
        sys.stdout.write(prometheus(report))
    elif as_json:
        print_json(report.as_dict())
    else:
        table = Table(title="memoryctl backups")
        for col in ("store", "method", "newest backup", "age", "newest restorable", "kept", "size", "note"):
            table.add_column(col)
        for name, store in report.as_dict()["stores"].items():
            age = store["last_backup_age_s"]
            note = store["error"] or store.get("note") or ("STALE" if store["stale"] else "")
            if store["archive_failing"]:
                note = "WAL archiving failing"
            table.add_row(
                name,
                store["method"],
                store["last_backup"] or "-",
                f"{age / 3600:.1f} h" if age is not None else "-",
                store["newest_restorable"] or "-",
                str(store["count"]) if store["configured"] else "-",
                _size(store["bytes"]),
                note,
            )
        out.print(table)
    raise typer.Exit(report.exit_code)


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


@backup_app.command("qdrant")
def qdrant(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Snapshot every Qdrant collection (one file per shard) and ship the set to the snapshot target."""
    result = ctx_of(ctx).client.backup_vectors()
    if as_json:
        print_json(result)
        return
    out.print(
        f"snapshot set {result['set']}: {result['collections']} collection(s), {result['shards']} shard(s), "
        f"{result['points']} points, {_size(result['bytes'])} -> {result['target']} in {result['total_s']} s",
        markup=False,
    )
    if result["pruned"]:
        out.print(f"pruned: {', '.join(result['pruned'])}", markup=False)


@restore_app.command("qdrant")
def restore(
    ctx: typer.Context,
    set_name: Annotated[str | None, typer.Option("--set", help="Snapshot set (default: the newest complete).")] = None,
    catch_up: Annotated[
        bool,
        typer.Option(
            help="Afterwards deliver the outbox and what changed since the snapshot (sync, then reconcile --repair"
            " of the vector store)."
        ),
    ] = True,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Restore Qdrant from a snapshot set, then catch up with PostgreSQL. Exit 3 if drift is left."""
    client = ctx_of(ctx).client
    result = client.restore_vectors(name=set_name)
    left = 0
    if catch_up:
        client.sync()  # writes that waited in the outbox while the collection was gone
        # ... and what the snapshot predates: the vector store only (the graph is `rebuild graph`'s).
        report = client.reconcile(repair=True, stores=("vector",))
        result["catch_up"] = {"repaired": sum(s.repaired for s in report.stores.values()), "left": report.unrepaired}
        left = report.unrepaired
    if as_json:
        print_json(result)
    else:
        points = ", ".join(f"{name}: {n}" for name, n in result["collections"].items())
        out.print(f"restored set {result['set']} in {result['total_s']} s ({points})", markup=False)
        if catch_up:
            out.print(
                f"caught up: {result['catch_up']['repaired']} re-delivered, {left} left",
                markup=False,
            )
    if left:
        raise typer.Exit(ExitCode.PARTIAL)


@rebuild_app.command("graph")
def graph(
    ctx: typer.Context,
    batch: Annotated[int, typer.Option(min=1, max=10_000, help="Memories per read/write batch.")] = 1000,
    prune: Annotated[bool, typer.Option(help="Remove graph memories PostgreSQL does not have.")] = True,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Rebuild the graph store from PostgreSQL (idempotent; writes may continue meanwhile)."""
    result = ctx_of(ctx).client.rebuild_graph(batch=batch, prune=prune)
    if as_json:
        print_json(result)
        return
    out.print(
        f"graph rebuilt: {result['memories']} memories in {result['write_s']} s "
        f"({result['memories_per_s']}/s), {result['orphans_removed']} orphan(s) removed, "
        f"graph now holds {result['graph_count']}",
        markup=False,
    )
