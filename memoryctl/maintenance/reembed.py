"""The embed-and-upsert pipeline shared by ``migrate`` (into a new collection) and ``reembed``.

Why its own module: both commands turn PostgreSQL rows into points of one named collection, and
the throughput that matters for a 500k-memory migration is decided here: PostgreSQL reads run in a
background thread one page ahead, so the database round trip overlaps the model and the vector
store instead of adding to them. Vectors always go to an explicitly named collection
(``upsert(model_id=...)``), never "whatever is active", so a swap by another process in the middle
of a batch can never put one model's vectors into another model's collection.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from memoryctl.errors import StoreError
from memoryctl.maintenance.streams import paged_join, prefetch, record_key, row_key
from memoryctl.model import Memory
from memoryctl.stores import names
from memoryctl.stores.protocols import VectorStore
from memoryctl.stores.records import RecordStore
from memoryctl.write.outbox import vector_point

if TYPE_CHECKING:
    from memoryctl.embed import Embedder

T = TypeVar("T")


@dataclass(slots=True)
class PipelineStats:
    embedded: int = 0
    removed: int = 0
    batches: int = 0
    embed_s: float = 0.0  # model time (excluded from the pipeline target)
    upsert_s: float = 0.0
    wait_s: float = 0.0  # waiting for PostgreSQL pages the prefetcher had not produced yet

    def merge(self, other: PipelineStats) -> None:
        for f in ("embedded", "removed", "batches", "embed_s", "upsert_s", "wait_s"):
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def as_dict(self) -> dict[str, Any]:
        return {
            "embedded": self.embedded,
            "removed": self.removed,
            "batches": self.batches,
            "embed_s": round(self.embed_s, 3),
            "upsert_s": round(self.upsert_s, 3),
            "wait_s": round(self.wait_s, 3),
        }


@dataclass(slots=True)
class Reembedder:
    """Embeds memories with ``embedder`` into the collection of ``model_id``."""

    vectors: VectorStore
    embedder: Embedder
    model_id: str
    remove_deleted: bool = True  # migrate: the new collection holds live memories only
    stats: PipelineStats = field(default_factory=PipelineStats)

    def __post_init__(self) -> None:
        if self.embedder.info.model_id != self.model_id:
            raise StoreError(
                names.QDRANT,
                f"refusing to write vectors of {self.embedder.info.model_id!r} into the collection of"
                f" {self.model_id!r}",
            )

    def apply(self, memories: Sequence[Memory]) -> None:
        live = [m for m in memories if m.deleted_at is None]
        dead = [m.id for m in memories if m.deleted_at is not None]
        if live:
            t0 = time.perf_counter()
            vecs = self.embedder.embed_documents([m.text for m in live])
            t1 = time.perf_counter()
            self.vectors.upsert(
                [vector_point(m, v) for m, v in zip(live, vecs.tolist(), strict=True)], model_id=self.model_id
            )
            self.stats.embed_s += t1 - t0
            self.stats.upsert_s += time.perf_counter() - t1
            self.stats.embedded += len(live)
        if dead:
            if self.remove_deleted:
                self.vectors.delete(dead, model_id=self.model_id)
            else:
                self.vectors.set_deleted(dead, True, model_id=self.model_id)
            self.stats.removed += len(dead)
        self.stats.batches += 1

    def run(
        self,
        pages: Iterable[list[Memory]],
        *,
        after_batch: Callable[[list[Memory]], None] | None = None,
    ) -> PipelineStats:
        """Apply every page (PostgreSQL prefetched one page ahead); ``after_batch`` checkpoints."""
        it = prefetch(pages)
        while True:
            t0 = time.perf_counter()
            page = next(it, None)
            self.stats.wait_s += time.perf_counter() - t0
            if page is None:
                return self.stats
            self.apply(page)
            if after_batch is not None:
                after_batch(page)


def ids_of(memories: Sequence[Memory]) -> list[uuid.UUID]:
    return [m.id for m in memories]


@dataclass(slots=True)
class ReembedReport:
    model_id: str
    scanned: int = 0
    changed: int = 0
    stats: PipelineStats = field(default_factory=PipelineStats)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "scanned": self.scanned,
            "changed": self.changed,
            "pipeline": self.stats.as_dict(),
            "seconds": round(self.seconds, 3),
        }


def reembed_changed(
    records: RecordStore,
    vectors: VectorStore,
    embedder: Embedder,
    *,
    agent_id: str | None = None,
    batch: int = 512,
    progress: Callable[[int], None] | None = None,
) -> ReembedReport:
    """Re-embed, in place in the active collection, live memories whose text changed since embedding.

    A merge-join of PostgreSQL's content hashes against the payload hashes of the active collection
    finds them; only those are read in full and embedded, so a nightly run over an unchanged store
    costs one scan and no model time. Refuses when the embedder is not the active model.
    """
    started = time.perf_counter()
    active = vectors.active_model()
    if active is None or active.model_id != embedder.info.model_id:
        raise StoreError(
            names.QDRANT,
            f"the active collection is for {active.model_id if active else None!r}, the embedder is "
            f"{embedder.info.model_id!r}: re-embedding in place would mix models",
            hint="`memoryctl migrate --to-model ...` moves to another model",
        )
    report = ReembedReport(model_id=active.model_id)
    pipe = Reembedder(vectors, embedder, active.model_id, remove_deleted=False, stats=report.stats)
    todo: list[uuid.UUID] = []

    def flush() -> None:
        rows = records.get_many(todo, include_deleted=False)
        pipe.apply([rows[i] for i in todo if i in rows])
        report.changed += len(rows)
        todo.clear()

    pages = records.scroll(agent_id=agent_id, batch=2000, include_deleted=False)
    others = [(vectors.scroll(agent_id=agent_id, model_id=active.model_id, batch=2000), record_key, vectors.name)]
    for chunk in paged_join(pages, row_key, others):
        matched = chunk.matched[0]
        report.scanned += len(chunk.rows)
        if progress is not None and chunk.rows:
            progress(len(chunk.rows))
        for pg in chunk.rows:
            point = matched.get(pg["id"])
            if point is not None and point.content_hash != pg["content_hash"]:
                todo.append(pg["id"])
        if len(todo) >= batch:
            flush()
    if todo:
        flush()
    report.seconds = time.perf_counter() - started
    return report
