"""Scores of different legs and models on one scale; recency bounded to comparably relevant hits."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memoryctl.query.fusion import RECENCY_WEIGHT, rank_score, recency, relevance, rrf

IDS = [uuid.UUID(int=i) for i in range(1, 9)]


def order(parts: dict[uuid.UUID, dict[str, float]]) -> list[uuid.UUID]:
    return sorted(parts, key=lambda i: -parts[i]["relevance"])


def test_scale_of_a_leg_does_not_matter() -> None:
    """e5's cosines (0.7-0.9) and MiniLM's (0-0.8) give one order once standardised."""
    lexical = [(IDS[0], 7.0), (IDS[3], 2.0)]
    e5 = [(IDS[1], 0.86), (IDS[0], 0.85), (IDS[2], 0.80), (IDS[3], 0.79)]
    minilm = [(i, (s - 0.79) * 8 + 0.1) for i, s in e5]  # another model: same order, other scale
    a = relevance({"vector": e5, "lexical": lexical}, {"vector": None, "lexical": 0.0})
    b = relevance({"vector": minilm, "lexical": lexical}, {"vector": None, "lexical": 0.0})
    assert order(a) == order(b)
    assert order(a)[0] == IDS[0]  # near the top of both legs beats the top of one
    assert a[IDS[1]]["vector"] == 0.86 and "lexical" not in a[IDS[1]]  # raw scores kept per leg


def test_a_flat_leg_adds_nothing_and_one_leg_alone_keeps_its_order() -> None:
    dense = [(IDS[0], 0.9), (IDS[1], 0.5), (IDS[2], 0.4)]
    flat = [(i, 1.0) for i in IDS[:3]]
    assert order(relevance({"vector": dense, "lexical": flat}, {"vector": None, "lexical": 0.0})) == IDS[:3]
    assert order(relevance({"vector": dense, "lexical": []}, {"vector": None, "lexical": 0.0})) == IDS[:3]
    assert relevance({}, {}) == {}


@given(
    rel=st.lists(st.floats(-3, 3), min_size=2, max_size=8),
    ages=st.lists(st.integers(0, 3650), min_size=8, max_size=8),
)
def test_recency_only_reorders_comparably_relevant_memories(rel: list[float], ages: list[int]) -> None:
    newest = datetime(2026, 11, 30, tzinfo=UTC)
    half_life = timedelta(days=30)
    scored = [
        (r, rank_score(r, recency(newest - timedelta(days=a), newest, half_life)))
        for r, a in zip(rel, ages, strict=False)
    ]
    for r1, s1 in scored:
        for r2, s2 in scored:
            if r1 - r2 > RECENCY_WEIGHT:
                assert s1 > s2  # however old the first, however new the second


def test_among_equally_relevant_the_newer_wins_and_no_half_life_is_no_preference() -> None:
    newest = datetime(2026, 11, 30, tzinfo=UTC)
    old = newest - timedelta(days=5)
    assert rank_score(1.0, recency(newest, newest, timedelta(days=30))) > rank_score(
        1.0, recency(old, newest, timedelta(days=30))
    )
    assert recency(old, newest, None) == 0.0
    assert recency(newest, newest, timedelta(days=1)) == pytest.approx(1.0)


def test_membership_legs_do_not_rank() -> None:
    """'or' with an entity: the graph leg's newest-first order is not relevance."""
    fused = rrf({"text": [IDS[1], IDS[0]], "graph": [IDS[0], IDS[1], IDS[2]]}, membership=frozenset({"graph"}))
    total = {i: sum(p.values()) for i, p in fused.items()}
    assert sorted(total, key=lambda i: -total[i]) == [IDS[1], IDS[0], IDS[2]]
    assert fused[IDS[0]]["graph"] == fused[IDS[2]]["graph"]
