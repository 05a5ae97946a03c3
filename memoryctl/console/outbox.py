"""The Outbox page: deliveries waiting (per store, from ``health``'s outbox component) and those
set aside with their errors (``outbox list``); retry and drop are POST forms with the session's
CSRF token that run ``outbox retry`` / ``outbox drop`` -- the operations the command line runs --
recorded in the runs log with the caller's name. Operator only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.responses import RedirectResponse

from memoryctl.console.web import PREFIX, Refused

if TYPE_CHECKING:
    from starlette.responses import Response

    from memoryctl.console.web import Ctx


async def page(ctx: Ctx) -> Response:
    health = (await ctx.call("health", {"deadline": 3.0})).data
    rows = (await ctx.call("outbox list", {"limit": 1000})).data
    done = ctx.request.query_params.get("done")
    return ctx.render("outbox.html", queue=health["components"].get("outbox") or {}, rows=rows, done=done)


def picked(form: dict[str, list[str]]) -> dict[str, Any]:
    if form.get("all") == ["1"]:
        return {"all": True}
    try:
        rows = [int(r) for r in form.get("row", [])]
    except ValueError:
        raise Refused(400, "outbox rows are numbers") from None
    if not rows:
        raise Refused(400, "pick rows to act on, or all")
    return {"rows": rows}


async def retry(ctx: Ctx) -> Response:
    reply = await ctx.act("outbox retry", picked(await ctx.form()))
    return RedirectResponse(f"{PREFIX}/outbox?done=retried+{reply.data['retried']}", 303)


async def drop(ctx: Ctx) -> Response:
    reply = await ctx.act("outbox drop", picked(await ctx.form()))
    return RedirectResponse(f"{PREFIX}/outbox?done=dropped+{reply.data['dropped']}", 303)


ROUTES = [("/outbox", page, ["GET"]), ("/outbox/retry", retry, ["POST"]), ("/outbox/drop", drop, ["POST"])]
