"""The full ``memoryctl`` command line: every operation of the table as a typer command
(``memoryctl.cli.commands``), grouped as declared (``memoryctl backup status``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memoryctl._version import __version__
from memoryctl.cli.commands import command
from memoryctl.cli.context import Ctx
from memoryctl.declaration.table import GROUPS, OPERATIONS

SETTINGS = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(
    name="memoryctl",
    help="One query interface and the ops CLI for a self-hosted agent memory stack.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings=SETTINGS,
)


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


groups = {
    name: typer.Typer(help=text, no_args_is_help=True, context_settings=SETTINGS) for name, text in GROUPS.items()
}
for name, group in groups.items():
    app.add_typer(group, name=name)
for op in OPERATIONS.values():
    head, _, tail = op.name.partition(" ")
    (groups[head] if tail else app).command(tail or head)(command(op))
