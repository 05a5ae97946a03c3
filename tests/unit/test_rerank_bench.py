"""benchmarks/rerank.py's with-context passage (issue 45): what the cross-encoder reads of a turn
with the turn before it, which turn that is, and that a sweep re-ranks by either set of logits.
No model: the logits are given."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import pytest

from memoryctl.model import EntityRef, Memory

RERANK_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "rerank.py"
MAY_8 = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_rerank", RERANK_BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _memory(text: str, speaker: str, at: datetime = MAY_8) -> Memory:
    return Memory(text=text, agent_id="a", created_at=at, entities=[EntityRef("Speaker", speaker)])


def test_the_with_context_passage_reads_the_turn_before_then_the_turn(bench: ModuleType) -> None:
    before = _memory("Did you go hiking?", "Melanie")
    turn = _memory("Yes, last week!", "Caroline", MAY_8 + timedelta(seconds=30))
    assert (
        bench.context_passage(turn, before) == "Melanie (8 May 2023): Did you go hiking? || Caroline: Yes, last week!"
    )
    assert bench.context_passage(turn, None) == "Caroline (8 May 2023): Yes, last week!"


def test_the_turn_before_is_within_the_context_window_never_the_session_before(bench: ModuleType) -> None:
    from conversations import Conversation, Turn

    def turn(n: int, at: datetime, session: int) -> Turn:
        return Turn(uuid.UUID(int=n), "a", "Melanie", f"turn {n}", at, session, ())

    turns = [turn(1, MAY_8, 1), turn(2, MAY_8 + timedelta(seconds=30), 1), turn(3, MAY_8 + timedelta(days=2), 2)]
    before = bench.previous_turns(Conversation("a", "locomo", ["Melanie", "Caroline"], turns, []))
    assert {k: m.text for k, m in before.items()} == {str(uuid.UUID(int=2)): "turn 1"}


def test_a_sweep_reranks_by_the_logits_it_is_told_to(bench: ModuleType) -> None:
    a, b = str(uuid.UUID(int=1)), str(uuid.UUID(int=2))
    row = {
        "question": "q",
        "candidates": [
            {"id": a, "score": 1.0, "passage": "p a", "logit": 5.0, "context_logit": -5.0},
            {"id": b, "score": 0.9, "passage": "p b", "logit": -5.0, "context_logit": 5.0},
        ],
    }
    assert bench.ranked(row, None, 0.0) == [a, b]
    assert bench.ranked(row, 30, 1.0) == [a, b]
    assert bench.ranked(row, 30, 1.0, "context_logit") == [b, a]


def test_embedder_reaches_the_collection_and_the_sweep_names_it(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = str(uuid.UUID(int=1)), str(uuid.UUID(int=2))
    row = {
        "embedder": "e5-small-v2",
        "agent": "x",
        "question": "q",
        "category": "single-hop",
        "evidence": [b],
        "candidates": [  # collected with --context-tokens 0: no with-context logits
            {"id": a, "score": 1.0, "passage": "p a", "logit": -5.0},
            {"id": b, "score": 0.9, "passage": "p b", "logit": 5.0},
        ],
        "engine_ms": 1.0,
        "stage_ms": {"30": 2.0},
        "pairs": 2,
    }
    seen: dict[str, object] = {}

    def collect(conversations: object, depth: int, keep: object, **kw: object) -> list[dict[str, object]]:
        seen.update(kw)
        return [row]

    monkeypatch.setattr(bench, "collect", collect)
    kept = tmp_path / "col.json"
    argv = ["--conversations", "41", "--depths", "30", "--blends", "1", "--context-tokens", "0"]
    assert bench.main([*argv, "--embedder", "e5-small-v2", "--collected", str(kept)]) == 0
    assert seen["embedder"] == "e5-small-v2" and seen["context_tokens"] == 0
    capsys.readouterr()
    assert bench.main(["--from", str(kept), "--depths", "30", "--blends", "1"]) == 0
    out = capsys.readouterr().out
    assert "first stage by e5-small-v2" in out
    assert "ctx-" not in out
    assert "d30-b1 " in out and "current passage" in out and "with context" not in out
