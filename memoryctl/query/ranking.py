"""Ranking: the hydrated candidates of a plan ordered by the plan's ranking rule.

Pure functions over what the executor found and PostgreSQL hydrated; no store call here (the one
the conversational context needs, the turns written after each candidate, is made by the
hydration, ``memoryctl.query.hydrate``, and handed in). The rule comes with the plan
(``memoryctl.query.plan``), never from which scores a candidate happens to carry:

- ``ByRelevance`` (text): the fused relevance of the text legs (``fusion.relevance``), with the
  session's support (``query/sessions.py``) and the named-entity leg averaged in
  (``fusion.with_named``), each candidate read with its context (``query/turns.py``), and, with a
  half-life, recency as a bounded preference within a band of the relevance's spread
  (``fusion.rank_score``);
- ``ByFusedRank`` (``or``): the legs' reciprocal rank fusion as the executor computed it;
- ``NewestFirst``: every hit scores 1.0 and the tie rule orders them newest first.

Exactly equal scores go to the newer memory, then the lower id (``order``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, assert_never

from memoryctl.query import dates, sessions
from memoryctl.query.fusion import TEXT_LEGS, names_any, rank_score, recency, spread, with_named, with_preference
from memoryctl.query.plan import ByFusedRank, ByRelevance, NewestFirst, Ranking
from memoryctl.query.results import Hit
from memoryctl.query.spec import MemoryQuery
from memoryctl.query.turns import in_context
from memoryctl.stores import names

if TYPE_CHECKING:
    from memoryctl.model import Memory

Ranked = list[tuple[uuid.UUID, dict[str, float]]]  # candidates and their score parts, best first
Scored = list[tuple["Memory", dict[str, float]]]  # hydrated candidates and their score parts


@dataclass(slots=True)
class Turns:
    """The candidates' conversational context: per memory, the candidates written just before it;
    and the memories that joined the candidates as a candidate's following turns."""

    before: dict[uuid.UUID, list[uuid.UUID]] = field(default_factory=dict)
    added: set[uuid.UUID] = field(default_factory=set)


def with_context(
    rule: ByRelevance, window: Ranked, following: Mapping[uuid.UUID, Sequence[uuid.UUID]]
) -> tuple[Ranked, Turns]:
    """The candidates, with the memories written just after one of them (``following``) added at
    the floor of their relevance when the rule lets them join, and per memory the candidates
    written just before it, its context. The context's other memories are no candidates and
    would score the floor anyway. Under a graph filter or a threshold, which the neighbours were
    not checked against, nothing joins: there the context only reorders."""
    turns = Turns()
    for mid, after in following.items():
        for n in after:
            turns.before.setdefault(n, []).append(mid)
    if not rule.context_adds:
        return window, turns
    turns.added = turns.before.keys() - {i for i, _ in window}
    floor = min(s["relevance"] for _, s in window)
    return [*window, *((n, {"relevance": floor}) for n in sorted(turns.added))], turns


def rank(rule: Ranking, q: MemoryQuery, live: Scored, turns: Turns, graph_source: str) -> list[Hit]:
    """The hits of ``live`` (hydrated, in scope) scored by ``rule``, best first. ``graph_source``
    names where the graph's part came from (the graph store, or PostgreSQL mentions)."""
    match rule:
        case ByRelevance():
            live = _in_context(_dated(rule, _entities_named(rule, q, _sessions(rule, live))), turns)
            scored = _by_relevance(rule, live)
        case ByFusedRank():
            scored = [(m, parts, parts["rrf"]) for m, parts in live]  # ties newest first, below
        case NewestFirst():
            scored = [(m, parts, 1.0) for m, parts in live]  # ordered by time alone, below
        case _:
            assert_never(rule)
    hits = [Hit(m.id, score, parts, m, _sources(parts, graph_source)) for m, parts, score in scored]
    hits.sort(key=order)
    return hits


def _by_relevance(rule: ByRelevance, live: Scored) -> list[tuple[Memory, dict[str, float], float]]:
    """Relevance first, recency (with a half-life) within a band of the relevance's spread."""
    if rule.half_life is None:
        return [(m, dict(s), s["relevance"]) for m, s in live]
    newest = max(m.created_at for m, _ in live)
    band = spread([s["relevance"] for _, s in live])
    out = []
    for m, s in live:
        parts = {**s, "recency": recency(m.created_at, newest, rule.half_life)}
        out.append((m, parts, rank_score(s["relevance"], parts["recency"], band)))
    return out


def _sessions(rule: ByRelevance, live: Scored) -> Scored:
    """With session-level context (``query/sessions.py``), the text relevance with one more leg
    averaged in: how much the other candidates of each candidate's session match the question;
    the candidates with any support get ``session``, that share, in their scores."""
    if not rule.sessions or len(live) < 2:
        return live
    backing = sessions.support([s["relevance"] for _, s in live], [(m.agent_id, m.created_at) for m, _ in live])
    fused = with_preference([s["relevance"] for _, s in live], backing, len(TEXT_LEGS))
    return [
        (m, {**s, "relevance": r, **({"session": round(b, 3)} if b > 0 else {})})
        for (m, s), r, b in zip(live, fused, backing, strict=True)
    ]


def _entities_named(rule: ByRelevance, q: MemoryQuery, live: Scored) -> Scored:
    """The relevance with the named-entity leg averaged in (``fusion.with_named``); the
    candidates that mention an entity the question names get ``entity`` 1.0 in their scores."""
    if not rule.named or not live:
        return live
    assert q.text is not None  # the planner names entities only in a question with words
    said = [names_any(q.text, (e.name for e in m.entities)) for m, _ in live]
    fused = with_named([s["relevance"] for _, s in live], said)
    return [
        (m, {**s, "relevance": r, **({"entity": 1.0} if n else {})})
        for (m, s), r, n in zip(live, fused, said, strict=True)
    ]


def _dated(rule: ByRelevance, live: Scored) -> Scored:
    """With the times the question names (``query/dates.py``), the relevance with one more leg
    averaged in: how close each memory's time is to them (``fusion.with_preference``); the
    candidates written inside a named time get ``dated`` 1.0, the others their closeness."""
    if not rule.dated or not live:
        return live
    close = [dates.closeness(m.created_at, rule.dated) for m, _ in live]
    named = ["entity" in s for _, s in live]
    legs = len(TEXT_LEGS) + (any(named) and not all(named))  # the named-entity leg, when it voted
    fused = with_preference([s["relevance"] for _, s in live], close, legs)
    return [(m, {**s, "relevance": r, "dated": round(c, 3)}) for (m, s), r, c in zip(live, fused, close, strict=True)]


def _in_context(live: Scored, turns: Turns) -> Scored:
    """The candidates that their context lifts get the passage's relevance (``turns.in_context``)
    and ``context``, the same figure, in their scores; an added memory that its context did not
    lift is dropped (neither leg returned it).

    When the question names an entity that some candidates mention (``entity``, the named-entity
    leg), the context lifts only those: a question about Maria is answered by what Maria said or
    what is about her, and the other party's reply after her turn ("wow, that's great!") is context,
    not an answer. Lifted anyway, such replies took a place in the top 10 for each of her turns,
    and a question whose answer is spread over several of her turns (a list: "What European
    countries has Maria been to?") lost the second half of its answers (measured:
    docs/retrieval.md, "Conversational context")."""
    if not turns.before:
        return live
    lifted = in_context({m.id: s["relevance"] for m, s in live}, turns.before)
    named = {m.id for m, s in live if "entity" in s}
    if named and len(named) < len(live):
        lifted = {i: v for i, v in lifted.items() if i in named}
    return [
        (m, {**s, "relevance": lifted[m.id], "context": lifted[m.id]} if m.id in lifted else s)
        for m, s in live
        if m.id in lifted or m.id not in turns.added
    ]


def _sources(parts: Mapping[str, float], graph_source: str) -> list[str]:
    """The stores a hit came from: PostgreSQL always (it hydrated), the vector store when its leg
    returned the hit, the graph when the hit passed its filter."""
    sources = [names.POSTGRES]
    if "vector" in parts:
        sources.append(names.QDRANT)
    if "graph" in parts:
        sources.append(graph_source)
    return sources


def order(hit: Hit) -> tuple[float, float, uuid.UUID]:
    """Score first; an exactly equal score goes to the newer memory, then to the lower id. One rule
    with and without a half-life (recency only ever adds to the newer one's score), so a tie never
    depends on the order in which the stores listed it."""
    return (-hit.score, -hit.memory.created_at.timestamp(), hit.id)
