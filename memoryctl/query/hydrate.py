"""From ranked candidates to hits: the conversational context, hydration, ranking, relationships.

PostgreSQL is the truth: a candidate whose row is deleted, of another agent or outside the time
range (a lagging secondary store still returned it) never leaves the engine. The ranking itself
is ``memoryctl.query.ranking``; this module makes the store calls around it:

- the turns written just after each candidate, when the rule reads candidates in their context;
- the rows, while the graph is asked for the likely hits' relationships in parallel (both are
  single round trips of similar cost, so one of them leaves the critical path); a hit that guess
  missed (a vetoed row moved another one up) is asked for afterwards.
"""

from __future__ import annotations

from memoryctl.errors import MemoryctlError
from memoryctl.query import ranking
from memoryctl.query.calls import Relationships, StoreCalls
from memoryctl.query.context import Running
from memoryctl.query.plan import ByRelevance, Plan
from memoryctl.query.ranking import Ranked, Scored, Turns
from memoryctl.query.results import Hit


def hits(plan: Plan, ranked: Ranked, calls: StoreCalls) -> list[Hit]:
    """The plan's first ``limit`` hits out of ``ranked``, hydrated, ranked, with relationships."""
    if not ranked:
        return []
    q = calls.q
    window, turns = ranked[: plan.window], Turns()
    rule = plan.ranking
    if isinstance(rule, ByRelevance) and rule.context_turns:
        following = calls.following([i for i, _ in window], rule.context_turns)
        window, turns = ranking.with_context(rule, window, following)
    ids = [i for i, _ in window]
    early = calls.start_relationships(ids[: plan.limit])
    rows = calls.hydrate(ids)
    graph_name = calls.stores.graph_name
    graph_source = graph_name if not calls.ctx.is_degraded(graph_name) else "postgres-mentions"
    live: Scored = [
        (m, scores)
        for m, scores in ((rows.get(mid), scores) for mid, scores in window)
        if m is not None
        and (q.agent_id is None or m.agent_id == q.agent_id)
        and not (q.since and m.created_at < q.since)
        and not (q.until and m.created_at >= q.until)
    ]
    found = ranking.rank(rule, q, live, turns, graph_source)[: plan.limit]
    _relationships(found, calls, early)
    return found


def _relationships(found: list[Hit], calls: StoreCalls, early: Running[Relationships] | None) -> None:
    """Each hit's relationships; the graph failing here degrades the answer, not fails it."""
    graph_name = calls.stores.graph_name
    if not found or calls.ctx.is_degraded(graph_name):
        return
    rels: Relationships = {}
    try:
        if early is not None:
            rels = early.wait()
        missing = [h.id for h in found if h.id not in rels]
        if missing:
            rels = {**rels, **calls.relationships(missing)}
    except MemoryctlError:
        calls.ctx.degrade(graph_name)
        return
    for h in found:
        h.relationships = rels.get(h.id, [])
