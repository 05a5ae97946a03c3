"""Promotion gates: a candidate adapter replaces the active model only on evidence.

* Embedding adapters: recall@k over the held-out (query, positive) pairs, searching the corpus of
  all held-out positives, must beat the active model's by more than ``min_improvement`` (0 by
  default: strictly better). A candidate that only matches is rejected: promoting it would change
  the served model for nothing and cost a ``migrate`` of every vector. The active model may be the
  base model or yesterday's adapter; both are just encoders here, so the same gate also works for
  any embedder the lead passes (anything with ``encode(list[str]) -> array``).
* Generation adapters: mean held-out token loss must improve on the active model's by at least
  ``min_improvement``.

Both return a :class:`Decision` whose ``metrics`` go verbatim into the run record, so an operator
can see *why* yesterday's adapter was (not) promoted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .datasets import EmbeddingPair


class Encoder(Protocol):
    def encode(self, texts: Sequence[str]) -> Any:  # returns an (n, d) array-like
        ...


@dataclass(frozen=True)
class Decision:
    promote: bool
    metrics: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


def retrieval_metrics(query_vecs: Any, corpus_vecs: Any, positives: Sequence[int], k: int) -> dict[str, float]:
    """recall@k and MRR of each query's positive among the corpus, by cosine similarity.

    ``positives[i]`` is the corpus row of query i's positive. Vectors are re-normalised here so
    that un-normalised encoders are compared fairly. Ties are broken by corpus order (stable sort),
    which keeps the metric deterministic.
    """
    q = _normalise(np.asarray(query_vecs, dtype=np.float64))
    c = _normalise(np.asarray(corpus_vecs, dtype=np.float64))
    if len(q) == 0:
        return {"recall_at_k": 0.0, "mrr": 0.0, "queries": 0.0, "corpus": float(len(c))}
    scores = q @ c.T
    order = np.argsort(-scores, axis=1, kind="stable")
    pos = np.asarray(positives)
    ranks = np.argmax(order == pos[:, None], axis=1)  # 0-based rank of the positive
    return {
        "recall_at_k": float(np.mean(ranks < k)),
        "mrr": float(np.mean(1.0 / (ranks + 1))),
        "queries": float(len(q)),
        "corpus": float(len(c)),
    }


def heldout_retrieval(pairs: Sequence[EmbeddingPair]) -> tuple[list[str], list[str], list[int]]:
    """Queries, the de-duplicated corpus of positives, and each query's corpus index."""
    corpus_ids: dict[str, int] = {}
    corpus: list[str] = []
    for p in pairs:
        if p.positive_id not in corpus_ids:
            corpus_ids[p.positive_id] = len(corpus)
            corpus.append(p.positive)
    return [p.query for p in pairs], corpus, [corpus_ids[p.positive_id] for p in pairs]


def recall_at_k(encoder: Encoder, pairs: Sequence[EmbeddingPair], k: int) -> dict[str, float]:
    queries, corpus, positives = heldout_retrieval(pairs)
    return retrieval_metrics(encoder.encode(queries), encoder.encode(corpus), positives, k)


def embedding_gate(
    candidate: Encoder,
    active: Encoder,
    heldout: Sequence[EmbeddingPair],
    *,
    k: int = 5,
    min_improvement: float = 0.0,
    min_heldout: int = 1,
) -> Decision:
    """Promote when candidate recall@k > active recall@k + min_improvement on the same held-out slice."""
    if len(heldout) < min_heldout:
        return Decision(
            False,
            {"heldout": len(heldout)},
            f"held-out slice too small ({len(heldout)} < {min_heldout}); not promoting blind",
        )
    cand = recall_at_k(candidate, heldout, k)
    act = recall_at_k(active, heldout, k)
    return embedding_gate_from_metrics(cand, act, k=k, min_improvement=min_improvement)


def embedding_gate_from_metrics(
    candidate: dict[str, float], active: dict[str, float], *, k: int, min_improvement: float = 0.0
) -> Decision:
    """The decision alone, for metrics computed elsewhere (e.g. during training)."""
    c, a = candidate["recall_at_k"], active["recall_at_k"]
    metrics = {
        "k": k,
        "min_improvement": min_improvement,
        "candidate_recall_at_k": c,
        "active_recall_at_k": a,
        "candidate_mrr": candidate.get("mrr"),
        "active_mrr": active.get("mrr"),
        "heldout_queries": candidate.get("queries"),
        "corpus_size": candidate.get("corpus"),
    }
    if c - a > min_improvement + 1e-12:
        return Decision(True, metrics, f"recall@{k} {c:.3f} improves on active {a:.3f} (needed > +{min_improvement})")
    if c + 1e-12 < a:
        return Decision(False, metrics, f"recall@{k} regressed: {c:.3f} < active {a:.3f}")
    return Decision(False, metrics, f"recall@{k} {c:.3f} does not beat active {a:.3f} by more than {min_improvement}")


def generation_gate(candidate_loss: float, active_loss: float, *, min_improvement: float = 0.0) -> Decision:
    """Promote when held-out loss strictly improves by more than ``min_improvement``."""
    metrics = {
        "candidate_heldout_loss": candidate_loss,
        "active_heldout_loss": active_loss,
        "improvement": active_loss - candidate_loss,
        "min_improvement": min_improvement,
    }
    if not np.isfinite(candidate_loss):
        return Decision(False, metrics, "candidate held-out loss is not finite")
    if active_loss - candidate_loss > min_improvement:
        return Decision(True, metrics, f"held-out loss improved {active_loss:.4f} -> {candidate_loss:.4f}")
    return Decision(
        False,
        metrics,
        f"held-out loss did not improve enough ({active_loss:.4f} -> {candidate_loss:.4f}, needed > {min_improvement})",
    )


def _normalise(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.asarray(x / np.where(norms == 0, 1.0, norms))
