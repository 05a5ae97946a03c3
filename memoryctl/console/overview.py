"""The Overview page: every component's health as ``memoryctl health`` sees it, the replication and
peers of a cluster (said "not in this profile" where there are none), alerts firing now, the last
run of each maintenance job and the backups' ages -- the ``health``, ``runs`` and ``backup status``
operations, run for the signed-in caller (an agent token sees the health only: the others are the
operator's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memoryctl.errors import MemoryctlError

if TYPE_CHECKING:
    from starlette.responses import Response

    from memoryctl.console.web import Ctx

JOBS = ("sync", "reconcile", "migrate", "reembed", "nightly", "backup qdrant", "restore qdrant", "rebuild graph")


def scalars(component: dict[str, Any]) -> list[tuple[str, Any]]:
    """A component's own figures that read as one line each (nested documents are drawn apart)."""
    skip = {"status", "error", "latency_ms"}
    return [(k, v) for k, v in component.items() if k not in skip and not isinstance(v, dict | list)]


async def optional(ctx: Ctx, name: str, params: dict[str, Any]) -> tuple[Any, str | None]:
    """An operation's data, or why it is not shown (an agent token, a store down) -- a section of
    the page, not the page's failure."""
    if not ctx.caller.operator:
        return None, "for an operator token"
    try:
        return (await ctx.call(name, params)).data, None
    except MemoryctlError as exc:
        return None, exc.message


async def page(ctx: Ctx) -> Response:
    health = (await ctx.call("health", {"deadline": 3.0})).data
    components: dict[str, dict[str, Any]] = health["components"]
    clusters = {name: c["cluster"] for name, c in components.items() if isinstance(c.get("cluster"), dict)}
    alerting = components.get("alerting")
    runs, runs_note = await optional(ctx, "runs", {"limit": 200})
    last: dict[str, dict[str, Any]] = {}
    for row in runs or []:
        last.setdefault(row["command"], row)
    backups, backups_note = await optional(ctx, "backup status", {})
    return ctx.render(
        "overview.html",
        health=health,
        components=components,
        scalars=scalars,
        clusters=clusters,
        alerting=alerting,
        last=[(job, last.get(job)) for job in (*JOBS, *sorted(set(last) - set(JOBS)))],
        runs_note=runs_note,
        backups=backups,
        backups_note=backups_note,
    )


ROUTES = [("/overview", page, ["GET"])]
