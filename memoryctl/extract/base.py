"""The extractor contract: text in, entities and relations out, never anything executable.

Why a separate step with its own result type: extraction runs at ingest, before the memory's row is
written, and what it returns is *data* that later becomes graph nodes and edges. Every entity goes
through ``EntityRef`` (type pattern, name length, no control characters) and every relation through
``Relation`` (type whitelist), so an extractor — rules or an LLM — can only ever propose values that
the graph adapters bind as parameters.

Relations that involve the memory itself use ``MemoryRef(memory_id)``. The write path knows the id
before it calls ``extract`` and passes it; when it does not (a dry run), ``THIS_MEMORY`` stands in
and ``Extraction.bind`` replaces it later.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from memoryctl.model import EntityRef, MemoryRef, NodeRef, Relation

#: Placeholder for "the memory being written" when the caller did not pass its id.
THIS_MEMORY = MemoryRef(uuid.UUID(int=0))

#: Hard caps per memory, so a hostile or runaway text cannot flood the graph.
MAX_ENTITIES = 64
MAX_RELATIONS = 64


@dataclass(frozen=True, slots=True)
class Extraction:
    """What an extractor found. ``dropped`` counts proposals rejected by validation (for logs and
    tests); ``degraded`` names why a fallback was used (e.g. the LLM was unreachable)."""

    entities: list[EntityRef] = field(default_factory=list)
    relations: list[Relation] = field(default_factory=list)
    dropped: int = 0
    degraded: str | None = None

    def bind(self, memory_id: uuid.UUID) -> Extraction:
        """Replace the ``THIS_MEMORY`` placeholder with the real memory id."""

        def node(n: NodeRef) -> NodeRef:
            return MemoryRef(memory_id) if n == THIS_MEMORY else n

        rels = [Relation(node(r.source), r.type, node(r.target)) for r in self.relations]
        return Extraction(list(self.entities), rels, self.dropped, self.degraded)


@runtime_checkable
class Extractor(Protocol):
    name: str  # "rules", "llm", "none" — for logs and `config show`

    def extract(self, text: str, memory_id: uuid.UUID | None = None) -> Extraction:
        """Entities mentioned in ``text`` and relations between them (or with the memory)."""
        ...


class NoExtractor:
    """Extraction switched off: only the entities the caller names explicitly are stored."""

    name = "none"

    def extract(self, text: str, memory_id: uuid.UUID | None = None) -> Extraction:
        return Extraction()
