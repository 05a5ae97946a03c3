"""The rerank stage with a served cross-encoder (vLLM's score API; on the cluster the GPU node) and
the CPU model behind it: the served scores mean what the CPU model's mean, and a served model that
is away, refuses or answers nonsense costs at most its timeout, after which the CPU model reads
the candidates and the query's notes say so. Against a real HTTP server: the vLLM stand-in
(tests/lora/vllm_standin.py) serving the score API from the CPU model's own files, the way it
stands in for the GPU node's reranker on the local nodes."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime

import pytest

from memoryctl.deadline import Breaker
from memoryctl.errors import StoreError, StoreUnavailable
from memoryctl.model import EntityRef, Memory
from memoryctl.modelfiles import installed
from memoryctl.query.rerank import MODEL, CrossEncoder, RerankSettings, ServedScorer, passage, rerank
from memoryctl.query.results import Hit
from memoryctl.vllm import VLLMClient
from tests.lora.vllm_standin import StandinState, VLLMStandin, onnx_cross_encoder

SERVED = "BAAI/bge-reranker-v2-m3"  # what the GPU node serves; the stand-in answers under its name
QUESTION = "Who adopted a dog from the shelter?"
TEXTS = [
    "We went camping by the lake last weekend.",
    "I adopted a puppy from the animal shelter on Friday!",
    "The weather has been awful all week.",
]


def _hits() -> list[Hit]:
    when = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    memories = [
        Memory(text=t, agent_id="a", created_at=when, entities=[EntityRef("Speaker", "Caroline")]) for t in TEXTS
    ]
    return [Hit(uuid.uuid4(), 0.9 - i * 0.1, {"dense": 0.9 - i * 0.1}, m, ["vector"]) for i, m in enumerate(memories)]


@pytest.fixture(scope="module")
def cpu() -> CrossEncoder:
    return CrossEncoder()


@pytest.fixture(scope="module")
def server() -> Iterator[VLLMStandin]:
    state = StandinState(base_model=SERVED, score=onnx_cross_encoder(str(installed(MODEL))))
    with VLLMStandin(state) as standin:
        yield standin


def _served(url: str, **kw: object) -> ServedScorer:
    return ServedScorer(VLLMClient(url, timeout_s=1.0, store="rerank"), SERVED, timeout_s=1.0, **kw)  # type: ignore[arg-type]


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_served_scores_are_the_cpu_models_logits(server: VLLMStandin, cpu: CrossEncoder) -> None:
    """vLLM answers the activated score (a probability); the scorer hands back the logit, so the
    blend reads both scorers alike."""
    texts = [passage(h.memory) for h in _hits()]
    served = _served(server.url).scores(QUESTION, texts)
    local = cpu.scores(QUESTION, texts)
    assert served == pytest.approx(local, abs=1e-3)
    assert max(range(3), key=lambda i: served[i]) == 1


def test_the_served_order_is_the_cpu_order(server: VLLMStandin, cpu: CrossEncoder) -> None:
    settings = RerankSettings(depth=3, blend=0.8, budget_s=10)
    by_server = rerank(_hits(), QUESTION, _served(server.url), settings, fallback=cpu)
    by_cpu = rerank(_hits(), QUESTION, cpu, settings)
    assert [h.memory.text for h in by_server.hits] == [h.memory.text for h in by_cpu.hits]
    assert by_server.hits[0].memory.text == TEXTS[1]
    assert by_server.fallback is None and by_server.read == 3


def test_a_served_model_that_is_away_hands_over_to_the_cpu_model(cpu: CrossEncoder) -> None:
    done = rerank(_hits(), QUESTION, _served(_closed_port()), RerankSettings(3, 0.8, 10), fallback=cpu)
    assert done.hits[0].memory.text == TEXTS[1] and done.read == 3
    assert done.fallback is not None and "the CPU cross-encoder read the candidates instead" in done.fallback


def test_a_refusing_server_hands_over_too_and_without_a_fallback_the_error_stands(server: VLLMStandin) -> None:
    server.state.fail_requests = True
    try:
        with pytest.raises(StoreError, match="HTTP 500"):
            rerank(_hits(), QUESTION, _served(server.url), RerankSettings(3, 0.8, 10))
    finally:
        server.state.fail_requests = False


class Counting:
    """The CPU model's stand-in for the fallback's count of batches: it says which logits it gave."""

    def __init__(self) -> None:
        self.calls = 0

    def scores(self, question: str, passages: Sequence[str]) -> list[float]:
        self.calls += 1
        return [0.0] * len(passages)

    def ready(self) -> None:
        pass


def test_after_three_failures_the_server_is_not_asked_until_the_breaker_resets(server: VLLMStandin) -> None:
    now = [0.0]
    breaker = Breaker(failures_to_open=3, reset_s=30.0, clock=lambda: now[0])
    scorer = _served(server.url, breaker=breaker)
    before = server.state.requests.count(("POST", "/score"))
    server.state.fail_requests = True
    try:
        for _ in range(3):
            rerank(_hits(), QUESTION, scorer, RerankSettings(3, 0.8, 10), fallback=Counting())
        with pytest.raises(StoreUnavailable, match="not asked"):
            scorer.scores(QUESTION, TEXTS)
        assert server.state.requests.count(("POST", "/score")) - before == 3
    finally:
        server.state.fail_requests = False
    now[0] = 31.0  # half-open: one call tries, succeeds, and closes it
    assert len(scorer.scores(QUESTION, TEXTS)) == 3 and breaker.state == "closed"


def test_a_malformed_answer_is_an_error_naming_the_server() -> None:
    state = StandinState(base_model=SERVED, score=lambda q, passages: [0.5] * (len(passages) - 1))
    with VLLMStandin(state) as short:
        with pytest.raises(StoreError, match="2 scores for 3 passages"):
            _served(short.url).scores(QUESTION, TEXTS)


def test_the_engine_says_which_scorer_read_and_why_the_cpu_model_took_over(cpu: CrossEncoder) -> None:
    """Through the engine (over the in-memory fakes of the store protocols): the rerank step names
    the scorer that read, and the query's notes carry the hand-over."""
    from memoryctl.query.spec import MemoryQuery
    from tests.unit.fakes import World
    from tests.unit.test_executor import Stack, memory

    w = World()
    w.add(*(memory(f"the rollback, step {i}", hours=i + 1) for i in range(3)), memory("I adopted a dog", hours=9))
    s = Stack(w)
    away = _served(_closed_port())
    s.engine.rerank = (True, RerankSettings(depth=4, blend=0.5, budget_s=10), lambda: (away, cpu))
    result = s.engine.run(MemoryQuery(text="the rollback", agent_id="a", limit=4))
    (step,) = [st for st in result.steps if st.name == "rerank"]
    assert step.detail["scorer"] == "cpu" and step.rows_out == 4
    assert any("CPU cross-encoder read the candidates instead" in n for n in result.notes)
