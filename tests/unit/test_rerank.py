"""The rerank stage's ordering, blend and time budget, with a scorer of our own (the model itself is
measured by benchmarks/rerank.py, not here) and a clock the test moves."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from memoryctl.model import EntityRef, Memory
from memoryctl.query.rerank import BATCH, RerankSettings, passage, rerank
from memoryctl.query.results import Hit


def _hit(text: str, score: float) -> Hit:
    memory = Memory(
        text=text,
        agent_id="a",
        created_at=datetime(2023, 5, 8, 13, 56, tzinfo=UTC),
        entities=[EntityRef("Speaker", "Caroline")],
    )
    return Hit(uuid.uuid4(), score, {"dense": score}, memory, ["vector"])


class ByWord:
    """Logit 5 for a passage that holds the word, -5 otherwise; counts the passages it read."""

    def __init__(self, word: str) -> None:
        self.word = word
        self.read = 0

    def scores(self, question: str, passages: Sequence[str]) -> list[float]:
        self.read += len(passages)
        return [5.0 if self.word in p else -5.0 for p in passages]

    def ready(self) -> None:
        pass


def test_the_passage_says_who_and_when() -> None:
    assert passage(_hit("I adopted a dog.", 1.0).memory) == "Caroline (8 May 2023): I adopted a dog."


def test_the_cross_encoder_lifts_the_relevant_candidate_within_the_depth() -> None:
    hits = [_hit("weather", 0.9), _hit("camping", 0.8), _hit("adoption agency", 0.7), _hit("adoption too", 0.1)]
    out = rerank(hits, "who adopted?", ByWord("adoption"), RerankSettings(depth=3, blend=0.8, budget_s=10))
    assert [h.memory.text for h in out.hits] == ["adoption agency", "weather", "camping", "adoption too"]
    assert (out.read, out.offered, out.note) == (3, 3, None)
    assert out.hits[0].scores["rerank"] > 0.99 and out.hits[0].scores["dense"] == 0.7


def test_blend_zero_keeps_the_first_stage_order() -> None:
    hits = [_hit("weather", 0.9), _hit("adoption", 0.2)]
    out = rerank(hits, "q", ByWord("adoption"), RerankSettings(depth=2, blend=0.0, budget_s=10))
    assert [h.memory.text for h in out.hits] == ["weather", "adoption"]


def test_past_the_budget_the_rest_keep_the_first_stage_order_and_a_note_says_so() -> None:
    hits = [_hit(f"turn {i}", 1.0 - i / 100) for i in range(BATCH)] + [_hit("adoption", 0.5), _hit("x", 0.4)]
    ticks = iter([0.0, 1.0])  # the start, then the check before the second batch: past the budget
    scorer = ByWord("adoption")
    out = rerank(hits, "q", scorer, RerankSettings(depth=10, blend=0.5, budget_s=0.5), clock=lambda: next(ticks))
    assert scorer.read == BATCH and (out.read, out.offered) == (BATCH, 10)
    assert [h.memory.text for h in out.hits[BATCH:]] == ["adoption", "x"]
    assert out.note is not None and "budget ran out after 8 of 10" in out.note


@pytest.mark.parametrize("flag, expected", [("--rerank", True), ("--no-rerank", False), (None, None)])
def test_the_query_flag_reaches_the_query(flag: str | None, expected: bool | None) -> None:
    from memoryctl.cli import fast

    parsed = fast.parse(["query", "what", *([flag] if flag else [])])
    assert parsed is not None and parsed[2]["rerank"] is expected


def test_the_engine_reranks_a_deeper_pool_when_asked_and_cuts_to_the_limit() -> None:
    from memoryctl.query.spec import MemoryQuery
    from tests.unit.fakes import World
    from tests.unit.test_executor import Stack, memory

    w = World()
    w.add(*(memory(f"rollback step {i}", hours=i + 1) for i in range(4)), memory("lunch after the rollback", hours=9))
    s = Stack(w)
    scorer = ByWord("lunch")
    s.engine.rerank = (False, RerankSettings(depth=5, blend=1.0, budget_s=60), lambda: (scorer, None))
    plain = s.engine.run(MemoryQuery(text="rollback", agent_id="a", limit=2))
    assert "rerank" not in [st.name for st in plain.steps] and scorer.read == 0
    asked = s.engine.run(MemoryQuery(text="rollback", agent_id="a", limit=2, rerank=True))
    assert asked.hits[0].memory.text == "lunch after the rollback" and len(asked.hits) == 2
    (step,) = [st for st in asked.steps if st.name == "rerank"]
    assert (step.rows_in, step.rows_out) == (5, 5) and asked.query.limit == 2
    s.engine.rerank = (True, RerankSettings(depth=5, blend=1.0, budget_s=60), lambda: (scorer, None))
    assert s.engine.run(MemoryQuery(text="rollback", agent_id="a", limit=2, rerank=False)).hits == plain.hits
