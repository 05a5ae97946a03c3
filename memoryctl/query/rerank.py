"""The rerank stage: a cross-encoder reads the question with each of the first stage's top
candidates and the two scores are blended, within a time budget.

Why: the first stage embeds the question and each memory apart; a cross-encoder reads them
together and judges the pair, which helps where the words differ (multi-hop, open-domain questions
on LoCoMo, docs/retrieval.md). It is ~10x the cost of the dense query on a CPU, so it reads only the
top ``depth`` candidates, and stops at ``budget_s``: the candidates it scored are ordered by the
blend, the rest follow in the first stage's order, and ``--explain`` says how many it reached.

The model is cross-encoder/ms-marco-MiniLM-L-12-v2 int8 (``memoryctl.modelfiles``: taken out of a
pinned registry artefact, never a hub). What it reads of a candidate is what the engine knows of
it: ``"Speaker (8 May 2023): text"``, the speaker being the memory's ``Speaker`` entity when it has
one. The blend: ``blend * sigmoid(logit) + (1 - blend) * first-stage score`` min-max scaled over
the candidates read (the two scales differ; both end in [0, 1]).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from memoryctl.errors import ConfigError, MemoryctlError

if TYPE_CHECKING:
    from memoryctl.deadline import Breaker
    from memoryctl.model import Memory
    from memoryctl.query.results import Hit
    from memoryctl.vllm import VLLMClient

MODEL = "ms-marco-minilm-l12-int8"
MAX_TOKENS = 128  # question + candidate; a dialogue turn with its speaker and date fits
BATCH = 8  # pairs per model call: the budget is checked between calls


class PairScorer(Protocol):
    """Scores (question, passage) pairs; a higher logit is more relevant."""

    def scores(self, question: str, passages: Sequence[str]) -> list[float]: ...

    def ready(self) -> None:
        """Load what the scorer needs, so that loading is not charged to a query's time budget."""


@dataclass(frozen=True, slots=True)
class RerankSettings:
    depth: int = 30
    blend: float = 0.5
    budget_s: float = 0.5


class CrossEncoder:
    """The pinned cross-encoder on onnxruntime (loaded on first use, once per instance)."""

    def __init__(self, model_dir: Any = None, *, threads: int = 2, max_tokens: int = MAX_TOKENS) -> None:
        self._dir = model_dir
        self._threads = threads
        self._max_tokens = max_tokens
        self._loaded: tuple[Any, Any, set[str]] | None = None
        self._lock = threading.Lock()

    def _load(self) -> tuple[Any, Any, set[str]]:
        with self._lock:
            if self._loaded is None:
                from memoryctl.modelfiles import installed

                where = installed(MODEL, self._dir)
                try:
                    ort = importlib.import_module("onnxruntime")
                    tokenizers = importlib.import_module("tokenizers")
                    options = ort.SessionOptions()
                    options.log_severity_level = 3
                    options.intra_op_num_threads = self._threads
                    options.inter_op_num_threads = 1
                    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
                    session = ort.InferenceSession(
                        str(where / "model.onnx"), options, providers=["CPUExecutionProvider"]
                    )
                    tokenizer = tokenizers.Tokenizer.from_file(str(where / "tokenizer.json"))
                except (ImportError, OSError, RuntimeError, ValueError) as exc:
                    raise ConfigError(f"could not load the rerank model {MODEL}: {exc}") from exc
                tokenizer.enable_truncation(self._max_tokens)
                tokenizer.enable_padding()
                self._loaded = (session, tokenizer, {i.name for i in session.get_inputs()})
        return self._loaded

    where = "cpu"  # what --explain names as the scorer

    def ready(self) -> None:
        self._load()

    def scores(self, question: str, passages: Sequence[str]) -> list[float]:
        if not passages:
            return []
        session, tokenizer, inputs = self._load()
        encoded = tokenizer.encode_batch([(question, p) for p in passages])
        feed = {
            "input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encoded], dtype=np.int64),
        }
        (logits,) = session.run(None, {k: v for k, v in feed.items() if k in inputs})
        return [float(x) for x in np.asarray(logits).reshape(len(passages), -1)[:, 0]]


class ServedScorer:
    """A cross-encoder served by vLLM's score API (the cluster profile's GPU node, a stronger
    model than the CPU one). vLLM answers the model's activated score, a probability for a
    one-logit cross-encoder; it is turned back into a logit so that both scorers meet the same
    contract and the blend treats them alike. One attempt per batch, bounded by ``timeout_s``: a
    slow or absent server costs a query that long at most, then the CPU model takes over
    (:func:`rerank`'s ``fallback``), and after ``failures_to_open`` failures in a row the server is
    not asked again for ``reset_s`` (a breaker), so queries stop paying the timeout."""

    def __init__(
        self, client: VLLMClient, model: str, *, timeout_s: float = 1.0, breaker: Breaker | None = None
    ) -> None:
        from memoryctl.deadline import Breaker

        self.client = client
        self.model = model
        self.timeout_s = timeout_s
        self.breaker = breaker or Breaker(failures_to_open=3, reset_s=30.0)

    @property
    def where(self) -> str:
        return f"{self.model} at {self.client.url}"

    def ready(self) -> None:
        return None

    def scores(self, question: str, passages: Sequence[str]) -> list[float]:
        from memoryctl.errors import StoreUnavailable

        if not passages:
            return []
        if not self.breaker.allow():
            raise StoreUnavailable(self.client.http.store, f"{self.where}: not asked (it failed just before)")
        try:
            probabilities = self.client.score(self.model, question, list(passages), timeout_s=self.timeout_s)
        except MemoryctlError:
            self.breaker.record(False)
            raise
        self.breaker.record(True)
        return [_logit(p) for p in probabilities]


def _logit(p: float) -> float:
    p = min(max(p, 1e-12), 1 - 1e-12)
    return math.log(p / (1 - p))


def passage(memory: Memory) -> str:
    """What the cross-encoder reads of a candidate: who said it and when, then the text."""
    speaker = next((e.name for e in memory.entities if e.type == "Speaker"), None)
    when = f"{memory.created_at.day} {memory.created_at:%B %Y}"
    return f"{speaker} ({when}): {memory.text}" if speaker else f"({when}) {memory.text}"


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(min(x, 60.0), -60.0)))


@dataclass(slots=True)
class Reranked:
    hits: list[Hit]
    read: int  # candidates the cross-encoder scored
    offered: int  # candidates it was given (the top depth)
    note: str | None  # set when the budget ran out before all were read
    fallback: str | None = None  # why the fallback scorer read some or all of them


def rerank(
    hits: Sequence[Hit],
    question: str,
    scorer: PairScorer,
    settings: RerankSettings,
    *,
    fallback: PairScorer | None = None,
    clock: Any = time.perf_counter,
) -> Reranked:
    """The top ``settings.depth`` of ``hits`` in blended order, the rest after them unchanged.
    Past ``budget_s`` no further batch is read; the unread keep the first stage's order. When
    ``scorer`` fails (a served model away) and there is a ``fallback``, the fallback reads the
    batch and the rest, and ``fallback`` in the answer says why; without one the error stands."""
    top = list(hits[: settings.depth])
    start = clock()
    logits: list[float] = []
    why: str | None = None
    while len(logits) < len(top):
        if logits and clock() - start > settings.budget_s:
            break
        texts = [passage(h.memory) for h in top[len(logits) : len(logits) + BATCH]]
        try:
            logits += scorer.scores(question, texts)
        except MemoryctlError as exc:
            if fallback is None or scorer is fallback:
                raise
            why = f"rerank: {exc.message}; the CPU cross-encoder read the candidates instead"
            scorer = fallback
            scorer.ready()
            logits += scorer.scores(question, texts)
    read = top[: len(logits)]
    if read:
        first = [h.score for h in read]
        low, span = min(first), (max(first) - min(first)) or 1.0
        blended = []
        for h, logit in zip(read, logits, strict=True):
            ce = _sigmoid(logit)
            score = settings.blend * ce + (1 - settings.blend) * (h.score - low) / span
            blended.append(dataclasses.replace(h, score=score, scores={**h.scores, "rerank": ce}))
        blended.sort(key=lambda h: -h.score)
    else:
        blended = []
    note = None
    if len(read) < len(top):
        note = (
            f"rerank: the {settings.budget_s * 1000:.0f} ms budget ran out after {len(read)} of {len(top)}"
            " candidates; the rest keep the first-stage order"
        )
    return Reranked([*blended, *top[len(read) :], *hits[settings.depth :]], len(read), len(top), note, why)
