"""The executor: runs a plan's shape and returns its ranked candidates, not yet hydrated.

One function per shape (``memoryctl.query.plan``), chosen by matching on the shape's class. Every
store call goes through ``StoreCalls`` (a timed, guarded step of the query). Text is searched by
two legs in parallel under one scope, the vector search and the lexical search in PostgreSQL,
fused into one relevance (``memoryctl.query.fusion``); when one leg fails (the vector store, or
the lexical statement times out) the other ranks alone, and when the graph fails the graph
filter falls back to the ``entities`` column (one hop, mentions only). Either way the answer
names what was degraded. ``threshold`` is a floor on cosine similarity inside the vector search.
What the candidates' scores become is the ranking's business (``memoryctl.query.ranking``).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import assert_never

from memoryctl.deadline import Call
from memoryctl.errors import MemoryctlError
from memoryctl.query.calls import Leg, StoreCalls
from memoryctl.query.fusion import RRF_K, LegScale, relevance, rrf, text_scales
from memoryctl.query.plan import (
    AnyOf,
    Figures,
    GraphFirst,
    GraphOnly,
    GraphThenPostgres,
    PostgresFilter,
    PostgresOnly,
    Shape,
    TextSearch,
    VectorFirst,
    VectorSearch,
)
from memoryctl.query.ranking import Ranked
from memoryctl.stores import names

Legs = dict[str, Leg]  # per text leg: (id, raw score), best first


@dataclass(slots=True)
class Candidates:
    """What running a shape produced: the candidates and their score parts, best first (newest
    first for the shapes without a text ranking); the shape that ran (the chosen one, or its
    fallback); and the figures its plan line reports."""

    shape: Shape
    ranked: Ranked = field(default_factory=list)
    figures: Figures = field(default_factory=Figures)

    def describe(self) -> str:
        return self.shape.describe(self.figures)


def execute(shape: Shape, calls: StoreCalls) -> Candidates:
    """Run ``shape``; a store that fails degrades the answer where the shape has a fallback."""
    match shape:
        case VectorSearch():
            ranked = search(shape.search, calls)
            return Candidates(shape, _recheck(ranked, calls) if shape.recheck else ranked)
        case PostgresOnly():
            return Candidates(shape, _newest(shape.filter, calls, None))
        case GraphOnly():
            ids, fell_back = calls.traverse(shape.traverse)
            if not fell_back:
                return Candidates(shape, [(i, {"graph": 1.0}) for i in ids], Figures(candidates=len(ids)))
            ranked = _newest(shape.fallback, calls, ids) if ids else []
            return Candidates(shape, ranked, Figures(candidates=len(ids), fell_back=True))
        case GraphThenPostgres():
            ids, fell_back = calls.traverse(shape.traverse)
            ranked = _newest(shape.filter, calls, ids) if ids else []
            return Candidates(shape, ranked, Figures(candidates=len(ids), fell_back=fell_back))
        case GraphFirst():
            ids, fell_back = calls.traverse(shape.traverse)
            ran = Candidates(shape, figures=Figures(candidates=len(ids), fell_back=fell_back))
            if ids:
                ranked = [(i, {**s, "graph": 1.0}) for i, s in search(shape.search, calls, ids)]
                ran.ranked = _recheck(ranked, calls) if shape.recheck else ranked
            return ran
        case VectorFirst():
            found = _vector_first(shape, calls)
            if found is None:
                return execute(shape.fallback, calls)
            connected, kept = found
            return Candidates(shape, kept, Figures(kept=connected))
        case AnyOf():
            return Candidates(shape, _any_of(shape, calls))
        case _:
            assert_never(shape)


def _newest(stage: PostgresFilter, calls: StoreCalls, ids: Sequence[uuid.UUID] | None) -> Ranked:
    """PostgreSQL's filter as the ranking (newest first), among ``ids`` when given; each row
    carries the stage's tag into fusion and the hit's sources."""
    tag = {stage.tag: 1.0} if stage.tag else {}
    return [(i, dict(tag)) for i, _ in calls.filter(ids, limit=stage.limit, with_where=stage.with_where)]


def _recheck(ranked: Ranked, calls: StoreCalls) -> Ranked:
    """The ranked hits that pass the where clauses the vector payload cannot answer exactly,
    checked in PostgreSQL, in their order."""
    if not ranked:
        return ranked
    keep = {i for i, _ in calls.filter([i for i, _ in ranked], limit=len(ranked))}
    return [(i, s) for i, s in ranked if i in keep]


def _any_of(shape: AnyOf, calls: StoreCalls) -> Ranked:
    """The legs in parallel threads, each with steps of its own; a failed leg is a note, not a
    failed query. Fused by RRF: the graph and where legs are sets (their newest-first order is not
    relevance), so only the text leg ranks and membership in more legs lifts a memory."""
    legs: dict[str, Ranked] = {}
    leg_calls = {name: calls.leg() for name, _ in shape.legs}

    def run_leg(name: str, leg: Shape) -> None:
        try:
            legs[name] = execute(leg, leg_calls[name]).ranked
        except MemoryctlError as exc:
            legs[name] = []
            calls.ctx.note(f"{name} leg failed: {exc.message}")

    # No deadline of their own: each store call of a leg is under its store's timeout. A leg's
    # store failure is a note (run_leg); anything else is a bug, raised here rather than lost.
    running = [Call(partial(run_leg, *leg), name=f"leg-{leg[0]}") for leg in shape.legs]
    for leg_call in running:
        leg_call.wait()
        leg_call.outcome()
    for name, _ in shape.legs:
        calls.ctx.steps.extend(leg_calls[name].ctx.steps)
    fused = rrf({name: [i for i, _ in res] for name, res in legs.items()}, membership=frozenset({"graph", "where"}))
    raw = {name: dict(res) for name, res in legs.items()}
    ranked: Ranked = []
    for mid, parts in fused.items():
        scores: dict[str, float] = {}
        for name in parts:
            scores.update(raw[name][mid])
        scores["rrf"] = sum(parts.values())
        ranked.append((mid, scores))
    ranked.sort(key=lambda pair: -pair[1]["rrf"])
    with calls.ctx.step(
        "fuse", "engine", {"method": "rrf", "k": RRF_K, "legs": {n: len(r) for n, r in legs.items()}}
    ) as s:
        s.rows_in, s.rows_out = sum(len(r) for r in legs.values()), len(ranked)
    return ranked


def _vector_first(shape: VectorFirst, calls: StoreCalls) -> tuple[int, Ranked] | None:
    """How many of the top K are connected and the best of them, or None when that cannot be
    the exact answer.

    Exact when at least ``depth`` of the top K are connected: every memory outside the top K
    scores lower than all of them. If the search returned fewer than K, it saw the whole scope.
    """
    # The start's one-hop entity neighbours do not depend on the candidates: fetched while the
    # vector search runs, so the verification below is one round trip over the candidates.
    near_call = calls.start_near_entities(shape.traverse)
    legs = _legs(shape.search, calls)
    candidates = list(dict.fromkeys(i for hits in legs.values() for i, _ in hits))
    try:
        near = near_call.wait()
        near_call.step.rows_out = None if near is None else len(near)
        connected = calls.connected(shape.traverse, candidates, near)
    except MemoryctlError as exc:
        calls.ctx.note(f"vector-first: verification failed ({exc.message}); graph-first instead")
        return None
    # Each leg's connected hits in its own order, cut where graph-first's leg would cut: the
    # same lists graph-first fuses, hence the same relevance, whenever each leg either has
    # ``depth`` connected hits in its top K or returned fewer than K (it saw its whole scope).
    kept = {name: [(i, v) for i, v in hits if i in connected][: shape.depth] for name, hits in legs.items()}
    short = [n for n, hits in legs.items() if len(kept[n]) < shape.depth and len(hits) >= shape.k]
    if short:
        calls.ctx.note(
            f"vector-first: fewer than the {shape.depth} needed of the top {shape.k} are connected"
            f" ({', '.join(f'{n} {len(kept[n])}' for n in short)}); graph-first instead"
        )
        return None
    ranked = [(i, {**parts, "graph": 1.0}) for i, parts in _fuse(kept, shape.depth, calls)]
    return len(connected), ranked[: shape.depth]


# ---- the text search ---------------------------------------------------------------------------
def search(stage: TextSearch, calls: StoreCalls, ids: Sequence[uuid.UUID] | None = None) -> Ranked:
    """The text search: its legs in parallel under one scope (``ids``: the graph's candidates),
    fused into one relevance; with ``stage.within``, the same legs asked again within the time the
    question names, and the candidates of both kept (``_with_scoped``)."""
    legs = _legs(stage, calls, ids)
    if stage.within is None or stage.filter is None or not legs:
        return _fuse(legs, stage.depth, calls)
    return _with_scoped(stage, legs, calls, ids)


def _with_scoped(stage: TextSearch, legs: Legs, calls: StoreCalls, ids: Sequence[uuid.UUID] | None) -> Ranked:
    """The time-scoped second search (``dates.scope``) merged into the first one's legs.

    Both searches score alike where they can: the dense leg's cosines are the same question's
    against the same vectors. The lexical leg weighs words over its own scope, so within a time its
    scores are not the whole scope's; a memory only the scoped search found was below the first
    search's lexical cut, and scores at most that cut's lowest hit. One fusion ranks the union; the
    candidates kept are the first ``depth`` of it and the first ``depth`` the scoped search found
    (the plan's window holds both), so the ranking's time preference reads the named time's best
    matches however low the whole scope put them. The scoped search failing costs only itself."""
    assert stage.within is not None and stage.filter is not None
    scoped_calls = calls.within(*stage.within)
    lo, hi = scoped_calls.q.since, scoped_calls.q.until
    assert lo is not None and hi is not None  # StoreCalls.within sets both
    flt = dataclasses.replace(stage.filter, created_from=lo, created_to=hi)
    scoped_stage = dataclasses.replace(stage, filter=flt, within=None)
    try:
        scoped = _legs(scoped_stage, scoped_calls, ids) if lo < hi else {}
    except MemoryctlError as exc:
        calls.ctx.note(f"the search within the named time failed ({exc.message}): the first search ranks alone")
        scoped = {}
    merged: Legs = {}
    for name in [*legs, *(n for n in scoped if n not in legs)]:
        first = legs.get(name, [])
        seen = {i for i, _ in first}
        cut = min((v for _, v in first), default=None) if name == "lexical" else None
        added = [(i, v if cut is None else min(v, cut)) for i, v in scoped.get(name, []) if i not in seen]
        merged[name] = first + added
    # Standardised as the first search's legs are: whether its lexical leg was cut decides the floor.
    ranked = _fuse(merged, stage.depth, calls, text_scales(legs, stage.depth))
    found = {i for hits in scoped.values() for i, _ in hits}
    within = [i for i, _ in ranked if i in found][: stage.depth]
    keep = {i for i, _ in ranked[: stage.depth]} | set(within)
    return [r for r in ranked if r[0] in keep]


def _legs(stage: TextSearch, calls: StoreCalls, ids: Sequence[uuid.UUID] | None = None) -> Legs:
    """Each leg's ranked (id, raw score) list. A failed leg degrades the answer instead of
    failing it: the other leg answers alone (asked for now if the query wanted only the failed
    one). Only when neither can answer does the query fail."""
    ctx = calls.ctx
    if stage.filter is None:
        ctx.note("the where clauses contradict each other: nothing can match")
        return {}
    among = ids if stage.among_candidates else None
    lexical_call = calls.start_lexical(stage, among) if "lexical" in stage.legs else None
    legs: Legs = {}
    if "vector" in stage.legs:
        try:
            legs["vector"] = calls.dense(stage, among)
        except MemoryctlError as exc:
            if calls.q.text is None:
                ctx.degrade(
                    names.QDRANT,
                    f"qdrant unavailable ({exc.message}); a raw vector has no lexical leg to fall back to",
                )
                return {}
            ctx.degrade(names.QDRANT, f"qdrant unavailable ({exc.message}); text ranked by the lexical leg alone")
            if lexical_call is None:
                lexical_call = calls.start_lexical(stage, among, fallback=True)
    if lexical_call is not None:
        try:
            legs["lexical"] = lexical_call.wait()
        except MemoryctlError as exc:
            if "vector" in stage.legs and "vector" not in legs:
                raise  # the dense leg failed too: nothing to rank by
            ctx.degrade(names.LEXICAL, f"lexical leg failed ({exc.message}); text ranked by the dense leg alone")
            if "vector" not in legs:
                legs["vector"] = calls.dense(stage, among, fallback=True)
    if stage.threshold is not None and "lexical" in legs and "vector" in legs:
        # The threshold is a floor on cosine similarity: only the vector leg's hits pass it.
        passed = {i for i, _ in legs["vector"]}
        legs["lexical"] = [(i, v) for i, v in legs["lexical"] if i in passed]
    return legs


def _fuse(legs: Legs, depth: int, calls: StoreCalls, scales: dict[str, LegScale] | None = None) -> Ranked:
    """One relevance per candidate (z-scores over the union, see ``fusion.relevance``), best first."""
    detail = {"method": "z-score mean", "legs": {n: len(r) for n, r in legs.items()}}
    with calls.ctx.step("fuse", "engine", detail) as s:
        parts = relevance(legs, text_scales(legs, depth) if scales is None else scales)
        # Stable: equal relevance keeps the legs' own order (the vector leg's first).
        ranked = sorted(parts.items(), key=lambda kv: -kv[1]["relevance"])
        s.rows_in, s.rows_out = sum(len(r) for r in legs.values()), len(ranked)
    return ranked
