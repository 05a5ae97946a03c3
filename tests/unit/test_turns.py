"""The conversational context's scoring (``memoryctl.query.turns``, ``ranking._in_context``), without stores."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from hypothesis import example, given, settings
from hypothesis import strategies as st

from memoryctl.model import EntityRef, Memory
from memoryctl.query import ranking
from memoryctl.query.plan import ByRelevance
from memoryctl.query.ranking import Turns
from memoryctl.query.spec import MemoryQuery
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
# Boundaries drawn every run: nothing at all, context only, equal scores, the score range's ends.
@example(relevance={}, before={})
@example(relevance={}, before={uuid.UUID(int=0): [uuid.UUID(int=1)]})
@example(relevance={uuid.UUID(int=0): 1.0, uuid.UUID(int=1): 1.0}, before={uuid.UUID(int=0): [uuid.UUID(int=1)]})
@example(relevance={uuid.UUID(int=0): -1e6, uuid.UUID(int=1): 1e6}, before={uuid.UUID(int=0): [uuid.UUID(int=1)] * 4})
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


def test_a_question_that_names_someone_lifts_only_their_turns_by_the_context() -> None:
    """The context lifts the turns after a hit; when the question names a person some candidates
    mention, only those turns (``ranking._in_context``): the other party's reply is context, not an
    answer, and left unlifted it no longer takes a place of the named person's next turn."""
    maria, bob = EntityRef("Speaker", "Maria"), EntityRef("Speaker", "Bob")
    at = datetime(2023, 5, 3, 12, tzinfo=UTC)
    talk, reply, more = (
        Memory(text=t, agent_id="a", created_at=at + timedelta(seconds=30 * n), entities=[who])
        for n, (t, who) in enumerate(
            (("I went to Spain last year", maria), ("wow, that's great", bob), ("and Italy before", maria))
        )
    )
    live = [(talk, {"relevance": 2.0}), (reply, {"relevance": -1.0}), (more, {"relevance": -1.0})]
    turns = Turns(before={reply.id: [talk.id], more.id: [talk.id, reply.id]})
    rule = ByRelevance(named=True, context_turns=2)

    def lifted(question: str) -> set[str]:
        q = MemoryQuery(text=question, agent_id="a").validate()
        return {h.memory.text for h in ranking.rank(rule, q, live, turns, "graph") if "context" in h.scores}

    assert lifted("What countries has Maria been to?") == {"and Italy before"}
    assert lifted("What countries has anyone been to?") == {"wow, that's great", "and Italy before"}
