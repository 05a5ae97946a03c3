"""Delivering the outbox to the vector store and the graph.

Each target drains independently: Neo4j being down must not hold back Qdrant. A batch is claimed
with ``FOR UPDATE SKIP LOCKED``, projected from the memories' current rows, written with idempotent
upserts keyed by the memory UUID, and only then removed from the outbox. An outage (the store
cannot be reached, times out, or this process cannot deliver to it now) leaves the batch in the
outbox with a back-off and the error recorded: delayed, never lost.

One bad record must not stop the rest (issue 22: a memory whose timestamp PostgreSQL stored but
could not give back stopped every delivery, for every agent). Any other failure is narrowed down:
the batch is halved until the memories that fail alone are found, and the rest is delivered. A
memory that fails alone is **set aside** (``RecordStore.set_aside``: out of the queue, its error
kept; ``memoryctl health`` shows it, ``memoryctl outbox list|retry|drop`` handle it) when the store
said the data is at fault (``BadRecord``) or when other memories of the same batch were delivered
(the store works, this record does not). Without either (a batch of one, or a second memory that
fails alone before any went through) the target is failing, not the records: the batch waits
with a back-off, as in an outage, and is narrowed down again in a later, larger batch.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memoryctl.errors import BadRecord, MemoryctlError, StoreError, StoreUnavailable
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


@dataclass(slots=True)
class _Narrowing:
    """What narrowing a failed batch down found so far: delivered items, items failing alone."""

    delivered: list[OutboxItem] = field(default_factory=list)
    failed: list[tuple[OutboxItem, MemoryctlError]] = field(default_factory=list)


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
                done, claimed = self._one_batch(target, batch, memory_ids, wait_s)
            except MemoryctlError as exc:
                return total, exc
            if claimed == 0:
                break
            total += done
        return total, None

    def _one_batch(
        self, target: str, limit: int, memory_ids: Sequence[uuid.UUID] | None, wait_s: float | None
    ) -> tuple[int, int]:
        """One claimed batch: (memories delivered, outbox rows claimed); an outage is raised."""
        with self.records.claim(target, limit=limit, memory_ids=memory_ids, wait_s=wait_s) as items:
            if not items:
                return 0, 0
            claimed = list(items)
            narrowing = _Narrowing()
            try:
                self._isolate(target, claimed, narrowing)
                outage = None
            except MemoryctlError as exc:
                outage = exc
            blamed = [error for _, error in narrowing.failed if not isinstance(error, BadRecord)]
            if outage is None and blamed and not narrowing.delivered:
                outage = blamed[0]  # no evidence the store takes anything: it waits, as in an outage
            items[:] = narrowing.delivered if outage is None else []  # only these leave the outbox
        if outage is not None:
            self.records.defer(claimed, outage.message)
            raise outage
        if narrowing.failed:
            self.records.set_aside([(item, error.message) for item, error in narrowing.failed])
        return len({i.memory_id for i in narrowing.delivered}), len(claimed)

    def _isolate(self, target: str, items: list[OutboxItem], narrowing: _Narrowing) -> None:
        """Deliver ``items``; when that fails otherwise than by an outage, halve them (a memory's
        items stay together) until each memory that fails alone is known (``narrowing``).

        Raised, so that the whole claim waits: an outage (what was delivered before it is delivered
        again later: upserts are idempotent), and the target failing rather than the records -- a
        second memory failing alone, with nothing delivered and no ``BadRecord`` to blame the data.
        """
        try:
            self._apply(target, items)
            narrowing.delivered += items
            return
        except StoreUnavailable:
            raise
        except MemoryctlError as exc:
            error = exc
        except Exception as exc:  # a bug or a library's surprise for one record: narrowed down too
            error = StoreError(target, f"{type(exc).__name__}: {exc}"[:500])
        ids = sorted({i.memory_id for i in items})
        if len(ids) > 1:
            first = set(ids[: len(ids) // 2])
            self._isolate(target, [i for i in items if i.memory_id in first], narrowing)
            self._isolate(target, [i for i in items if i.memory_id not in first], narrowing)
            return
        if (
            not isinstance(error, BadRecord)
            and not narrowing.delivered
            and any(not isinstance(e, BadRecord) for _, e in narrowing.failed)
        ):
            raise error  # two memories failed alone and none went through: the target is failing
        narrowing.failed += [(i, error) for i in items]

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
            raise StoreUnavailable(names.QDRANT, "no vector store configured")
        live = [m for m in memories if m.deleted_at is None]
        dead = [m.id for m in memories if m.deleted_at is not None]
        if live:
            # Never put one model's vectors into another model's collection (same dimension or not):
            # a process still configured for the old model after `migrate` swapped the alias leaves
            # its batch in the outbox for a process with the active model instead.
            model_id = self.embedder.info.model_id
            active = self.vectors.active_model()
            if active is not None and active.model_id != model_id:
                raise StoreUnavailable(  # to this process: another one delivers
                    names.QDRANT,
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
            raise StoreUnavailable(names.NEO4J, "no graph store configured")
        if memories:
            self.graph.upsert_memories([graph_memory(m) for m in memories])
        if purge:
            self.graph.delete(purge)
