"""Maintenance commands: reconcile, migrate, reembed.

Exit codes (the CLI contract): 0 = nothing left to do; 3 = drift found and not repaired, a store
was skipped because it is down, or a migration stopped at verification; 1 = the run failed
(message and hint on stderr); 2 = bad usage. Each run is recorded in ``maintenance_runs`` with its
trigger (``MEMORYCTL_TRIGGER=cron`` in the cron entries; ``cli`` otherwise).
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from memoryctl.cli.context import ctx_of
from memoryctl.cli.output import err, out, print_json
from memoryctl.cli.progress import phase_bars, progress_bar
from memoryctl.errors import ExitCode, UsageError
from memoryctl.model import parse_duration

# The ops modules (psycopg, numpy) and rich's widgets are imported by the commands that use them:
# every other command's start-up would pay for them.


def reconcile(
    ctx: typer.Context,
    repair: Annotated[
        bool, typer.Option("--repair", help="Fix what is found (idempotent). Default: report only.")
    ] = False,
    agent: Annotated[str | None, typer.Option("--agent", "-a", help="Only this agent's memories.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable report.")] = False,
) -> None:
    """Compare PostgreSQL, the vector store and the graph: orphans, missing, stale, purge-due."""
    from rich.table import Table

    from memoryctl.ops.reconcile import CATEGORIES

    c = ctx_of(ctx)
    agent_id = c.agent(agent) if agent else None
    total = c.client.count(agent_id=agent_id, include_deleted=True)
    with progress_bar(not as_json, "reconcile", total) as advance:
        report = c.client.reconcile(agent_id=agent_id, repair=repair, progress=advance)
    if as_json:
        print_json(report.as_dict())
    else:
        table = Table(title=f"reconcile{' --repair' if repair else ' (dry run)'}: {report.drift} finding(s)")
        for col in ("store", "scanned", *CATEGORIES, "pending", "repaired"):
            table.add_column(col)
        table.add_row("postgres", str(report.postgres_scanned), "-", "-", "-", "-", "-")
        for s in report.stores.values():
            table.add_row(
                s.name,
                str(s.scanned),
                str(s.orphan),
                str(s.missing),
                str(s.stale),
                str(s.pending),
                str(s.repaired) if repair else "-",
            )
        out.print(table)
        out.print(
            f"purge due (soft-deleted past {c.settings.delete_grace}): {report.purge_due}"
            + (f", purged {report.purged}" if repair else ""),
            markup=False,
        )
        if report.model and not report.model.get("match", True):
            out.print(
                f"model: collection {report.model['collection']!r} vs embedder {report.model['embedder']!r}"
                f" — {report.model['hint']}",
                markup=False,
            )
        for name, why in report.skipped.items():
            err.print(f"skipped {name}: {why}", markup=False)
        for e in report.errors:
            err.print(f"error: {e}", markup=False)
        out.print(f"{report.seconds:.1f} s, {report.ids_per_s:,.0f} ids/s", markup=False)
        if report.drift and not repair:
            out.print("run `memoryctl reconcile --repair` to fix", markup=False)
    left = report.unrepaired if repair else report.drift
    if left or report.skipped or report.errors:
        raise typer.Exit(ExitCode.PARTIAL)


def migrate(
    ctx: typer.Context,
    to_model: Annotated[
        str | None,
        typer.Option(
            "--to-model",
            help="Target embedder: KIND, KIND:MODEL, or key=value list "
            "(kind=hash,dim=256 / kind=http,model=BAAI/bge-m3,url=http://10.77.0.3:8001).",
        ),
    ] = None,
    batch: Annotated[int, typer.Option("--batch", min=1, max=10_000, help="Memories per embed/upsert batch.")] = 512,
    rollback: Annotated[bool, typer.Option("--rollback", help="Swap back to the previous model.")] = False,
    cleanup: Annotated[bool, typer.Option("--cleanup", help="Drop retired collections past --grace.")] = False,
    abandon: Annotated[bool, typer.Option("--abandon", help="Give up an unfinished migration.")] = False,
    grace: Annotated[str, typer.Option("--grace", help="Cleanup keeps retired collections this long.")] = "7d",
    sample: Annotated[int, typer.Option("--sample", min=0, max=10_000, help="Verification queries.")] = 50,
    min_recall: Annotated[
        float | None, typer.Option("--min-recall", min=0.0, max=1.0, help="Refuse the swap below this self-recall@10.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Re-embed every memory into a new model's collection, verify, swap atomically; resumable."""
    from memoryctl.ops.models import parse_model_spec

    c = ctx_of(ctx)
    chosen = [
        name
        for name, on in (
            ("--to-model", to_model is not None),
            ("--rollback", rollback),
            ("--cleanup", cleanup),
            ("--abandon", abandon),
        )
        if on
    ]
    if len(chosen) != 1:
        raise UsageError(
            "give exactly one of --to-model, --rollback, --cleanup, --abandon",
            hint="e.g. memoryctl migrate --to-model kind=hash,dim=256",
        )
    kwargs: dict[str, Any] = {"batch": batch, "sample": sample, "min_recall": min_recall}
    if to_model is not None:
        kwargs["target"] = parse_model_spec(to_model, c.settings.embedder)
        action = "migrate"
    else:
        action = chosen[0].removeprefix("--")
        if cleanup:
            kwargs["grace"] = parse_duration(grace)
    with phase_bars(not as_json) as progress:
        report = c.client.migrate_model(action, progress=progress, **kwargs)
    if as_json:
        print_json(report.as_dict())
    else:
        d = report.as_dict()
        for key in (
            "action",
            "status",
            "source_model",
            "target_model",
            "resumed_from",
            "copied",
            "caught_up",
            "removed",
            "swapped",
            "dropped",
            "kept",
            "verify",
            "pipeline",
            "seconds",
        ):
            if d[key] not in (None, [], {}):
                out.print(f"{key}: {d[key]}", markup=False, highlight=False)
        if report.config_hint:
            out.print(f"note: {report.config_hint}", markup=False, highlight=False)
    if report.status == "verify-failed":
        raise typer.Exit(ExitCode.PARTIAL)


def reembed(
    ctx: typer.Context,
    changed: Annotated[
        bool, typer.Option("--changed", help="Only memories whose text changed (content hash).")
    ] = False,
    agent: Annotated[str | None, typer.Option("--agent", "-a", help="Only this agent's memories.")] = None,
    batch: Annotated[int, typer.Option("--batch", min=1, max=10_000)] = 512,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Re-embed in place, in the active collection, memories whose text changed since embedding."""
    if not changed:
        raise UsageError(
            "reembed needs --changed",
            hint="to re-embed everything with another model use `memoryctl migrate --to-model ...`",
        )
    c = ctx_of(ctx)
    agent_id = c.agent(agent) if agent else None
    with progress_bar(not as_json, "reembed", c.client.count(agent_id=agent_id)) as advance:
        report = c.client.reembed_changed(agent_id=agent_id, batch=batch, progress=advance)
    if as_json:
        print_json(report.as_dict())
    else:
        out.print(
            f"re-embedded {report.changed} of {report.scanned} memories into {report.model_id} "
            f"in {report.seconds:.1f} s",
            markup=False,
        )
    sys.stdout.flush()
