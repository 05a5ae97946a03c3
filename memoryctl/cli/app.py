"""The full ``memoryctl`` command line: every command, typer-parsed (``memoryctl.cli.main`` runs it)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memoryctl._version import __version__
from memoryctl.cli import backup, demo, maint, nightly, ops, outbox, query, serve, writes
from memoryctl.cli.context import Ctx

app = typer.Typer(
    name="memoryctl",
    help="One query interface and the ops CLI for a self-hosted agent memory stack.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
config_app = typer.Typer(help="Inspect the effective configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(backup.backup_app, name="backup")
app.add_typer(backup.restore_app, name="restore")
app.add_typer(backup.rebuild_app, name="rebuild")
app.add_typer(outbox.outbox_app, name="outbox")


def _version(value: bool) -> None:
    if value:
        print(f"memoryctl {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="TOML config file (default: $MEMORYCTL_CONFIG, user config, /etc)."),
    ] = None,
    profile: Annotated[str | None, typer.Option("--profile", help="embedded | cluster (overrides the file).")] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    ctx.obj = Ctx(config_path=config, profile=profile)
    ctx.call_on_close(ctx.obj.close)


app.command("demo")(demo.demo)
app.command("init")(ops.init)
app.command("add")(writes.add)
app.command("import")(writes.import_)
app.command("get")(writes.get)
app.command("forget")(writes.forget)
app.command("sync")(writes.sync)
app.command("query")(query.query)
app.command("stats")(query.stats)
app.command("cypher")(query.cypher)
app.command("health")(ops.health)
app.command("runs")(ops.runs)
app.command("reconcile")(maint.reconcile)
app.command("migrate")(maint.migrate)
app.command("reembed")(maint.reembed)
app.command("nightly")(nightly.nightly)
app.command("feedback")(nightly.feedback)
app.command("adapters")(nightly.adapters)
app.command("serve")(serve.serve)
config_app.command("show")(ops.config_show)
