"""The conversational context's scoring (``memoryctl.query.turns``), without stores."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

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


# Any relevance and any context (ids that are candidates or not, repeated, missing): the rule of the
# module docstring, score = max(own, (own + best context) / 2), with the floor for non-candidates.
_ids = st.sampled_from([uuid.UUID(int=i) for i in range(8)])
_scores = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    relevance=st.dictionaries(_ids, _scores, max_size=6),
    before=st.dictionaries(_ids, st.lists(_ids, max_size=4), max_size=8),
)
def test_in_context_follows_its_rule_for_any_scores(
    relevance: dict[uuid.UUID, float], before: dict[uuid.UUID, list[uuid.UUID]]
) -> None:
    lifted = in_context(relevance, before)
    assert set(lifted) <= set(relevance)  # only candidates are scored; the context never adds one
    floor = min(relevance.values(), default=0.0)
    for mid, own in relevance.items():
        best = max((relevance.get(b, floor) for b in before.get(mid, ())), default=floor)
        passage = (own + best) / 2
        if passage > own:  # lifted to the mean, which lies between its own score and its best context's
            assert lifted[mid] == passage <= best
        else:  # never lowered: absent, it keeps its own score
            assert mid not in lifted
