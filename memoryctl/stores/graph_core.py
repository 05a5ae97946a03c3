"""The ``GraphStore`` both graph engines share, over a small set of engine primitives.

The same split as the vector stores (``vector_core``): everything an engine does not decide lives
here once. Every input is validated before any engine is touched (``graph_semantics``: relation
types, hops, direction, limits, ids, agents, whole write batches); writes are cut into bounded
transactions when the engine asks for it (``GraphBackend.write_rows``) and a transaction the
engine ended for running out of time is retried in halves; relationships are assembled into
what query results show, in one order; scrolling pages by id. A ``GraphBackend`` only runs the
statements of its engine (Cypher on Neo4j: ``graph_neo4j``; recursive SQL on PostgreSQL:
``graph_sql``) over values already checked.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from memoryctl.errors import StoreTimeout
from memoryctl.model import validate_agent_id
from memoryctl.stores.graph_semantics import (
    PreparedBatch,
    check_ids,
    check_page,
    check_traversal,
    prepare_batch,
    relationship,
    relationship_sort_key,
)
from memoryctl.stores.protocols import GraphIdentity, GraphMemory, GraphRecord, GraphTraversal

T = TypeVar("T")
# One edge of a memory as an engine reads it: (memory id, type, "out"|"in", the node at the other
# end: its id or key, whether it is a memory, its entity type and name when it is an entity).
RelationshipRow = tuple[str, str, str, str, bool, str | None, str | None]
DELETE_WEIGHT = 4  # a deleted memory's edges go with it: each weighs a few rows of a transaction


class GraphBackend(GraphIdentity, Protocol):
    """What a graph engine must do; everything else is ``GraphCore``'s. Every argument is
    validated already: memory ids are lowercase UUID text, traversals have passed
    ``check_traversal``."""

    @property
    def write_rows(self) -> int | None:
        """Rows (memories + edges) per write transaction; None: one transaction per call."""
        ...

    def ensure_schema(self) -> None: ...

    def upsert(self, batch: PreparedBatch) -> None:
        """One transaction: the batch's entities and memories, each memory's declared edges
        replaced by the batch's, entities left without any edge removed."""
        ...

    def set_deleted(self, ids: Sequence[str], deleted: bool) -> None: ...

    def delete(self, ids: Sequence[str]) -> None:
        """The memories, every edge touching or declared by them, and the entities left bare."""
        ...

    def traverse(self, query: GraphTraversal) -> list[uuid.UUID]: ...

    def fanout(self, query: GraphTraversal) -> int: ...

    def near_entities(self, query: GraphTraversal) -> frozenset[str] | None: ...

    def connected(self, query: GraphTraversal, ids: list[str], near: frozenset[str] | None) -> set[uuid.UUID]:
        """Which of ``ids`` (at least one) the traversal reaches."""
        ...

    def relationship_rows(self, ids: list[str]) -> Iterable[RelationshipRow]: ...

    def page(self, agent_id: str | None, after: uuid.UUID | None, batch: int) -> list[GraphRecord]:
        """Up to ``batch`` memories with an id above ``after``, in id order."""
        ...

    def count(self, agent_id: str | None) -> int: ...

    def ping(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class GraphCore:
    """``GraphStore`` over a ``GraphBackend``: the protocol's semantics, once."""

    def __init__(self, backend: GraphBackend) -> None:
        self.backend = backend

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def engine(self) -> str:
        return self.backend.engine

    @property
    def cheap_membership(self) -> bool:
        return self.backend.cheap_membership

    def ensure_schema(self) -> None:
        self.backend.ensure_schema()

    # -- writes ----------------------------------------------------------------------------------
    def upsert_memories(self, items: Sequence[GraphMemory]) -> None:
        """Bounded transactions when the engine asks for them, split further if one times out.

        Every memory is written whole or not at all (its node and edges share a transaction); when
        a call fails part-way, the memories of the transactions that committed are complete and the
        caller's outbox still holds all of them, so delivering them again converges.
        """
        batch = prepare_batch(items)  # refuse a batch with one bad item before anything is written
        if not batch.memories:
            return
        if self.backend.write_rows is None:
            self.backend.upsert(batch)
            return
        latest = list({item.id: item for item in items}.values())  # later items win, as in prepare_batch
        for chunk in chunks(latest, self.backend.write_rows, lambda m: 1 + len(m.mentions) + len(m.edges)):
            split_on_timeout(chunk, lambda part: self.backend.upsert(prepare_batch(part)))

    def set_deleted(self, ids: Sequence[uuid.UUID], deleted: bool = True) -> None:
        self._write_ids(check_ids(ids), 1, lambda keys: self.backend.set_deleted(keys, bool(deleted)))

    def delete(self, ids: Sequence[uuid.UUID]) -> None:
        self._write_ids(check_ids(ids), DELETE_WEIGHT, self.backend.delete)

    def _write_ids(self, keys: list[str], weight: int, write: Callable[[Sequence[str]], None]) -> None:
        if not keys:
            return
        if self.backend.write_rows is None:
            write(keys)
            return
        for chunk in chunks(keys, self.backend.write_rows, lambda _: weight):
            split_on_timeout(chunk, write)

    # -- reads -----------------------------------------------------------------------------------
    def traverse(self, query: GraphTraversal) -> list[uuid.UUID]:
        return self.backend.traverse(check_traversal(query))

    def fanout(self, query: GraphTraversal) -> int:
        return self.backend.fanout(check_traversal(query))

    def near_entities(self, query: GraphTraversal) -> frozenset[str] | None:
        return self.backend.near_entities(check_traversal(query))

    def connected(
        self, query: GraphTraversal, ids: Sequence[uuid.UUID], *, near: frozenset[str] | None = None
    ) -> set[uuid.UUID]:
        q = check_traversal(query)
        keys = list(dict.fromkeys(check_ids(ids)))
        return self.backend.connected(q, keys, near) if keys else set()

    def relationships(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[dict[str, Any]]]:
        keys = check_ids(ids)
        result: dict[uuid.UUID, list[dict[str, Any]]] = {uuid.UUID(k): [] for k in keys}
        if not keys:
            return result
        for mid, rel_type, direction, other, is_memory, etype, name in self.backend.relationship_rows(keys):
            result[uuid.UUID(mid)].append(relationship(rel_type, direction, other, is_memory, etype, name))
        for rels in result.values():
            rels.sort(key=relationship_sort_key)
        return result

    def scroll(self, *, agent_id: str | None = None, batch: int = 1000) -> Iterator[list[GraphRecord]]:
        agent = check_page(agent_id, batch)
        after: uuid.UUID | None = None
        while True:
            rows = self.backend.page(agent, after, batch)
            if not rows:
                return
            yield rows
            if len(rows) < batch:
                return
            after = rows[-1].id

    def count(self, *, agent_id: str | None = None) -> int:
        return self.backend.count(validate_agent_id(agent_id) if agent_id is not None else None)

    def ping(self) -> dict[str, Any]:
        return self.backend.ping()

    def close(self) -> None:
        self.backend.close()


def chunks(items: Sequence[T], budget: int, weight: Callable[[T], int]) -> Iterator[Sequence[T]]:
    """Consecutive runs of ``items`` whose weights add up to at most ``budget`` (at least one item each)."""
    lo, used = 0, 0
    for i, item in enumerate(items):
        w = weight(item)
        if i > lo and used + w > budget:
            yield items[lo:i]
            lo, used = i, 0
        used += w
    if lo < len(items):
        yield items[lo:]


def split_on_timeout(items: Sequence[T], write: Callable[[Sequence[T]], None]) -> None:
    """Write ``items`` in one transaction; if it times out, in two halves, and so on down to one."""
    try:
        write(items)
    except StoreTimeout:
        if len(items) <= 1:
            raise
        half = len(items) // 2
        split_on_timeout(items[:half], write)
        split_on_timeout(items[half:], write)
