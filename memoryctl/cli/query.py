"""``memoryctl query``, ``stats`` and ``cypher``: the read side of the CLI."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from memoryctl.cli import params, render
from memoryctl.cli.chart import bars, sparkline
from memoryctl.cli.context import ctx_of
from memoryctl.cli.output import emit, out, print_json


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
    retrieval: Annotated[
        str, typer.Option("--retrieval", help="hybrid (vector + lexical, fused) | dense | lexical.")
    ] = "hybrid",
    half_life: Annotated[
        str | None,
        typer.Option(
            "--half-life",
            help="Prefer newer memories among comparably relevant ones (within a twentieth of this"
            " query's relevance spread), with this half-life, e.g. 30d; 'off' overrides a configured one."
            " Default: [query] half_life, none (relevance alone).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output (the documented contract).")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="Show the plan, per-step timings and counts.")] = False,
) -> None:
    """One ranked answer from vector similarity, graph traversal and relational/time filters."""
    c = ctx_of(ctx)
    flags = params.query(
        c.agent,
        text=text,
        agent=agent,
        all_agents=all_agents,
        entity=entity,
        via=via,
        hops=hops,
        direction=direction,
        since=since,
        until=until,
        where=where,
        combine=combine,
        limit=limit,
        threshold=threshold,
        retrieval=retrieval,
        half_life=half_life,
    )
    reply = c.call("query", flags)
    raise typer.Exit(emit(reply, as_json, render.query(explain)))


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
    c = ctx_of(ctx)
    params = {
        "agent": None if all_agents else c.agent(agent),
        "all_agents": all_agents or None,
        "bucket": bucket,
        "since": since,
        "until": until,
        "metric": metric,
        "kind": kind,
    }
    reply = c.call("stats", params)

    def human(data: dict[str, Any]) -> None:
        from rich.table import Table

        # The trend of what the table is about: the metric's average when there is one, else the count.
        trend_of = "avg" if metric else "count"
        series = [d.get(trend_of) for d in data["buckets"]]
        table = Table(title=f"stats{f' of {metric}' if metric else ''} per {bucket}")
        cols = ["bucket", "count"] + (["n", "avg", "min", "max"] if metric else [])
        for col in cols:
            table.add_column(col)
        table.add_column(trend_of, no_wrap=True)
        for d, bar in zip(data["buckets"], bars(series), strict=True):
            table.add_row(*[_fmt(d.get(col)) for col in cols], bar)
        out.print(table, markup=False)
        out.print(f"{trend_of} trend: {sparkline(series)}", markup=False, highlight=False)

    raise typer.Exit(emit(reply, as_json, human))


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

    from rich.table import Table

    c = ctx_of(ctx)
    rows = c.client.cypher(statement, params.parse_params(param or []), agent_id=c.agent(agent))
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
