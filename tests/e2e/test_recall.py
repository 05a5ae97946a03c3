"""Retrieval quality regression, embedded profile: benchmarks/recall.py on its small CI split, and
benchmarks/locomo.py on one conversation of LoCoMo, the public benchmark (issue 27).

The real engines and the real default model answer labelled questions about two generated
multi-session conversations (one of each family: name-prefixed turns with LoCoMo-like questions,
and turns whose speaker is only an entity with terse queries), and about a LoCoMo conversation
(the data read from its folder, never copied here). The floors sit a few points under the
measured figures, so a change that makes ranking worse fails here. The generator's floor was set
on its own output; the LoCoMo floor is on data this project did not make, on a conversation the
ranking methods were not developed on (benchmarks/locomo.py: ``DEV``).

The relations the design promises are asserted where they hold: fusing the legs beats the
lexical leg alone everywhere, and the dense leg alone where the speaker is an entity only (the
generator's work family and LoCoMo; on the life family, whose turns start with the speaker's name,
the dense leg alone ranks as well or better on the full splits: docs/retrieval.md, "Measurements");
reading a turn with the turns before it beats ranking it alone, so does embedding the question
without the entity names it says, the default ranks every question exactly as ``--half-life off``
(recency is opt-in), and the opt-in recency preference costs no relevance. Figures on the full
splits: benchmarks/recall.py and benchmarks/locomo.py.
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
BENCH = BENCHMARKS / "recall.py"
METHODS = ("default", "no-decay", "recency", "dense", "lexical", "no-context", "with-names")
# Measured on the ci split with the default embedder (all-MiniLM-L6-v2 int8): default 0.855
# recall@10 / 0.788 hit@5; without the conversational context 0.754 / 0.707; with the entity names
# left in what the dense leg embeds 0.762 / 0.687; the legs alone (each with the named-entity leg
# and the context) 0.754 (dense) and 0.545 (lexical). Raised from 0.55 / 0.44 (measured 0.604 /
# 0.495) with the scope-wide IDF, the named-entity leg and the cut lexical leg's floor (0.64 /
# 0.57), with the conversational context (0.72 / 0.65), then with the names out of the dense leg.
FLOORS = {"recall@10": 0.80, "hit@5": 0.73}


def _module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _no_embedding_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmarks' on-disk embedding cache is for repeated runs by hand: here the real model
    embeds every turn and question, and nothing is written to the home directory."""
    monkeypatch.setenv("MEMORYCTL_BENCH_CACHE", "off")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _module("bench_recall", BENCH)


def test_recall_floors_fusion_and_the_default_is_no_decay(bench: ModuleType) -> None:
    convs = bench.conversations.split("ci")
    assert {c.family for c in convs} == {"life", "work"}
    ranked: dict[str, list[list[uuid.UUID]]] = {"default": [], "no-decay": []}
    with bench.open_client("embedded") as client:
        bench.load(client, convs)
        fns = bench.methods(client, convs)
        fns.update({name: _recorded(fns[name], ranked[name]) for name in ranked})
        overall, _ = bench.evaluate(convs, fns, METHODS)
        entity_only = [c for c in convs if c.family == "work"]
        work, _ = bench.evaluate(entity_only, fns, ("hybrid", "dense"))
    default, flat, recency, _, lexical, alone, with_names = (overall[m] for m in METHODS)
    for metric, floor in FLOORS.items():
        assert default[metric] >= floor, overall
    # The default ranks as no decay, id for id, on every question: never worse on evidence spread
    # over months (the ci split's sessions span them).
    assert len(ranked["default"]) == default["questions"] > 0
    assert ranked["default"] == ranked["no-decay"]
    assert recency["recall@10"] >= flat["recall@10"] - 0.02, overall  # opt-in recency costs no relevance
    # fusion pays: over the lexical leg everywhere, over the dense leg where the speaker is an entity only
    assert flat["recall@10"] > lexical["recall@10"], overall
    assert work["hybrid"]["recall@10"] > work["dense"]["recall@10"], work
    # reading each turn with the turns before it pays, and costs no first place
    assert default["recall@10"] > alone["recall@10"] and default["hit@1"] >= alone["hit@1"], overall
    # the dense leg judging the question without the names it says (query/dense_question.py) pays
    assert default["recall@10"] > with_names["recall@10"] and default["hit@5"] > with_names["hit@5"], overall


def _recorded(method: Callable[..., list[uuid.UUID]], into: list[list[uuid.UUID]]) -> Callable[..., list[uuid.UUID]]:
    """``method``, keeping each question's ranked ids in ``into`` (in the order it is asked)."""

    def run(question: object) -> list[uuid.UUID]:
        ids = method(question)
        into.append(ids)
        return ids

    return run


def test_rescore_experiment_reorders_the_first_stage_by_the_second_model(bench: ModuleType) -> None:
    """``--rescore``: the second stage only reorders the engine's top N, by the second model's cosine
    (``second``) or fused with the engine's score (``rescore``)."""
    convs = bench.conversations.split("ci")
    stage = bench.SecondStage("onnx", 20)
    with bench.open_client("embedded") as client:
        bench.load(client, convs)
        fns = bench.methods(client, convs, second=stage)
        for q in [q for c in convs for q in c.questions][:20]:
            first = bench.first_stage(client, q, stage.depth)
            alone, fused = fns["second"](q), fns["rescore"](q)
            assert len(alone) == len(fused) == min(bench.K, len(first))
            assert set(alone) | set(fused) <= {h.id for h in first}
            qv = stage.embedder.embed_query(q.text)
            cosines = [float(stage.vectors[i] @ qv) for i in alone]
            assert cosines == sorted(cosines, reverse=True), q.text


# Measured on LoCoMo conversation 49 (509 turns, 156 questions of categories 1-4), embedded
# default: recall@10 0.708, hit@5 0.744; dense alone 0.595 / 0.558, lexical alone 0.656 / 0.667,
# Okapi BM25 0.492 / 0.449 (benchmarks/locomo.py --conversations 49).
LOCOMO_CONVERSATION = "49"
LOCOMO_FLOORS = {"recall@10": 0.66, "hit@5": 0.70}


def test_locomo_floor_and_fusion_on_a_public_benchmark() -> None:
    locomo = _module("bench_locomo", BENCHMARKS / "locomo.py")
    try:
        locomo.data_dir()
    except SystemExit as exc:
        pytest.skip(f"LoCoMo data not on this machine: {exc}")  # a failure in CI (tests/conftest.py)
    conv = locomo.read(LOCOMO_CONVERSATION).conversation
    assert len(conv.turns) == 509 and len(conv.questions) == 156  # the file SHA256SUMS names
    with locomo.recall.open_client("embedded") as client:
        locomo.load(client, [conv])
        fns = locomo.recall.methods(client, [conv], said=locomo.AUTHORED)
        overall, _ = locomo.recall.evaluate([conv], fns, ("default", "dense", "lexical"))
    for metric, floor in LOCOMO_FLOORS.items():
        assert overall["default"][metric] >= floor, overall
    default, dense, lexical = (overall[m]["recall@10"] for m in ("default", "dense", "lexical"))
    assert default > max(dense, lexical), overall  # fusion pays here: the speaker is an entity only
