"""Fusing ranked lists and decaying by age.

Why reciprocal rank fusion (RRF) for ``or``: the legs' scores are not on one scale — cosine
similarity from Qdrant, hop distance from the graph, recency from PostgreSQL — and normalising
them (min-max per query) makes a leg's best hit score 1.0 however weak it is, so a poor leg can
outvote a strong one. RRF only uses ranks, needs no calibration, and rewards memories that several
legs agree on; k = 60 is the constant from Cormack et al. (2009) and keeps the top few ranks of
every leg competitive.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

RRF_K = 60


def rrf(legs: Mapping[str, Sequence[uuid.UUID]], k: int = RRF_K) -> dict[uuid.UUID, dict[str, float]]:
    """Per id: each leg's RRF contribution; the fused score is their sum."""
    parts: dict[uuid.UUID, dict[str, float]] = {}
    for leg, ids in legs.items():
        for rank, mid in enumerate(ids, start=1):
            parts.setdefault(mid, {})[leg] = 1.0 / (k + rank)
    return parts


def decay(created_at: datetime, now: datetime, half_life: timedelta | None) -> float:
    """0.5 ** (age / half_life); 1.0 without a half-life. Future timestamps are not boosted."""
    if half_life is None:
        return 1.0
    age = max(0.0, (now - created_at).total_seconds())
    return math.pow(0.5, age / half_life.total_seconds())
