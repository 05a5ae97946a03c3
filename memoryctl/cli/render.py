"""Human renderings of the operations' ``--json`` documents, shared by the typer commands and the
console script's fast path (``memoryctl.cli.fast``). rich is imported when a table is drawn."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from memoryctl.cli.output import out
from memoryctl.model import parse_datetime

Human = Callable[[Any], None]


def query(explain: bool) -> Human:
    def human(data: dict[str, Any]) -> None:
        hits(data)
        if explain:
            plan(data)

    return human


def hits(result: dict[str, Any]) -> None:
    """The hits of a ``query --json`` document as a table."""
    from rich.table import Table

    hits = result["hits"]
    table = Table(title=f"{len(hits)} hits ({result['explain']['total_ms']:.0f} ms)", expand=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("score", no_wrap=True)
    table.add_column("created / kind", no_wrap=True)
    table.add_column("text", ratio=3, overflow="fold")
    table.add_column("entities", ratio=1, overflow="fold")
    table.add_column("from", no_wrap=True)
    for rank, h in enumerate(hits, start=1):
        text = h["text"] if len(h["text"]) <= 200 else h["text"][:197] + "…"
        ents = ", ".join(f"{e['type']}:{e['name']}" for e in h["entities"][:4])
        src = "+".join(s.replace("postgres-mentions", "pg-mentions").replace("postgres", "pg") for s in h["sources"])
        created = f"{parse_datetime(h['created_at']):%Y-%m-%d %H:%M}"
        table.add_row(str(rank), f"{h['score']:.4f}", f"{created}\n{h['kind']}", text, ents, src)
    out.print(table, markup=False, highlight=False)


def plan(result: dict[str, Any]) -> None:
    from rich.tree import Tree

    ex = result["explain"]
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


def memory(data: dict[str, Any]) -> None:
    """``get``: one memory, field by field."""
    from rich.table import Table

    table = Table(show_header=False)
    for key, value in data.items():
        table.add_row(key, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
    out.print(table)


def added(data: dict[str, Any]) -> None:
    out.print(data["id"], markup=False, highlight=False)


def forgotten(data: dict[str, Any]) -> None:
    out.print(f"forgotten: {len(data['forgotten'])}", markup=False)
