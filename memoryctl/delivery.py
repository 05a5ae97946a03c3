"""Delivering the outbox to the vector store and the graph.

Each target drains independently: Neo4j being down must not hold back Qdrant. A batch is claimed
with ``FOR UPDATE SKIP LOCKED``, projected from the memories' current rows, written with idempotent
upserts keyed by the memory UUID, and only then removed from the outbox. A failure leaves the batch
in the outbox with a back-off and the error recorded: delayed, never lost.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memoryctl.errors import MemoryctlError, StoreError
from memoryctl.model import Memory, MemoryRef, NodeRef
from memoryctl.stores import names
from memoryctl.stores.protocols import GraphEdge, GraphEntity, GraphMemory, GraphStore, VectorPoint, VectorStore
from memoryctl.stores.records import OutboxItem, RecordStore

if TYPE_CHECKING:
    from memoryctl.embed import Embedder

SCALAR = (str, int, float, bool)


def vector_point(m: Memory, vector: Sequence[float]) -> VectorPoint:
    return VectorPoint(
        id=m.id,
        vector=vector,
        agent_id=m.agent_id,
        kind=m.kind,
        created_at=m.created_at,
        content_hash=m.hash,
        entity_keys=m.entity_keys,
        deleted=m.deleted_at is not None,
        meta={k: v for k, v in m.metadata.items() if isinstance(v, SCALAR)},
    )


def _node_id(node: NodeRef, agent_id: str) -> str | uuid.UUID:
    return node.id if isinstance(node, MemoryRef) else node.key(agent_id)


def graph_memory(m: Memory) -> GraphMemory:
    entities = [GraphEntity(e.key(m.agent_id), e.type, e.name) for e in m.all_entities()]
    return GraphMemory(
        id=m.id,
        agent_id=m.agent_id,
        created_at=m.created_at,
        deleted=m.deleted_at is not None,
        entities=entities,
        mentions=m.entity_keys,
        edges=[GraphEdge(_node_id(r.source, m.agent_id), r.type, _node_id(r.target, m.agent_id)) for r in m.relations],
    )


@dataclass(slots=True)
class DeliveryReport:
    delivered: dict[str, int] = field(default_factory=lambda: {"vector": 0, "graph": 0})
    failed: dict[str, str] = field(default_factory=dict)  # target -> error
    seconds: float = 0.0

    def merge(self, other: DeliveryReport) -> None:
        for k, v in other.delivered.items():
            self.delivered[k] = self.delivered.get(k, 0) + v
        self.failed.update(other.failed)
        self.seconds += other.seconds

    def as_dict(self) -> dict[str, Any]:
        return {"delivered": dict(self.delivered), "failed": dict(self.failed), "seconds": round(self.seconds, 3)}


class Deliverer:
    def __init__(
        self, records: RecordStore, vectors: VectorStore | None, graph: GraphStore | None, embedder: Embedder | None
    ) -> None:
        self.records = records
        self.vectors = vectors
        self.graph = graph
        self.embedder = embedder

    def deliver(
        self,
        *,
        memory_ids: Sequence[uuid.UUID] | None = None,
        batch: int = 256,
        max_batches: int | None = None,
        targets: Sequence[str] = ("vector", "graph"),
        wait_held_s: float | None = None,
    ) -> DeliveryReport:
        """Drain due outbox rows (all, or only those of ``memory_ids``), target by target.

        Rows another delivery holds are skipped, so parallel drains never wait on each other. A
        caller that must know whether its ``memory_ids`` landed (reconcile's repair: cron's own
        reconcile or ``sync`` may be delivering the same ids) passes ``wait_held_s``: after the
        skipping passes, one waiting pass outlasts the other delivery, then delivers what it left.
        """
        report = DeliveryReport()
        start = time.perf_counter()
        waits: list[float | None] = [None] if wait_held_s is None or memory_ids is None else [None, wait_held_s]
        for target in targets:
            for wait_s in waits:
                done, error = self._drain(target, batch, max_batches, memory_ids, wait_s)
                report.delivered[target] += done
                if error is not None:
                    report.failed[target] = error.message
                    break
        report.seconds = time.perf_counter() - start
        return report

    def _drain(
        self,
        target: str,
        batch: int,
        max_batches: int | None,
        memory_ids: Sequence[uuid.UUID] | None,
        wait_s: float | None,
    ) -> tuple[int, MemoryctlError | None]:
        """Batches until none is left (or ``max_batches``): memories delivered, and the error that stopped it."""
        total = n = 0
        while max_batches is None or n < max_batches:
            n += 1
            try:
                done = self._one_batch(target, batch, memory_ids, wait_s)
            except MemoryctlError as exc:
                return total, exc
            if done == 0:
                break
            total += done
        return total, None

    def _one_batch(self, target: str, limit: int, memory_ids: Sequence[uuid.UUID] | None, wait_s: float | None) -> int:
        failure: MemoryctlError | None = None
        failed_items: list[OutboxItem] = []
        with self.records.claim(target, limit=limit, memory_ids=memory_ids, wait_s=wait_s) as items:
            if not items:
                return 0
            try:
                self._apply(target, items)
            except MemoryctlError as exc:
                failure, failed_items = exc, list(items)
                items.clear()  # nothing is removed from the outbox
        if failure is not None:
            self.records.defer(failed_items, failure.message)
            raise failure
        return len({i.memory_id for i in items})

    def _apply(self, target: str, items: Sequence[OutboxItem]) -> None:
        purge = sorted({i.memory_id for i in items if i.op == "purge"})
        upsert_ids = sorted({i.memory_id for i in items if i.op == "upsert"} - set(purge))
        found = self.records.get_many(upsert_ids)
        # In id order, not the order PostgreSQL happened to return the rows in: a vector store lists
        # equal-score points in the order they were written, so the same data must be written in
        # the same order for the same query to give the same answer (and a benchmark the same figure).
        memories = [found[mid] for mid in upsert_ids if mid in found]
        # A memory purged after its upsert was queued has no row any more: nothing to upsert.
        gone = [mid for mid in upsert_ids if mid not in found]
        if target == "vector":
            self._vector(memories, purge + gone)
        else:
            self._graph(memories, purge + gone)

    def _vector(self, memories: list[Memory], purge: list[uuid.UUID]) -> None:
        if self.vectors is None or self.embedder is None:
            raise StoreError(names.VECTORS, "no vector store configured")
        live = [m for m in memories if m.deleted_at is None]
        dead = [m.id for m in memories if m.deleted_at is not None]
        if live:
            # Never put one model's vectors into another model's collection (same dimension or not):
            # a process still configured for the old model after `migrate` swapped the alias leaves
            # its batch in the outbox for a process with the active model instead.
            model_id = self.embedder.info.model_id
            active = self.vectors.active_model()
            if active is not None and active.model_id != model_id:
                raise StoreError(
                    names.VECTORS,
                    f"embedder {model_id!r} is not the active model {active.model_id!r}; delivery waits",
                    hint="restart long-running memoryctl processes after `memoryctl migrate` (they then embed "
                    "with the active model); nothing is lost, the outbox keeps the entries",
                )
            vectors = self.embedder.embed_documents([m.text for m in live])
            self.vectors.upsert(
                [vector_point(m, v) for m, v in zip(live, vectors.tolist(), strict=True)], model_id=model_id
            )
        if dead:
            self.vectors.set_deleted(dead, True)
        if purge:
            self.vectors.delete(purge)

    def _graph(self, memories: list[Memory], purge: list[uuid.UUID]) -> None:
        if self.graph is None:
            raise StoreError(names.NEO4J, "no graph store configured")
        if memories:
            self.graph.upsert_memories([graph_memory(m) for m in memories])
        if purge:
            self.graph.delete(purge)
