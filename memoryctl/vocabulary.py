"""Which entity and relationship types a deployment accepts.

The *shape* of a type is checked where the value is made (``memoryctl.model``): any identifier of
the documented shape, because that is all it takes to be safe as an identifier in SQL or Cypher.
Which types are *wanted* is the operator's choice: ``[graph] entity_types`` / ``relation_types``
narrow the set (empty lists accept any well-formed type). This module applies that choice at the
client's doors — writes, imports (a line with an unlisted type is a bad line, reported by number)
and graph filters — so a typo such as ``AUTHROED`` is refused instead of silently starting a new,
unconnected type. ``MENTIONS`` is memoryctl's own and always allowed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from memoryctl.config import GraphSettings
from memoryctl.errors import InputError
from memoryctl.model import BadLine, EntityRef, Memory
from memoryctl.query.spec import MemoryQuery

MENTIONS = "MENTIONS"


@dataclass(frozen=True, slots=True)
class Vocabulary:
    entity_types: frozenset[str] = frozenset()  # empty: any well-formed type
    relation_types: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, settings: GraphSettings) -> Vocabulary:
        return cls(frozenset(settings.entity_types), frozenset(settings.relation_types))

    def check_entity_type(self, type_: str) -> None:
        if self.entity_types and type_ not in self.entity_types:
            raise InputError(
                f"entity type {type_!r} is not in the configured allow-list",
                hint="allowed: " + ", ".join(sorted(self.entity_types)) + " ([graph] entity_types)",
            )

    def check_relation_type(self, type_: str) -> None:
        if self.relation_types and type_ != MENTIONS and type_ not in self.relation_types:
            raise InputError(
                f"relationship type {type_!r} is not in the configured allow-list",
                hint="allowed: " + ", ".join(sorted(self.relation_types)) + " ([graph] relation_types)",
            )

    def check_memory(self, m: Memory) -> Memory:
        for e in m.entities:
            self.check_entity_type(e.type)
        for r in m.relations:
            self.check_relation_type(r.type)
            for node in (r.source, r.target):
                if isinstance(node, EntityRef):
                    self.check_entity_type(node.type)
        return m

    def check_query(self, q: MemoryQuery) -> MemoryQuery:
        if q.graph is not None:
            self.check_entity_type(q.graph.entity.type)
            for t in q.graph.via:
                self.check_relation_type(t)
        return q

    def screen(self, lines: Iterable[tuple[int, Memory | BadLine]]) -> Iterator[tuple[int, Memory | BadLine]]:
        """Import lines with unlisted types turned into bad lines (reported, not imported)."""
        for n, item in lines:
            if isinstance(item, Memory):
                try:
                    self.check_memory(item)
                except InputError as exc:
                    item = BadLine(n, exc.message)
            yield n, item
