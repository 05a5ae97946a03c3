"""The Runs and nights page: the maintenance history (``memoryctl runs``) with durations; each
night's steps with their gate figures and promoted versions; a chart of a gate figure over the
nights, drawn on the server as SVG. Operator only (``runs`` is an operator's operation)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memoryctl.console import draw

if TYPE_CHECKING:
    from starlette.responses import Response

    from memoryctl.console.web import Ctx


def numbers(figures: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in figures.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def nights(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each nightly run with its steps read as ``memoryctl health`` reads the last one (reason,
    figures: the gate's own, the registered ``version``, migrate's and the swap's)."""
    from memoryctl.health.nightly import night_steps

    out = []
    for row in rows:
        if row.get("command") != "nightly":
            continue
        steps = night_steps(row.get("details") or {})
        out.append({"run": row, "steps": [{**s, "gate": numbers(s.get("figures") or {})} for s in steps]})
    return out


def gate_charts(found: list[dict[str, Any]]) -> list[draw.Chart]:
    """One chart per step and gate figure named ``candidate_*`` (the figure the gate compares),
    oldest night first."""
    series: dict[tuple[str, str], dict[int, float]] = {}
    ordered = list(reversed(found))
    for i, night in enumerate(ordered):
        for step in night["steps"]:
            for key, value in step["gate"].items():
                if key.startswith("candidate_"):
                    series.setdefault((step["name"], key), {})[i] = value
    labels = [str(n["run"]["started_at"])[:16] for n in ordered]
    return [
        draw.chart(f"{step} {key}", [(labels[i], values.get(i)) for i in range(len(ordered))])
        for (step, key), values in sorted(series.items())
    ]


async def page(ctx: Ctx) -> Response:
    command = ctx.request.query_params.get("command") or None
    rows = (await ctx.call("runs", {"command": command, "limit": 200})).data
    found = nights(rows if command in (None, "nightly") else (await ctx.call("runs", {"command": "nightly"})).data)
    return ctx.render("runs.html", rows=rows, nights=found, charts=gate_charts(found), command=command or "")


ROUTES = [("/runs", page, ["GET"])]
