"""Putting scores from different legs and models on one scale, and preferring recent memories
only among comparably relevant ones.

**Text queries (hybrid).** The dense leg scores by cosine similarity, whose range depends on the
model (multilingual-e5 puts unrelated pairs at 0.66-0.79, MiniLM near 0); the lexical leg by a
BM25-style sum of inverse document frequencies, unbounded. ``relevance`` standardises each leg
over the candidates of this query (the union of what the legs returned): a z-score says how far
above this query's typical candidate a memory is, in that leg's own spread, whatever the model or
the scoring function. A candidate one leg did not return gets that leg's floor (lexical: 0, no
shared word; dense: the lowest score the leg returned, an upper bound of what it would score).
Each z is clipped to ±3 so that no leg can outvote the other on one outlier, and the legs are
averaged with equal weights: standardised legs are exchangeable, and unequal weights would be a
constant tuned to one data set (0.4/0.6 were within noise of 0.5 on both families of
``benchmarks/recall.py``). Min-max normalisation was rejected because it gives a leg's best hit
1.0 however weak it is; z-scores of a flat leg stay near 0.

**Recency.** ``rank_score`` adds a bounded preference for newer memories to the relevance:
``relevance + RECENCY_WEIGHT * 0.5 ** (age / half_life)`` with the age counted from the newest
candidate (so the order does not depend on when the query runs). The recency term lies in (0, 1],
so a memory more relevant by more than ``RECENCY_WEIGHT`` (in standard deviations of relevance)
always ranks first, however old; among memories within that band, the newer wins. The previous
multiplier, ``score * 0.5 ** (age / half_life)``, let a five-day-older answer lose to anything
newer, because cosine scores differ by a few hundredths while the decay halved every month.

**``or`` queries: reciprocal rank fusion (RRF)** across legs (text, graph, where): their scores
are not on one scale (a hop count, a match) and RRF uses ranks only (k = 60, Cormack et al.
2009). The graph and where legs only say "member or not": their order (newest first) is not a
relevance, so every member gets the contribution of rank 1 and only the text leg ranks.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

RRF_K = 60
Z_CLIP = 3.0
# In standard deviations of relevance: the largest gap recency may close. A tie-breaker among
# near-equal relevance (near-duplicates, a fact restated): on benchmarks/recall.py a band of 0.25
# cost 0.01-0.02 recall@10 and 0.1 up to 0.01 (memories a tenth of a deviation apart are not
# "equally relevant" yet), where evidence is spread over months and the newer is not the answer.
RECENCY_WEIGHT = 0.05


def rrf(
    legs: Mapping[str, Sequence[uuid.UUID]], k: int = RRF_K, *, membership: frozenset[str] = frozenset()
) -> dict[uuid.UUID, dict[str, float]]:
    """Per id: each leg's RRF contribution; the fused score is their sum. Legs named in
    ``membership`` are sets: every member gets the contribution of rank 1."""
    parts: dict[uuid.UUID, dict[str, float]] = {}
    for leg, ids in legs.items():
        for rank, mid in enumerate(ids, start=1):
            parts.setdefault(mid, {})[leg] = 1.0 / (k + (1 if leg in membership else rank))
    return parts


def _z(values: Sequence[float]) -> list[float]:
    """Standard scores, clipped to ±Z_CLIP; all 0 when the values do not spread (nothing to tell)."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    if var <= 1e-18:
        return [0.0] * n
    sd = math.sqrt(var)
    return [max(-Z_CLIP, min(Z_CLIP, (v - mean) / sd)) for v in values]


def relevance(
    legs: Mapping[str, Sequence[tuple[uuid.UUID, float]]], floors: Mapping[str, float | None]
) -> dict[uuid.UUID, dict[str, float]]:
    """Per candidate: each leg's raw score (where it returned one) and ``relevance``, the mean of
    the legs' clipped z-scores over the union of candidates. ``floors[leg]`` is the score a
    candidate the leg did not return is given (None: the lowest score the leg returned)."""
    scored = {leg: dict(hits) for leg, hits in legs.items() if hits}
    ids = list(dict.fromkeys(i for hits in legs.values() for i, _ in hits))
    parts: dict[uuid.UUID, dict[str, float]] = {i: {} for i in ids}
    if not ids:
        return parts
    for leg, got in scored.items():
        floor = floors.get(leg)
        fill = min(got.values()) if floor is None else floor
        for i, z in zip(ids, _z([got.get(i, fill) for i in ids]), strict=True):
            parts[i]["relevance"] = parts[i].get("relevance", 0.0) + z / len(scored)
            if i in got:
                parts[i][leg] = got[i]
    return parts


def recency(created_at: datetime, newest: datetime, half_life: timedelta | None) -> float:
    """0.5 ** (age / half_life), the age counted from the newest candidate; 0 without a half-life."""
    if half_life is None:
        return 0.0
    age = max(0.0, (newest - created_at).total_seconds())
    return math.pow(0.5, age / half_life.total_seconds())


def rank_score(relevance_: float, recency_: float) -> float:
    """Relevance first; recency reorders only memories within RECENCY_WEIGHT of each other."""
    return relevance_ + RECENCY_WEIGHT * recency_
