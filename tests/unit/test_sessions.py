"""Session-level context (``memoryctl.query.sessions``), without stores."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from memoryctl.model import Memory
from memoryctl.query import ranking
from memoryctl.query.plan import ByRelevance
from memoryctl.query.ranking import Turns
from memoryctl.query.sessions import session_of, support
from memoryctl.query.spec import MemoryQuery
from memoryctl.query.turns import CONTEXT_WITHIN

MAY = datetime(2023, 5, 3, 18, 0, tzinfo=UTC)
JUNE = datetime(2023, 6, 9, 9, 30, tzinfo=UTC)


def test_candidates_chained_within_the_context_bound_share_a_session() -> None:
    step = CONTEXT_WITHIN - timedelta(minutes=1)
    stamps = [
        ("ana", MAY + 2 * step),  # chained to MAY through MAY + step, though 2 steps away from it
        ("ana", MAY),
        ("ana", JUNE),
        ("ana", MAY + step),
        ("ben", MAY),  # another agent's memory at the same time is another conversation
        ("ana", MAY + 2 * step + CONTEXT_WITHIN + timedelta(minutes=1)),  # just past the bound
    ]
    s = session_of(stamps)
    assert s[0] == s[1] == s[3]
    assert len({s[0], s[2], s[4], s[5]}) == 4


def test_support_is_the_relevant_candidates_of_the_session_scaled() -> None:
    minute, day = timedelta(minutes=1), timedelta(days=1)
    stamps = [("ana", MAY), ("ana", MAY + minute), ("ana", MAY + 2 * minute), ("ana", JUNE), ("ana", JUNE + day)]
    # May's session: 1.0 + 3.0, nothing from the turn below the mean (negative); June 9: 2.0; June 10: 0.5
    got = support([1.0, 3.0, -1.5, 2.0, 0.5], stamps)
    # every turn of a session gets the same support: it never reorders a session's own turns
    assert got[:3] == [1.0, 1.0, 1.0] and got[4] == 0.0
    assert got[3] == pytest.approx(1.5 / 3.5)


def test_memories_that_share_no_session_keep_their_order() -> None:
    # notes hours apart: each is its own session, its support its own relevance (positive part),
    # which orders them as the relevance does, so the leg cannot reorder them
    relevance = [1.0, 2.0, -0.5, -1.0]
    got = support(relevance, [("ana", MAY + k * CONTEXT_WITHIN * 2) for k in range(4)])
    assert got == [0.5, 1.0, 0.0, 0.0]
    # one session for all: nothing to prefer
    assert support(relevance, [("ana", MAY)] * 4) == [0.0] * 4
    assert support([], []) == []


def _memory(text: str, at: datetime) -> Memory:
    return Memory(id=uuid.uuid4(), agent_id="ana", text=text, created_at=at)


def test_a_turn_whose_session_also_matches_ranks_first_among_equally_relevant() -> None:
    q = MemoryQuery(text="what recipes did Ana bake", agent_id="ana").validate()
    rule = ByRelevance(named=False, sessions=True)
    # two equally relevant turns: one in a session that talks about baking, one alone in June
    alone = _memory("baked a tart", JUNE)
    baking, mate = _memory("baked bread", MAY), _memory("dairy-free recipes", MAY + timedelta(minutes=2))
    live = [(alone, {"relevance": 0.5}), (baking, {"relevance": 0.5}), (mate, {"relevance": 1.0})]
    hits = ranking.rank(rule, q, live, Turns(), "graph")
    assert [h.memory for h in hits[1:]] == [baking, alone]
    assert hits[1].scores["session"] == 1.0 and "session" not in hits[2].scores
    # a preference, not a filter: the lone turn far more relevant still ranks first
    live = [(alone, {"relevance": 3.0}), (baking, {"relevance": -1.0}), (mate, {"relevance": 0.5})]
    assert ranking.rank(rule, q, live, Turns(), "graph")[0].memory is alone
    # off (``[query] session_context = false``): the relevance alone, the tie to the newer
    plain = ranking.rank(
        ByRelevance(named=False), q, [(baking, {"relevance": 0.5}), (alone, {"relevance": 0.5})], Turns(), "graph"
    )
    assert [h.memory for h in plain] == [alone, baking]
