"""The conversational context's scoring (``memoryctl.query.turns``), without stores."""

from __future__ import annotations

import uuid

from memoryctl.query.turns import in_context

TALK, REPLY, TOPIC, LUNCH = (uuid.uuid4() for _ in range(4))


def test_a_turn_scores_the_passage_it_ends_when_that_is_higher() -> None:
    relevance = {TALK: 3.0, REPLY: 0.0, TOPIC: -1.0, LUNCH: -0.5}
    lifted = in_context(relevance, {REPLY: [TALK], TOPIC: [TALK, REPLY]})
    # the mean of its own relevance and its best context turn's
    assert lifted == {REPLY: 1.5, TOPIC: 1.0}
    # the turn that gave the context stays ahead of every turn it lifted
    assert all(v < relevance[TALK] for v in lifted.values())


def test_the_context_never_lowers_a_turn() -> None:
    relevance = {TALK: 3.0, REPLY: -1.0}
    # the talk's context is worse than the talk: it keeps its own score (absent from the lifts)
    assert in_context(relevance, {TALK: [REPLY]}) == {}


def test_a_context_turn_that_is_no_candidate_scores_the_floor() -> None:
    stranger = uuid.uuid4()
    relevance = {TALK: 2.0, TOPIC: -2.0, LUNCH: 0.0}
    # the stranger is not ranked: it counts as the lowest candidate, so it lifts nobody
    assert in_context(relevance, {LUNCH: [stranger], TOPIC: [stranger]}) == {}
    assert in_context({}, {TOPIC: [TALK]}) == {}
