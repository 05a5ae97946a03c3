"""``memoryctl nightly``, ``feedback`` and ``adapters``: the learning loop's commands."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from memoryctl.cli.context import ctx_of
from memoryctl.cli.output import err, out, print_json
from memoryctl.errors import ExitCode, InputError
from memoryctl.model import parse_uuid


def nightly(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Train → gate → promote LoRA adapters, re-embed changed texts, reconcile, record the run."""
    report = ctx_of(ctx).client.nightly()
    if as_json:
        print_json(report.as_dict())
    else:
        from rich.table import Table

        table = Table(title=f"nightly: {'failed' if report.failed else 'ok'} ({report.seconds:.1f} s)")
        for col in ("step", "status", "seconds", "detail"):
            table.add_column(col, overflow="fold")
        for s in report.steps:
            detail = s.detail.get("reason") or s.detail.get("error") or ""
            table.add_row(s.name, s.status, f"{s.seconds:.1f}", str(detail))
        out.print(table, markup=False)
    if report.failed:
        raise typer.Exit(int(ExitCode.FAILURE))


def feedback(
    ctx: typer.Context,
    query_id: Annotated[str, typer.Argument(help="query_id from `memoryctl query --json`.")],
    memory_id: Annotated[str, typer.Argument(help="The recalled memory.")],
    useful: Annotated[bool | None, typer.Option("--useful/--not-useful", help="Was the recall useful?")] = None,
) -> None:
    """Record whether a recalled memory was useful: the embedding LoRA learns from these pairs."""
    if useful is None:
        raise InputError("say --useful or --not-useful")
    ctx_of(ctx).client.feedback(parse_uuid(query_id), parse_uuid(memory_id), useful=useful)
    out.print("recorded", markup=False)


def adapters(
    ctx: typer.Context,
    kind: Annotated[str, typer.Argument(help="embedding | generation")],
    rollback: Annotated[bool, typer.Option("--rollback", help="Serve the previous version again.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List LoRA adapter versions of a kind, or roll the served one back to the previous version."""
    from pathlib import Path

    from memoryctl.lora.registry import AdapterRegistry

    if kind not in ("embedding", "generation"):
        raise InputError(f"kind must be embedding or generation, not {kind!r}")
    which: Literal["embedding", "generation"] = "embedding" if kind == "embedding" else "generation"
    c = ctx_of(ctx)
    ns = c.settings.nightly
    registry = AdapterRegistry(Path(ns.adapters_dir or c.settings.data_dir / "adapters"))
    if rollback:
        _rollback(c, registry, kind)
    active = registry.active(which)
    rows = [
        {
            "version": v.version,
            "model_id": v.model_id,
            "active": bool(active and v.version == active.version),
            "created_at": str(v.manifest.get("created_at", "")),
            "metrics": v.manifest.get("metrics", {}),
        }
        for v in registry.list(which)
    ]
    if as_json:
        print_json(rows)
        return
    from rich.table import Table

    table = Table(title=f"{kind} adapters")
    for col in ("version", "active", "model_id", "created_at"):
        table.add_column(col)
    for r in rows:
        table.add_row(str(r["version"]), "*" if r["active"] else "", str(r["model_id"]), r["created_at"])
    out.print(table, markup=False)


def _rollback(c: object, registry: object, kind: str) -> None:
    from memoryctl.cli.context import Ctx

    assert isinstance(c, Ctx)
    if kind == "generation":
        from memoryctl.lora.cycle import rollback_generation
        from memoryctl.lora.serving import AdapterServing
        from memoryctl.vllm import VLLMClient

        vllm = c.settings.vllm
        if not vllm.url:
            raise InputError("rolling back a generation adapter needs [vllm] url")
        with VLLMClient(
            vllm.url, api_key=vllm.api_key.get_secret_value() if vllm.api_key else None, timeout_s=vllm.timeout_s
        ) as client:
            back = rollback_generation(registry, AdapterServing(client))  # type: ignore[arg-type]
        err.print(f"serving {back.served_name if back else 'the base model'}", markup=False)
        return
    report = c.client.migrate_model("rollback")
    registry.rollback("embedding")  # type: ignore[attr-defined]
    err.print(f"embedding model: {report.status} → {report.target_model}", markup=False)
