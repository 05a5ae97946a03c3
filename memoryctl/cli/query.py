"""``memoryctl query``, ``stats`` and ``cypher``: the read side of the CLI."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.tree import Tree

from memoryctl.cli.context import ctx_of
from memoryctl.cli.output import err, out, print_json
from memoryctl.errors import ExitCode, InputError
from memoryctl.model import EntityRef, parse_datetime
from memoryctl.query.results import QueryResult
from memoryctl.query.spec import GraphFilter, MemoryQuery, Where, parse_duration, parse_since


def query(
    ctx: typer.Context,
    text: Annotated[str | None, typer.Argument(help="What to recall (semantic search).")] = None,
    agent: Annotated[str | None, typer.Option("--agent", help="Agent scope (default: config default_agent).")] = None,
    all_agents: Annotated[bool, typer.Option("--all-agents", help="Operator: search every agent.")] = False,
    entity: Annotated[str | None, typer.Option("--entity", help="Graph start entity TYPE:NAME.")] = None,
    via: Annotated[list[str] | None, typer.Option("--via", help="Relationship type to follow, repeatable.")] = None,
    hops: Annotated[int, typer.Option("--hops", min=1, max=3, help="Graph hops (1-3).")] = 1,
    direction: Annotated[str, typer.Option("--direction", help="out | in | both.")] = "both",
    since: Annotated[str | None, typer.Option("--since", help="ISO timestamp or a duration like 7d.")] = None,
    until: Annotated[str | None, typer.Option("--until", help="ISO timestamp.")] = None,
    where: Annotated[list[str] | None, typer.Option("--where", help='"field OP value", repeatable.')] = None,
    combine: Annotated[str, typer.Option("--combine", help="and | or.")] = "and",
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 10,
    threshold: Annotated[float | None, typer.Option("--threshold", help="Minimum cosine similarity.")] = None,
    half_life: Annotated[
        str | None, typer.Option("--half-life", help="Time decay half-life, e.g. 30d; 'off' disables.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output (the documented contract).")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="Show the plan, per-step timings and counts.")] = False,
) -> None:
    """One ranked answer from vector similarity, graph traversal and relational/time filters."""
    c = ctx_of(ctx)
    if via and not entity:
        raise InputError("--via needs --entity (the node to start from)")
    if combine not in ("and", "or"):
        raise InputError(f"--combine must be and or or, not {combine!r}")
    q = MemoryQuery(
        text=text,
        agent_id=None if all_agents else c.agent(agent),
        all_agents=all_agents,
        since=parse_since(since) if since else None,
        until=parse_datetime(until) if until else None,
        graph=GraphFilter(EntityRef.parse(entity), tuple(via or ()), hops, direction) if entity else None,  # type: ignore[arg-type]
        where=[Where.parse(w) for w in where or []],
        combine=combine,  # type: ignore[arg-type]
        limit=limit,
        threshold=threshold,
    )
    if half_life == "off":
        q.decay = False
    elif half_life:
        q.half_life = parse_duration(half_life)
    result = c.client.query(q)
    if as_json:
        print_json(result.as_dict())
    else:
        _table(result)
        if explain:
            _explain(result)
    if result.degraded:
        err.print(f"degraded: {', '.join(result.degraded)}", markup=False)
        for note in result.explain["notes"]:
            err.print(f"  {note}", markup=False, highlight=False)
        raise typer.Exit(int(ExitCode.PARTIAL))


def _table(result: QueryResult) -> None:
    table = Table(title=f"{len(result.hits)} hits ({result.ms:.0f} ms)", expand=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("score", no_wrap=True)
    table.add_column("created / kind", no_wrap=True)
    table.add_column("text", ratio=3, overflow="fold")
    table.add_column("entities", ratio=1, overflow="fold")
    table.add_column("from", no_wrap=True)
    for rank, h in enumerate(result.hits, start=1):
        m = h.memory
        text = m.text if len(m.text) <= 200 else m.text[:197] + "…"
        ents = ", ".join(f"{e.type}:{e.name}" for e in m.entities[:4])
        src = "+".join(s.replace("postgres-mentions", "pg-mentions").replace("postgres", "pg") for s in h.sources)
        table.add_row(str(rank), f"{h.score:.4f}", f"{m.created_at:%Y-%m-%d %H:%M}\n{m.kind}", text, ents, src)
    out.print(table, markup=False, highlight=False)


def _explain(result: QueryResult) -> None:
    ex = result.explain
    tree = Tree(f"plan: {ex['plan']}  ({ex['total_ms']:.1f} ms)", highlight=False)
    for s in ex["steps"]:
        flow = ""
        if s["rows_in"] is not None or s["rows_out"] is not None:
            rows_in, rows_out = ("-" if s[k] is None else s[k] for k in ("rows_in", "rows_out"))
            flow = f"  {rows_in} → {rows_out}"
        node = tree.add(f"{s['name']} [{s['store']}] {s['ms']:.1f} ms{flow}  {s['status']}", highlight=False)
        for k, v in s["detail"].items():
            node.add(f"{k}: {v}", highlight=False)
        if s["error"]:
            node.add(f"error: {s['error']}", highlight=False)
    for note in ex["notes"]:
        tree.add(f"note: {note}", highlight=False)
    out.print(tree, markup=False)


def stats(
    ctx: typer.Context,
    agent: Annotated[str | None, typer.Option("--agent")] = None,
    all_agents: Annotated[bool, typer.Option("--all-agents")] = False,
    bucket: Annotated[str, typer.Option("--bucket", help="Bucket width, e.g. 1h, 1d, 1w.")] = "1d",
    since: Annotated[str, typer.Option("--since", help="ISO timestamp or duration (7d).")] = "7d",
    until: Annotated[str | None, typer.Option("--until")] = None,
    metric: Annotated[str | None, typer.Option("--metric", help="Numeric metadata key to aggregate.")] = None,
    kind: Annotated[str | None, typer.Option("--kind")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Counts and avg/min/max of a numeric metadata field per time bucket (e.g. a sentiment trend)."""
    from datetime import UTC, datetime

    c = ctx_of(ctx)
    width = parse_duration(bucket)
    if width.total_seconds() < 60:
        raise InputError("--bucket must be at least 1m")
    start = parse_since(since)
    end = parse_datetime(until) if until else datetime.now(UTC)
    if (end - start) / width > 10_000:
        raise InputError("that is more than 10,000 buckets", hint="use a wider --bucket or a shorter range")
    rows = c.client.stats(
        agent_id=None if all_agents else c.agent(agent),
        since=start,
        until=end,
        width=width,
        metric=metric,
        kind=kind,
    )
    data = [
        {
            "bucket": r["bucket"].isoformat(),
            "count": r["count"],
            **({"n": r["n_metric"] or 0, "avg": r["avg"], "min": r["min"], "max": r["max"]} if metric else {}),
        }
        for r in rows
    ]
    if as_json:
        print_json(
            {
                "agent_id": None if all_agents else c.agent(agent),
                "bucket_s": width.total_seconds(),
                "metric": metric,
                "kind": kind,
                "buckets": data,
            }
        )
        return
    table = Table(title=f"stats{f' of {metric}' if metric else ''} per {bucket}")
    cols = ["bucket", "count"] + (["n", "avg", "min", "max"] if metric else [])
    for col in cols:
        table.add_column(col)
    for d in data:
        table.add_row(*[_fmt(d.get(col)) for col in cols])
    out.print(table, markup=False)


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def cypher(
    ctx: typer.Context,
    statement: Annotated[str, typer.Argument(help="A read-only Cypher query; $agent_id is bound to the agent.")],
    param: Annotated[list[str] | None, typer.Option("--param", help="k=v (JSON values allowed), repeatable.")] = None,
    agent: Annotated[str | None, typer.Option("--agent")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Raw Cypher for power users, in a READ transaction (write clauses are refused)."""
    import json

    from memoryctl.cli.writes import parse_params

    c = ctx_of(ctx)
    params = parse_params(param or [])
    rows = c.client.cypher(statement, params, agent_id=c.agent(agent))
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print("(no rows)", markup=False)
        return
    table = Table()
    for col in rows[0]:
        table.add_column(str(col))
    for r in rows:
        table.add_row(
            *[v if isinstance(v, str) else json.dumps(v, default=str, ensure_ascii=False) for v in r.values()]
        )
    out.print(table, markup=False, highlight=False)
