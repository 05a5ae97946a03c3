"""The dates a question names (query/dates.py) and the preference the ranking gives the memories
written then (ranking._dated)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from memoryctl.model import Memory
from memoryctl.query import ranking
from memoryctl.query.dates import Window, closeness, scope, windows
from memoryctl.query.plan import AnyOf, ByRelevance, Facts, Plan, PlanOptions, VectorSearch, plan
from memoryctl.query.pushdown import depth
from memoryctl.query.ranking import Turns
from memoryctl.query.spec import MemoryQuery, Where

NOW = datetime(2026, 12, 1, 15, 0, tzinfo=UTC)


def day(y: int, m: int, d: int) -> datetime:
    return datetime(y, m, d, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Who did Maria have dinner with on May 3, 2023?", [(day(2023, 5, 3), day(2023, 5, 4), False)]),
        ("What book did Tim finish on 8th December, 2023?", [(day(2023, 12, 8), day(2023, 12, 9), False)]),
        ("the forest picture shared on December 1,2023", [(day(2023, 12, 1), day(2023, 12, 2), False)]),
        ("What did she write on 3rd of June 2023", [(day(2023, 6, 3), day(2023, 6, 4), False)]),
        ("logs of 2024-02-29", [(day(2024, 2, 29), day(2024, 3, 1), False)]),
        ("What did John host in May 2023?", [(day(2023, 5, 1), day(2023, 6, 1), False)]),
        ("Which tournament in December, 2022?", [(day(2022, 12, 1), day(2023, 1, 1), False)]),
        ("What did Nate do in 2022?", [(day(2022, 1, 1), day(2023, 1, 1), False)]),
        ("Which outdoor spot did Joanna visit in May?", [(day(2000, 5, 1), day(2000, 6, 1), True)]),
        ("the outage on March 5", [(day(2000, 3, 5), day(2000, 3, 6), True)]),
        ("What happened yesterday?", [(day(2026, 11, 30), day(2026, 12, 1), False)]),
        ("the deploys of last week", [(day(2026, 11, 24), day(2026, 12, 1), False)]),
        ("two weeks ago", [(day(2026, 11, 17), day(2026, 11, 24), False)]),
        ("the party last weekend", [(day(2026, 11, 28), day(2026, 11, 30), False)]),
        ("May I ask how the rollback went?", []),  # "may" the verb
        ("the build on June 31, 2023", [(day(2023, 1, 1), day(2024, 1, 1), False)]),  # no such day: the year
        ("What did Alice say about the rollback?", []),
    ],
)
def test_windows(text: str, expected: list[tuple[datetime, datetime, bool]]) -> None:
    assert [(w.start, w.end, w.yearly) for w in windows(text, NOW)] == expected


def test_relative_times_need_the_time_of_asking() -> None:
    assert windows("what happened last week in 2023", None) == [Window(day(2023, 1, 1), day(2024, 1, 1))]


def test_closeness_is_one_inside_and_halves_with_each_window_length() -> None:
    may3 = windows("on May 3, 2023", NOW)
    assert closeness(day(2023, 5, 3) + timedelta(hours=20), may3) == 1.0
    assert closeness(day(2023, 5, 5), may3) == pytest.approx(0.5)  # one day after the day's end
    assert closeness(day(2023, 5, 1), may3) == pytest.approx(0.25)
    may = windows("in May 2023", NOW)
    assert closeness(day(2023, 6, 1), may) == 1.0
    assert closeness(day(2023, 7, 1), may) == pytest.approx(0.5 ** (30 / 31))
    yearly = windows("in May", NOW)
    assert closeness(day(2019, 5, 20), yearly) == closeness(day(2023, 5, 20), yearly) == 1.0
    assert closeness(day(2023, 12, 20), yearly) < 0.1
    assert closeness(day(2023, 5, 3), []) == 0.0


def test_the_plan_carries_the_named_times_and_the_option_turns_them_off() -> None:
    q = MemoryQuery(text="What did Maria do on May 3, 2023?", agent_id="a").validate()
    chosen = plan(q, Facts(now=NOW))
    assert isinstance(chosen, Plan) and isinstance(chosen.ranking, ByRelevance)
    assert chosen.ranking.dated == (Window(day(2023, 5, 3), day(2023, 5, 4)),)
    off = plan(q, Facts(now=NOW), PlanOptions(dated=False))
    assert isinstance(off, Plan) and isinstance(off.ranking, ByRelevance) and off.ranking.dated == ()


def test_a_named_time_adds_a_search_within_it_and_nothing_else_does() -> None:
    """The preference reorders only what the legs return: a dated question's text search is asked
    again within the named time (``dates.scope``, the window widened by its length either side),
    at the same depth, and the ranking reads both searches' candidates (the plan's window). An
    undated one, a dated one without the preference, an ``or`` (ranked by RRF) and a date without
    its year (no single range) search once."""
    base = depth(MemoryQuery(text="x", agent_id="a").validate())
    dated = MemoryQuery(text="What did Maria do on May 3, 2023?", agent_id="a").validate()
    scoped = plan(dated, Facts(now=NOW))
    assert isinstance(scoped, Plan) and isinstance(scoped.shape, VectorSearch)
    assert scoped.shape.search.depth == base and scoped.window == 2 * base
    assert scoped.shape.search.within == (day(2023, 5, 2), day(2023, 5, 5))
    for same, options in (
        (MemoryQuery(text="What did Maria do?", agent_id="a").validate(), PlanOptions()),
        (MemoryQuery(text="What did Maria do on May 3?", agent_id="a").validate(), PlanOptions()),
        (dated, PlanOptions(dated=False)),
        (replace(dated, where=[Where.parse("kind = note")], combine="or").validate(), PlanOptions()),
    ):
        p = plan(same, Facts(now=NOW), options)
        assert isinstance(p, Plan) and p.window == base
        legs = dict(p.shape.legs) if isinstance(p.shape, AnyOf) else {"text": p.shape}
        text = legs["text"]
        assert isinstance(text, VectorSearch) and text.search.depth == base and text.search.within is None


def test_the_scope_is_the_named_windows_hull_widened_by_their_length() -> None:
    may = windows("in May 2023 or on June 2, 2023", None)
    assert scope(may) == (day(2023, 3, 31), day(2023, 7, 2))  # May is 31 days long
    assert scope(windows("in May", None)) is None and scope([]) is None


def _memory(text: str, at: datetime) -> Memory:
    return Memory(id=uuid.uuid4(), agent_id="a", text=text, created_at=at)


def test_a_memory_written_at_the_named_time_ranks_first_among_equally_relevant() -> None:
    q = MemoryQuery(text="dinner on May 3, 2023", agent_id="a").validate()
    rule = ByRelevance(named=False, dated=tuple(windows(q.text or "", NOW)))
    early, right, late = (_memory("dinner", day(2023, m, d)) for m, d in ((4, 2), (5, 3), (8, 1)))
    live = [(early, {"relevance": 0.5}), (right, {"relevance": 0.5}), (late, {"relevance": 0.5})]
    hits = ranking.rank(rule, q, live, Turns(), "graph")
    assert hits[0].memory is right
    assert hits[0].scores["dated"] == 1.0 and hits[1].memory is early  # a month before beats three after
    # a preference, not a filter: a memory far more relevant still ranks first
    live = [(early, {"relevance": 3.0}), (right, {"relevance": -1.0}), (late, {"relevance": -1.0})]
    assert ranking.rank(rule, q, live, Turns(), "graph")[0].memory is early
    # without a named time, the relevance alone
    plain = ranking.rank(ByRelevance(named=False), q, live, Turns(), "graph")
    assert [h.score for h in plain] == [3.0, -1.0, -1.0]
