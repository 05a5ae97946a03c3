"""The Stats page: ``memoryctl stats`` as a chart per agent and metric -- the count of memories per
bucket, and the metric's mean when one is named. An agent token charts its own agent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memoryctl.console import draw

if TYPE_CHECKING:
    from starlette.responses import Response

    from memoryctl.console.web import Ctx

MAX_AGENTS = 12


async def page(ctx: Ctx) -> Response:
    args = ctx.request.query_params
    form = {k: args.get(k, "").strip() for k in ("agents", "metric", "bucket", "since", "kind")}
    agents: list[str | None] = [a.strip() or None for a in form["agents"].split(",") if a.strip()][:MAX_AGENTS]
    if ctx.caller.agent is not None:
        agents = [ctx.caller.agent]
    params: dict[str, Any] = {k: form[k] for k in ("metric", "bucket", "since", "kind") if form[k]}
    panels = []
    for agent in agents or [None]:  # None: every agent (the operator), or the token's own
        scope = {"agent": agent} if agent else {"all_agents": ctx.caller.operator}
        data = (await ctx.call("stats", {**params, **scope})).data
        series = [(b["bucket"][:16], float(b["count"])) for b in data["buckets"]]
        panel = {
            "agent": agent or "every agent",
            "data": data,
            "counts": draw.bars(f"{agent or 'every agent'}: memories", series),
        }
        if data["metric"]:
            panel["metric"] = draw.chart(
                f"{agent or 'every agent'}: mean {data['metric']}",
                [(b["bucket"][:16], b.get("avg")) for b in data["buckets"]],
            )
        panels.append(panel)
    return ctx.render("stats.html", form=form, panels=panels)


ROUTES = [("/stats", page, ["GET"])]
