"""Operator commands: init, health, runs, config show."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memoryctl.cli.context import ctx_of
from memoryctl.cli.output import emit, out, print_json

if TYPE_CHECKING:
    from memoryctl.serve.wire import Reply


def init(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Create or upgrade the schema (PostgreSQL), the vector collection and graph constraints."""
    reply = ctx_of(ctx).call("init", {})

    def human(result: dict[str, Any]) -> None:
        schema = ", ".join(f"{r['version']}:{r['variant']}" for r in result["schema"])
        out.print(f"schema: {schema}", markup=False)
        out.print(f"applied now: {len(result['migrations_applied'])}", markup=False)
        out.print(f"vector model: {result['vector_model']}", markup=False)
        for store, why in result["degraded"].items():
            out.print(f"{store}: unavailable ({why})", markup=False)

    raise typer.Exit(emit(reply, as_json, human))


def health(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable report.")] = False,
    as_prometheus: Annotated[
        bool, typer.Option("--prometheus", help="Prometheus text format (textfile collector).")
    ] = False,
    deadline: Annotated[float, typer.Option(help="Seconds to wait for all probes.")] = 1.8,
) -> None:
    """Probe every component; exit 0 healthy, 1 unhealthy, 3 degraded."""
    c = ctx_of(ctx)
    reply = c.call("health", {"deadline": deadline})
    if c.settings.serve.required and "serve" not in reply.data["components"]:
        # Asked in-process: the service that should answer did not (see memoryctl.serve.client).
        reply = _with_component(reply, "serve", {"status": "down", "error": "memoryctl serve is not answering"})
    if as_prometheus:
        from memoryctl.health import HealthReport, prometheus

        sys.stdout.write(prometheus(HealthReport(components=reply.data["components"])))
        raise typer.Exit(reply.exit_code)

    def human(report: dict[str, Any]) -> None:
        from rich.table import Table

        table = Table(title=f"memoryctl health: {report['status']}")
        for col in ("component", "status", "latency ms", "detail"):
            table.add_column(col)
        for name, comp in report["components"].items():
            detail = comp.get("error") or _summary(comp)
            table.add_row(name, comp["status"], str(comp["latency_ms"]), detail)
        out.print(table)

    raise typer.Exit(emit(reply, as_json, human))


def _with_component(reply: Reply, name: str, component: dict[str, Any]) -> Reply:
    """The report with one more component, its status and exit code recomputed."""
    from memoryctl.health import HealthReport
    from memoryctl.serve.wire import Reply

    report = HealthReport(components={**reply.data["components"], name: {**component, "latency_ms": 0.0}})
    data = {**reply.data, "status": report.status, "components": report.components}
    return Reply(data, report.exit_code, reply.warnings)


def _summary(comp: dict[str, Any]) -> str:
    keys = [k for k in comp if k not in ("status", "latency_ms", "error")]
    return ", ".join(f"{k}={comp[k]}" for k in keys[:6] if not isinstance(comp[k], list | dict)) or ""


def runs(
    ctx: typer.Context,
    command: Annotated[str | None, typer.Option("--command", help="Only runs of this command.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List recent maintenance runs (sync, reconcile, migrate, reembed, nightly)."""
    c = ctx_of(ctx)
    rows = c.client.runs(command=command, limit=limit)
    if as_json:
        print_json(rows)
        return
    from rich.table import Table

    table = Table(title="maintenance runs")
    for col in ("id", "command", "started", "seconds", "status", "trigger", "counts", "error"):
        table.add_column(col)
    for r in rows:
        secs = (r["finished_at"] - r["started_at"]).total_seconds() if r["finished_at"] else None
        table.add_row(
            str(r["id"]),
            r["command"],
            r["started_at"].isoformat(timespec="seconds"),
            f"{secs:.1f}" if secs is not None else "-",
            r["status"],
            r["trigger"],
            str(r["counts"]),
            r["error"] or "",
        )
    out.print(table)


def config_show(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Print the effective configuration (file + environment + flags), secrets masked."""
    from memoryctl.config import masked

    data = masked(ctx_of(ctx).settings)
    if as_json:
        print_json(data)
        return
    out.print(_as_toml(data), markup=False, highlight=False)


def _as_toml(data: dict[str, Any], prefix: str = "") -> str:
    """A TOML rendering good enough to paste back into a config file."""
    import json

    scalars = [(k, v) for k, v in data.items() if not isinstance(v, dict)]
    tables = [(k, v) for k, v in data.items() if isinstance(v, dict)]
    lines = [f"{k} = {json.dumps(v)}" for k, v in scalars if v is not None]
    lines += [f"# {k} = (unset)" for k, v in scalars if v is None]
    for k, v in tables:
        name = f"{prefix}{k}"
        lines += ["", f"[{name}]", _as_toml(v, prefix=f"{name}.")]
    return "\n".join(lines)
