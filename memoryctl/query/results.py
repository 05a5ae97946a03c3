"""What a query returns: ranked hits, the steps that produced them, and what was degraded.

Kept apart from the engine so that callers (the CLI, the Python API, benchmarks) depend on the
shape of an answer, not on the executor that computes it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from memoryctl.model import Memory
from memoryctl.query.spec import MemoryQuery


@dataclass(slots=True)
class Hit:
    id: uuid.UUID
    score: float
    scores: dict[str, float]
    memory: Memory
    sources: list[str]
    relationships: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        m = self.memory
        return {
            "id": str(self.id),
            "score": round(self.score, 6),
            "scores": {k: round(v, 6) for k, v in self.scores.items()},
            "text": m.text,
            "created_at": m.created_at.isoformat(),
            "kind": m.kind,
            "agent_id": m.agent_id,
            "entities": [e.as_dict() for e in m.entities],
            "metadata": m.metadata,
            "relationships": self.relationships,
            "sources": self.sources,
        }


@dataclass(slots=True)
class Step:
    """One store call (or engine step) of a query, as ``--explain`` shows it."""

    name: str
    store: str
    detail: dict[str, Any]
    ms: float = 0.0
    rows_in: int | None = None
    rows_out: int | None = None
    status: str = "ok"
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k) for k in ("name", "store", "detail", "ms", "rows_in", "rows_out", "status", "error")
        }


@dataclass(slots=True)
class QueryResult:
    hits: list[Hit]
    degraded: list[str]
    plan: str  # the plan that ran, with its runtime figures (``executor.Candidates.describe``)
    steps: list[Step]
    query: MemoryQuery
    ms: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def explain(self) -> dict[str, Any]:
        return {
            "plan": self.plan,
            "query": self.query.as_dict(),
            "steps": [s.as_dict() for s in self.steps],
            "total_ms": round(self.ms, 2),
            "notes": self.notes,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "query_id": str(self.query.query_id),
            "hits": [h.as_dict() for h in self.hits],
            "degraded": self.degraded,
            "explain": self.explain,
        }
