"""Scores of different legs and models on one scale; recency bounded to comparably relevant hits."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memoryctl.query.fusion import (
    RECENCY_WEIGHT,
    TEXT_LEGS,
    Z_CLIP,
    LegScale,
    names_any,
    rank_score,
    recency,
    relevance,
    rrf,
    spread,
    text_scales,
    with_named,
)

IDS = [uuid.UUID(int=i) for i in range(1, 9)]


def order(parts: dict[uuid.UUID, dict[str, float]]) -> list[uuid.UUID]:
    return sorted(parts, key=lambda i: -parts[i]["relevance"])


def test_scale_of_a_leg_does_not_matter() -> None:
    """e5's cosines (0.7-0.9) and MiniLM's (0-0.8) give one order once standardised."""
    lexical = [(IDS[0], 7.0), (IDS[3], 2.0)]
    e5 = [(IDS[1], 0.86), (IDS[0], 0.85), (IDS[2], 0.80), (IDS[3], 0.79)]
    minilm = [(i, (s - 0.79) * 8 + 0.1) for i, s in e5]  # another model: same order, other scale
    a = relevance({"vector": e5, "lexical": lexical}, TEXT_LEGS)
    b = relevance({"vector": minilm, "lexical": lexical}, TEXT_LEGS)
    assert order(a) == order(b)
    assert order(a)[0] == IDS[0]  # near the top of both legs beats the top of one
    assert a[IDS[1]]["vector"] == 0.86 and "lexical" not in a[IDS[1]]  # raw scores kept per leg


def test_a_flat_leg_adds_nothing_and_one_leg_alone_keeps_its_order() -> None:
    dense = [(IDS[0], 0.9), (IDS[1], 0.5), (IDS[2], 0.4)]
    flat = [(i, 1.0) for i in IDS[:3]]
    assert order(relevance({"vector": dense, "lexical": flat}, TEXT_LEGS)) == IDS[:3]
    assert order(relevance({"vector": dense, "lexical": []}, TEXT_LEGS)) == IDS[:3]
    assert relevance({}, {}) == {}


def test_a_lexical_spread_below_one_bit_is_not_stretched_to_a_full_vote() -> None:
    """Only a name every candidate shares matched (scores thousandths apart): the dense order stands."""
    dense = [(IDS[0], 0.62), (IDS[1], 0.61), (IDS[2], 0.58), (IDS[3], 0.56)]
    name_only = [(IDS[3], 0.031), (IDS[2], 0.030), (IDS[1], 0.029), (IDS[0], 0.020)]
    assert order(relevance({"vector": dense, "lexical": name_only}, TEXT_LEGS)) == IDS[:4]
    plain = {**TEXT_LEGS, "lexical": LegScale(0.0)}  # the plain z-score: the name outvotes the meaning
    assert order(relevance({"vector": dense, "lexical": name_only}, plain))[0] != IDS[0]


def test_two_outliers_keep_their_order_under_the_clip() -> None:
    """The soft clip is bounded like a hard clip at ±Z_CLIP but never ties two standouts."""
    rest = [uuid.UUID(int=100 + i) for i in range(40)]
    lexical = [(IDS[0], 40.0), (IDS[1], 30.0), *((i, 0.1) for i in rest)]
    parts = relevance({"lexical": lexical}, TEXT_LEGS)
    assert Z_CLIP > parts[IDS[0]]["relevance"] > parts[IDS[1]]["relevance"] > parts[rest[0]]["relevance"]
    scores = [s for _, s in lexical]
    assert (30.0 - sum(scores) / len(scores)) / spread(scores) > Z_CLIP  # where a hard clip tied them


@given(
    rel=st.lists(st.floats(-3, 3), min_size=2, max_size=8),
    ages=st.lists(st.integers(0, 3650), min_size=8, max_size=8),
)
def test_recency_only_reorders_comparably_relevant_memories(rel: list[float], ages: list[int]) -> None:
    newest = datetime(2026, 11, 30, tzinfo=UTC)
    half_life = timedelta(days=30)
    band = spread(rel)
    scored = [
        (r, rank_score(r, recency(newest - timedelta(days=a), newest, half_life), band))
        for r, a in zip(rel, ages, strict=False)
    ]
    for r1, s1 in scored:
        for r2, s2 in scored:
            if r1 - r2 > RECENCY_WEIGHT * band:
                assert s1 > s2  # however old the first, however new the second


def test_among_equally_relevant_the_newer_wins() -> None:
    newest = datetime(2026, 11, 30, tzinfo=UTC)
    old = newest - timedelta(days=5)
    assert rank_score(1.0, recency(newest, newest, timedelta(days=30)), 1.0) > rank_score(
        1.0, recency(old, newest, timedelta(days=30)), 1.0
    )
    assert recency(newest, newest, timedelta(days=1)) == pytest.approx(1.0)


def test_the_recency_band_scales_with_the_spread_of_relevance() -> None:
    """The same two memories, the same ages: recency closes a gap of 0.03 when this query's
    relevance spreads by 1 and cannot when it spreads by 0.1 (the gap is then a third of it)."""
    newest = datetime(2026, 11, 30, tzinfo=UTC)
    new, old = (recency(newest - timedelta(days=d), newest, timedelta(days=30)) for d in (0, 300))
    assert rank_score(1.0, new, spread([2.0, 0.0])) > rank_score(1.03, old, spread([2.0, 0.0]))
    assert rank_score(1.0, new, spread([1.1, 0.9])) < rank_score(1.03, old, spread([1.1, 0.9]))
    assert spread([5.0]) == 0.0


def test_membership_legs_do_not_rank() -> None:
    """'or' with an entity: the graph leg's newest-first order is not relevance."""
    fused = rrf({"text": [IDS[1], IDS[0]], "graph": [IDS[0], IDS[1], IDS[2]]}, membership=frozenset({"graph"}))
    total = {i: sum(p.values()) for i, p in fused.items()}
    assert sorted(total, key=lambda i: -total[i]) == [IDS[1], IDS[0], IDS[2]]
    assert fused[IDS[0]]["graph"] == fused[IDS[2]]["graph"]


def test_a_name_counts_as_whole_words_whatever_the_case_and_punctuation() -> None:
    assert names_any("When Hana raised the GPU hours issue", ["Bob", "hana"])
    assert names_any("what did acme corp's team ask?", ["Acme Corp"])
    assert not names_any("When Hanako raised it", ["Hana"])  # not a word of the question
    assert not names_any("Acme escalated", ["Acme Corp"])  # the whole name, not a part
    assert not names_any("anything at all", ["", "  "])


@given(
    rel=st.lists(st.floats(-3, 3), min_size=2, max_size=12),
    named=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_the_named_entity_leg_reorders_only_within_its_bound(rel: list[float], named: list[bool]) -> None:
    """It is averaged in as a third leg and a membership is worth 2 units (member vs non-member,
    whatever the share): a named memory cannot pass an unnamed one more relevant by 1 or more."""
    named = named[: len(rel)]
    fused = with_named(rel, named)
    if all(named) or not any(named):
        assert fused == rel
        return
    rows = list(zip(rel, named, fused, strict=True))
    for r1, n1, f1 in rows:
        for r2, n2, f2 in rows:
            if r1 - r2 >= 1.0 + 1e-9:
                assert f1 > f2
            if n1 and not n2 and r1 >= r2:
                assert f1 > f2  # of two equally relevant, the named one first


def test_a_lexical_leg_cut_at_its_depth_is_an_upper_bound_not_zero() -> None:
    """Three lexical hits a name apart, the leg cut at three: what it did not return may carry the
    name too, so the dense leg's clear second is not sunk below them as if it shared no word."""
    dense = [(IDS[0], 0.80), (IDS[1], 0.70), (IDS[2], 0.62), (IDS[3], 0.61), (IDS[4], 0.60)]
    lexical = [(IDS[2], 3.3), (IDS[3], 3.1), (IDS[4], 3.0)]
    cut = relevance({"vector": dense, "lexical": lexical}, text_scales({"lexical": lexical}, 3))
    whole = relevance({"vector": dense, "lexical": lexical}, text_scales({"lexical": lexical}, 4))
    assert order(cut)[:2] == IDS[:2]
    assert order(whole)[-1] == IDS[1]  # all it matched was returned: IDS[1] shares no word
    assert text_scales({"lexical": lexical}, 4) == TEXT_LEGS
