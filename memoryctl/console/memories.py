"""The Memories pages: search with the options of ``memoryctl query`` and its plan (``--explain``)
drawn with per-store timings; a memory's page (``get``) with its entities, relations and graph
neighbourhood drawn as SVG (and, when asked, the other memories that mention its entities: a
``query --entity`` each), whether each store answers for it, the outbox rows set aside for it, and
``forget``.

An agent token searches and opens its own agent's memories only: ``bind`` fills in its agent, so
another agent's memory is "no such memory" (404), as over HTTP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.responses import RedirectResponse

from memoryctl.console import draw
from memoryctl.console.web import PREFIX
from memoryctl.declaration.table import QUERY
from memoryctl.errors import MemoryctlError
from memoryctl.model import parse_uuid

if TYPE_CHECKING:
    from starlette.datastructures import QueryParams
    from starlette.responses import Response

    from memoryctl.console.web import Ctx

LISTS = {"via", "where"}  # one per line (or comma for via) in the form
NEIGHBOURS_PER_ENTITY, MAX_ENTITIES = 6, 6


def query_params(args: QueryParams) -> dict[str, Any]:
    """The search form as ``query``'s parameters: typed as the declaration says, blanks left out
    (the operation validates them, as for every surface)."""
    params: dict[str, Any] = {}
    for p in QUERY.params:
        raw = args.get(p.name, "").strip()
        if not raw:
            continue
        if p.name in LISTS:
            sep = "," if p.name == "via" else "\n"
            params[p.name] = [v.strip() for v in raw.split(sep) if v.strip()]
        elif p.type == "boolean":
            params[p.name] = raw in ("1", "on", "true", "yes")
        elif p.type == "integer":
            params[p.name] = _number(int, p.name, raw)
        elif p.type == "number":
            params[p.name] = _number(float, p.name, raw)
        else:
            params[p.name] = raw
    return params


def _number(kind: type, name: str, raw: str) -> Any:
    from memoryctl.errors import InputError

    try:
        return kind(raw)
    except ValueError:
        raise InputError(f"{name}: {raw!r} is not a number") from None


async def search(ctx: Ctx) -> Response:
    args = ctx.request.query_params
    form = {p.name: args.get(p.name, "") for p in QUERY.params}
    result, plan = None, None
    if any(v.strip() for k, v in form.items() if k in ("text", "entity", "since", "until", "where")):
        result = (await ctx.call("query", query_params(args))).data
        plan = draw.plan(result["explain"]["steps"])
    return ctx.render("memories.html", form=form, params=QUERY.params, result=result, plan=plan)


async def neighbourhood(ctx: Ctx, memory: dict[str, Any], wide: bool) -> tuple[draw.Graph, dict[str, bool]]:
    """The memory, its entities and relations; with ``wide``, also the memories that mention its
    entities (a ``query --entity`` each: ~50-80 ms for an entity in 20,000 memories on the embedded
    profile, one per entity of the memory, so it is asked for, not run on every visit)."""
    mid = memory["id"]
    entities = [f"{e['type']}:{e['name']}" for e in memory["entities"]][:MAX_ENTITIES]
    centre = {"id": mid, "kind": "memory", "label": memory["text"][:40], "href": None}
    nodes = [{"id": e, "kind": "entity", "label": e, "href": None} for e in entities]
    edges = [(mid, "MENTIONS", e) for e in entities]
    for rel in memory["relations"]:
        a, b = _node(rel.get("from"), mid), _node(rel.get("to"), mid)
        edges.append((a, str(rel.get("type", "")), b))
    neighbours: dict[str, dict[str, Any]] = {}
    in_graph = False
    for entity in entities if wide else []:
        try:
            reply = await ctx.call(
                "query",
                {"entity": entity, "agent": memory["agent_id"], "limit": NEIGHBOURS_PER_ENTITY + 1, "hops": 1},
            )
        except MemoryctlError:
            continue
        for hit in reply.data["hits"]:
            if hit["id"] == mid:
                in_graph = in_graph or any(s in ("neo4j", "graph") for s in hit["sources"])
                continue
            neighbours.setdefault(
                hit["id"],
                {
                    "id": hit["id"],
                    "kind": "neighbour",
                    "label": hit["text"][:30],
                    "href": f"{PREFIX}/memories/{hit['id']}",
                },
            )
            edges.append((hit["id"], "MENTIONS", entity))
    found = {"graph": in_graph} if wide else {}
    drawn = draw.graph(centre, nodes, list(neighbours.values())[: NEIGHBOURS_PER_ENTITY * 2], edges)
    return drawn, found


def _node(spec: Any, mid: str) -> str:
    """A relation's end as a node id: ``this`` / ``memory:<uuid>`` the memory, else TYPE:NAME."""
    text = str(spec or "")
    if text in ("this", f"memory:{mid}", mid):
        return mid
    if isinstance(spec, dict):
        return f"{spec.get('type')}:{spec.get('name')}"
    return text


async def stores_answer(ctx: Ctx, memory: dict[str, Any], found: dict[str, bool]) -> dict[str, str]:
    """Per derived store, whether it answers for this memory now: the vector store with a dense
    query of its own text, the graph through its entities (above)."""
    state = {}
    try:
        reply = await ctx.call(
            "query", {"text": memory["text"][:500], "agent": memory["agent_id"], "retrieval": "dense", "limit": 20}
        )
        hit = next((h for h in reply.data["hits"] if h["id"] == memory["id"]), None)
        state["vector"] = "answers" if hit else "not found by a dense query of its own text"
        if reply.data["degraded"]:
            state["vector"] = f"degraded: {', '.join(reply.data['degraded'])}"
    except MemoryctlError as exc:
        state["vector"] = exc.message
    if not memory["entities"]:
        state["graph"] = "no entities to reach it through"
    elif "graph" in found:
        state["graph"] = "answers" if found["graph"] else "not found through its entities"
    else:
        state["graph"] = "asked with the memories that share its entities (below the graph)"
    return state


async def memory_page(ctx: Ctx) -> Response:
    mid = str(parse_uuid(ctx.request.path_params["id"]))
    memory = (await ctx.call("get", {"id": mid})).data
    wide = ctx.request.query_params.get("neighbours") == "1"
    graph, found = await neighbourhood(ctx, memory, wide)
    state = await stores_answer(ctx, memory, found)
    aside = None
    if ctx.caller.operator:
        aside = [r for r in (await ctx.call("outbox list", {"limit": 100_000})).data if str(r["memory_id"]) == mid]
    return ctx.render("memory.html", memory=memory, graph=graph, state=state, aside=aside, wide=wide)


async def forget(ctx: Ctx) -> Response:
    await ctx.form()
    mid = str(parse_uuid(ctx.request.path_params["id"]))
    await ctx.call("get", {"id": mid})  # another agent's memory: 404 before anything is done
    reply = await ctx.act("forget", {"ids": [mid]})
    return RedirectResponse(f"{PREFIX}/memories/{mid}?forgotten={len(reply.data['forgotten'])}", 303)


ROUTES = [
    ("/memories", search, ["GET"]),
    ("/memories/{id}", memory_page, ["GET"]),
    ("/memories/{id}/forget", forget, ["POST"]),
]
