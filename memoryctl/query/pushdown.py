"""What each store can answer of a query: the vector search's filter, the graph traversal, and
how deep a leg ranks.

Push filters down, don't pull ids up: the agent scope, the time range and every ``where`` clause
the vector payload replicates go into the vector search's own filter; the rest is checked in
PostgreSQL on the ranked hits (``needs_postgres_filter``). Pure functions of the query, used by the
planner (``memoryctl.query.plan``) and by the benchmarks that run a plan's sub-queries alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from memoryctl.query.spec import MemoryQuery, Where
from memoryctl.stores.protocols import GraphTraversal, MetaCondition, VectorFilter

OVERFETCH = 2  # hits fetched per requested hit: PostgreSQL may veto a few (deleted since)
GRAPH_CANDIDATE_CAP = 100_000  # memories a traversal may hand to the next stage


def depth(q: MemoryQuery) -> int:
    """How many ranked candidates a leg produces for ``q.limit`` hits (a question that names a
    time adds a second search of its own depth within that time: ``dates.scope``)."""
    return q.limit * OVERFETCH + 10


def pushdown(q: MemoryQuery, *, with_where: bool, ids: Sequence[uuid.UUID] | None = None) -> VectorFilter | None:
    """The vector filter: agent scope, time range, and every ``where`` the payload can answer.

    None when the conditions contradict each other (nothing can match).
    """
    kinds: list[str] | None = None
    exclude: list[str] = []
    agent = q.agent_id
    created_from, created_to = q.since, q.until
    meta: list[MetaCondition] = []
    for w in q.where if with_where else []:
        if w.field == "kind":
            if w.op == "!=":
                exclude.append(w.value)
            else:
                wanted = set(w.value if w.op == "in" else [w.value])
                kinds = sorted(wanted if kinds is None else wanted & set(kinds))
                if not kinds:
                    return None
        elif w.field == "agent_id":
            # Only '=' narrows the scope here; '!=' and 'in' are checked in PostgreSQL afterwards.
            if w.op == "=":
                if agent is not None and agent != w.value:
                    return None  # contradiction: nothing can match
                agent = w.value
        elif w.field == "created_at":
            created_from, created_to = narrow_time(w, created_from, created_to)
        else:
            meta.append(MetaCondition(w.field[5:], w.op, w.value))
    return VectorFilter(
        agent_id=agent,
        ids=ids,
        kinds=kinds,
        exclude_kinds=exclude or None,
        created_from=created_from,
        created_to=created_to,
        meta=tuple(meta),
    )


def narrow_time(w: Where, lo: datetime | None, hi: datetime | None) -> tuple[datetime | None, datetime | None]:
    """The time window ``[lo, hi)`` narrowed by one ``created_at`` clause (``!=``/``in`` leave it)."""
    if w.op in (">", ">="):
        lo = w.value if lo is None else max(lo, w.value)
    elif w.op in ("<", "<="):
        hi = w.value if hi is None else min(hi, w.value)
    elif w.op == "=":
        lo = hi = w.value
    return lo, hi


def needs_postgres_filter(q: MemoryQuery) -> bool:
    """Where clauses the vector payload cannot answer exactly (checked again in PostgreSQL)."""
    return any(w.field in ("agent_id", "created_at") and w.op in ("!=", "in") for w in q.where)


def pushed_terms(q: MemoryQuery) -> tuple[str, ...]:
    """What the vector search's filter carries, in words, for the plan line."""
    terms = ["agent" if q.agent_id else "all agents"]
    if q.since or q.until:
        terms.append("time")
    return (*terms, *(f"{w.field} {w.op}" for w in q.where))


def traversal(q: MemoryQuery, *, newest_first: bool = False) -> GraphTraversal:
    """Nearest first with the candidate cap, or (graph only) the query's window newest first."""
    assert q.graph is not None and q.agent_id is not None  # MemoryQuery.validate refuses otherwise
    g = q.graph
    return GraphTraversal(
        agent_id=q.agent_id,
        start_key=g.entity.key(q.agent_id),
        relation_types=g.via,
        hops=g.hops,
        direction=g.direction,
        limit=depth(q) if newest_first else GRAPH_CANDIDATE_CAP,
        created_from=q.since if newest_first else None,
        created_to=q.until if newest_first else None,
        newest_first=newest_first,
    )
