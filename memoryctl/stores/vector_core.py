"""The ``VectorStore`` both vector engines share, over a small set of engine primitives.

Layout (README, "Data model and write path"): one collection per embedding model version, named from the model
id (``<prefix>__<slug>__<hash8>``: the slug keeps it readable, the hash keeps two ids that slug
alike apart), reached through an "active" pointer (the server's alias ``memories``; a file for
Qdrant Edge). A collection describes itself (model id, dimension, distance), so a restore or a
second operator never has to guess which model made its vectors.

Everything an engine does not decide lives here once: which collection a call goes to, refusing
to search a collection with another model's query vector (even at equal dimension), refusing to
drop the active collection, dimension checks, write and id-list chunking, merging per-chunk top-k
lists, paging, and the payload and filter semantics (``vector_filter``). A ``VectorBackend`` only
stores, finds and counts points in a named collection and keeps the pointer.

Payload per point: ``agent_id``, ``kind``, ``created_at`` (RFC 3339, UTC), ``content_hash``,
``entity_keys`` (list), ``deleted`` (bool) and ``meta`` (scalar metadata, filterable as
``meta.<key>``). The memory id is the point id and is not repeated in the payload: every payload
value costs ~5 us to convert in qdrant-edge-py's binding, which bounds bulk writes (migrate).
The payload indexes are created together with the collection, before it can receive a point,
never on demand: building an index on a live collection is a slow, lock-taking operation that must
not be triggered by a query.

Candidate id lists (graph -> ids -> vector search) are split into chunks of ``id_chunk_size``:
each chunk becomes one request of a single batch call (one round trip) and the per-chunk top-k
lists are merged. Why chunk at all: the request body grows ~40 bytes per id, the server must
materialise the id set per request and, in a cluster, per shard; an unbounded list from a 3-hop
traversal can be hundreds of thousands of ids. With chunks every request stays bounded and the
merge is exact (the global top-k is contained in the union of the per-chunk top-k). The default
(1,000) comes from benchmarks/vector_chunks.py (Edge, 100k x 384, ``HasIdCondition``, top-10, on a
2-core box with load average ~9): 100 ids 0.5 ms, 1,000 ids 5.7 ms, 2,000 ids 16 ms, 5,000 ids
91 ms, 10,000 ids 162 ms: the cost per id grows past ~1,000, and 1,000 keeps a server request under
~40 kB. Through the store (chunks as one batch), 5,000 ids cost 110-240 ms whatever the chunk size
between 500 and 5,000 under that load: chunking is about bounded requests, not speed; re-measure
on an idle machine before tuning. ``HasIdCondition`` (point ids) beat ``MatchAny`` on a
keyword-indexed ``id`` field at every size (1,000 ids: 5.7 vs 21 ms), hence no index on ``id``.
"""

from __future__ import annotations

import hashlib
import math
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, cast

import numpy as np

from memoryctl.errors import InputError, StoreError
from memoryctl.model import is_meta_key
from memoryctl.stores import names
from memoryctl.stores.protocols import (
    CollectionInfo,
    EmbeddingModelInfo,
    VectorFilter,
    VectorHit,
    VectorPoint,
    VectorRecord,
)
from memoryctl.stores.vector_filter import Filter, build_filter, empty_selection, meta_key, to_utc

STORE = names.QDRANT
DEFAULT_ID_CHUNK = 1000
# Payload fields read back by search / scroll; the rest stays in the engine.
HIT_FIELDS = ["agent_id", "created_at", "kind"]
RECORD_FIELDS = ["agent_id", "content_hash", "deleted"]
_SLUG = re.compile(r"[^a-z0-9]+")
Distance = Literal["cosine", "dot", "euclid"]
IndexField = tuple[str, str, bool, bool]  # (field, kind, is_tenant, hnsw)

# The payload schema every collection is created with. ``agent_id`` is the tenant key, so Qdrant
# co-locates each agent's points. ``hnsw`` False = no per-value HNSW subgraphs for that field:
# ``deleted`` is false for almost every point (its subgraph would duplicate the main graph) and
# ``content_hash`` is unique per point (a subgraph per value is never usable); both only filter,
# and each subgraph adds build time to optimize() / the server's indexer.
PAYLOAD_SCHEMA: tuple[IndexField, ...] = (
    ("agent_id", "keyword", True, True),
    ("kind", "keyword", False, True),
    ("created_at", "datetime", False, True),
    ("entity_keys", "keyword", False, True),
    ("deleted", "bool", False, False),
    ("content_hash", "keyword", False, False),
)


def index_fields(meta_indexes: Mapping[str, str]) -> tuple[IndexField, ...]:
    """PAYLOAD_SCHEMA plus the configured metadata indexes (``[qdrant] indexed_metadata``)."""
    extra = tuple((meta_key(k), kind, False, kind != "number") for k, kind in sorted(meta_indexes.items()))
    for _, kind, _, _ in extra:
        if kind not in ("number", "keyword", "bool"):
            raise InputError(f"metadata index type {kind!r} is not number, keyword or bool")
    return PAYLOAD_SCHEMA + extra


def collection_name(prefix: str, model_id: str) -> str:
    """``<prefix>__<slug>__<hash8>``: readable, safe for paths and Qdrant, unique per model id."""
    if not model_id or not isinstance(model_id, str):
        raise InputError(f"invalid embedding model id {model_id!r}", hint="a model id is a non-empty string")
    slug = _SLUG.sub("-", model_id.lower()).strip("-")[:48] or "model"
    digest = hashlib.sha256(model_id.encode("utf-8")).hexdigest()[:8]
    return f"{prefix}__{slug}__{digest}"


def iso(value: datetime) -> str:
    return to_utc(value).isoformat()


def scalar_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """The metadata that can be pushed down: identifier keys with str/int/float/bool values.

    Anything else (nested objects, lists, None, keys that are not identifiers) is not filterable by
    ``VectorFilter.meta`` anyway, so it is left out rather than rejected: the sync daemon must never
    wedge on a record whose metadata the source of truth already accepted.
    """
    return {
        key: value
        for key, value in meta.items()
        if is_meta_key(key)
        and (isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value)))
    }


def point_payload(p: VectorPoint) -> dict[str, Any]:
    """The payload of one point; every value travels as data, never as query text."""
    return {
        "agent_id": p.agent_id,
        "kind": p.kind,
        "created_at": iso(p.created_at),
        "content_hash": p.content_hash,
        "entity_keys": list(p.entity_keys),
        "deleted": bool(p.deleted),
        "meta": scalar_meta(dict(p.meta)),
    }


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for lo in range(0, len(items), size):
        yield items[lo : lo + size]


def _uuid(point_id: Any) -> uuid.UUID:
    return point_id if isinstance(point_id, uuid.UUID) else uuid.UUID(str(point_id))


def hit_from(point_id: Any, score: float, payload: dict[str, Any] | None) -> VectorHit:
    """A search hit from a point's id, score and payload."""
    pl = payload or {}
    return VectorHit(
        id=_uuid(point_id),
        score=float(score),
        agent_id=str(pl.get("agent_id", "")),
        created_at=to_utc(datetime.fromisoformat(str(pl["created_at"]))),
        kind=str(pl.get("kind", "")),
    )


def record_from(point_id: Any, payload: dict[str, Any] | None, model_id: str) -> VectorRecord:
    """What reconciliation compares, from a scrolled point (no vector)."""
    pl = payload or {}
    return VectorRecord(
        id=_uuid(point_id),
        agent_id=str(pl.get("agent_id", "")),
        content_hash=str(pl.get("content_hash", "")),
        deleted=bool(pl.get("deleted", False)),
        model_id=model_id,
    )


def merge_hits(lists: Sequence[Sequence[VectorHit]], limit: int, distance: Distance) -> list[VectorHit]:
    """Exact global top-k from per-chunk top-k lists (Euclid scores are distances: lower is better)."""
    seen: dict[uuid.UUID, VectorHit] = {}
    for hits in lists:
        for h in hits:
            seen.setdefault(h.id, h)
    return sorted(seen.values(), key=lambda h: h.score, reverse=distance != "euclid")[:limit]


# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Search:
    """One batch of nearest-neighbour requests against one collection (one per id chunk)."""

    vector: list[float]
    filters: list[Filter]
    limit: int
    score_threshold: float | None
    filters_metadata: bool  # a ``meta.*`` condition filters (Edge then searches exactly)


class VectorBackend(Protocol):
    """What an engine must do; everything else is ``VectorCore``'s.

    Every call runs inside ``errors(op)``, which maps the engine's exceptions to ``StoreError`` /
    ``StoreUnavailable``. Collections are named by ``collection_name``; the backend never decides
    which one a call goes to.
    """

    kind: str  # "qdrant", "qdrant-local", "qdrant-edge": what ``ping`` reports
    location: str
    write_batch: int  # points per upsert call

    def errors(self, op: str) -> AbstractContextManager[None]: ...

    def pointer(self) -> str:
        """How the active pointer is called in messages (the alias, or the file)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What ``ping`` adds for this engine (the alias, the active collection's point count)."""
        ...

    def model_of(self, name: str) -> EmbeddingModelInfo | None:
        """The model a collection was created for; None when absent or not memoryctl's."""
        ...

    def names(self) -> list[str]:
        """Every collection the engine holds (the core keeps those with its prefix)."""
        ...

    def create(self, name: str, model: EmbeddingModelInfo, fields: Sequence[IndexField]) -> None:
        """A new collection with every payload index, complete before it can be seen; a concurrent
        creator of the same name is not an error."""
        ...

    def ensure_indexes(self, name: str, fields: Sequence[IndexField]) -> None:
        """Create the payload indexes the collection lacks (a creator may have died half-way)."""
        ...

    def drop(self, name: str) -> None:
        """Remove the collection if it exists."""
        ...

    def active(self, *, fresh: bool) -> str | None:
        """The collection the pointer names (``fresh``: not from a cache)."""
        ...

    def set_active(self, name: str, model: EmbeddingModelInfo) -> None:
        """Point at ``name`` atomically: a reader sees the old collection or the new one."""
        ...

    def upsert(self, name: str, points: Sequence[VectorPoint]) -> None: ...

    def set_payload(self, name: str, ids: Sequence[uuid.UUID], payload: dict[str, Any]) -> None:
        """On the points among ``ids`` (ids not in the collection are not an error)."""
        ...

    def delete(self, name: str, ids: Sequence[uuid.UUID]) -> None: ...

    def search(self, name: str, search: Search) -> list[list[VectorHit]]:
        """One hit list per filter of ``search``, best first."""
        ...

    def scroll(self, name: str, flt: Filter, limit: int, offset: Any) -> tuple[list[VectorRecord], Any]:
        """One page in ascending id order (records without vectors) and the next offset (None: done).

        ``VectorRecord.model_id`` is left empty; the core fills it in.
        """
        ...

    def count(self, name: str, flt: Filter) -> int: ...

    def version(self) -> str | None: ...

    def close(self) -> None: ...


def options(id_chunk_size: int, meta_indexes: Mapping[str, str] | None) -> tuple[IndexField, ...]:
    """Check a store's options before it opens anything (a refused option must not hold a lock)."""
    if id_chunk_size < 1:
        raise InputError("id_chunk_size must be >= 1")
    return index_fields(meta_indexes or {})


class VectorCore:
    """``VectorStore`` over a ``VectorBackend``: the protocol's semantics, once."""

    name = STORE

    def __init__(
        self,
        backend: VectorBackend,
        *,
        collection_prefix: str,
        id_chunk_size: int,
        fields: tuple[IndexField, ...],
    ) -> None:
        """``id_chunk_size`` and ``fields`` come from ``options``, checked before the backend opens."""
        self.backend = backend
        self.prefix = collection_prefix
        self.id_chunk_size = id_chunk_size
        self.index_fields = fields
        self._models: dict[str, EmbeddingModelInfo] = {}  # collection name -> model (immutable)

    @property
    def engine(self) -> str:
        return self.backend.kind

    # ---- collections ----------------------------------------------------------------------------
    def _model(self, name: str) -> EmbeddingModelInfo | None:
        if name not in self._models:
            model = self.backend.model_of(name)
            if model is None:
                return None
            self._models[name] = model
        return self._models[name]

    def _resolve(self, model_id: str | None) -> tuple[str, EmbeddingModelInfo]:
        """The concrete collection for ``model_id`` (None = the active one), which must exist."""
        if model_id is None:
            name = self.backend.active(fresh=True)
            if name is None:
                raise StoreError(
                    STORE,
                    f"no collection is active ({self.backend.pointer()} does not exist)",
                    hint="run `memoryctl migrate` or ensure_collection() for the configured embedder",
                )
        else:
            name = collection_name(self.prefix, model_id)
        model = self._model(name)
        if model is None:
            raise StoreError(STORE, f"no collection for model {model_id!r} ({name})", hint="ensure_collection() first")
        return name, model

    def _searchable(self, model_id: str) -> tuple[str, EmbeddingModelInfo]:
        """The active collection, provided ``model_id`` made the query vector for it.

        A cached pointer is tried first; on a mismatch it is read again before refusing, so a swap
        made by another process is seen at once by a caller that already uses the new model.
        """
        active: EmbeddingModelInfo | None = None
        for fresh in (False, True):
            name = self.backend.active(fresh=fresh)
            active = self._model(name) if name else None
            if name is not None and active is not None and active.model_id == model_id:
                return name, active
        raise StoreError(
            STORE,
            f"query vector is from model {model_id!r} but the active collection is for "
            f"{active.model_id if active else None!r}",
            hint="vectors of two models are not comparable even when their dimensions match; embed with "
            "the active model, or finish `memoryctl migrate` so the active collection is the new model's",
        )

    def ensure_collection(self, model: EmbeddingModelInfo, *, activate_if_none: bool = True) -> str:
        name = collection_name(self.prefix, model.model_id)
        with self.backend.errors("ensure_collection"):
            existing = self._model(name)
            if existing is not None and existing != model:
                raise StoreError(
                    STORE,
                    f"collection {name} exists for {existing}, not {model}",
                    hint="a model id must always mean the same dimension and distance; use a new id",
                )
            if existing is None:
                self.backend.create(name, model, self.index_fields)
                if self._model(name) is None:
                    raise StoreError(
                        STORE,
                        f"collection {name} was created but its metadata (model id, dim) was not kept",
                        hint="collection metadata needs Qdrant >= 1.16; upgrade the server",
                    )
            else:
                self.backend.ensure_indexes(name, self.index_fields)
            if activate_if_none and self.backend.active(fresh=True) is None:
                self.backend.set_active(name, model)
        return name

    def active_model(self) -> EmbeddingModelInfo | None:
        with self.backend.errors("active_model"):
            name = self.backend.active(fresh=True)
            return None if name is None else self._model(name)

    def activate(self, model_id: str) -> None:
        with self.backend.errors("activate"):
            name, model = self._resolve(model_id)
            self.backend.set_active(name, model)

    def collections(self) -> list[CollectionInfo]:
        with self.backend.errors("collections"):
            active = self.backend.active(fresh=True)
            names = self.backend.names()
            # Forget collections that are gone (dropped elsewhere, lost and being restored).
            self._models = {name: model for name, model in self._models.items() if name in names}
            out = []
            for name in names:
                model = self._model(name) if name.startswith(self.prefix + "__") else None
                if model is not None:
                    points = self.backend.count(name, build_filter(VectorFilter(include_deleted=True)))
                    out.append(CollectionInfo(name=name, model=model, points=points, active=name == active))
            return sorted(out, key=lambda c: c.name)

    def drop_collection(self, model_id: str) -> None:
        name = collection_name(self.prefix, model_id)
        with self.backend.errors("drop_collection"):
            if self.backend.active(fresh=True) == name:
                raise StoreError(
                    STORE,
                    f"refusing to drop {name}: it is the active collection",
                    hint="activate another model first (`memoryctl migrate` does this)",
                )
            self.backend.drop(name)
            self._models.pop(name, None)

    # ---- points ---------------------------------------------------------------------------------
    def upsert(self, points: Sequence[VectorPoint], *, model_id: str | None = None) -> None:
        if not points:
            return
        with self.backend.errors("upsert"):
            name, model = self._resolve(model_id)
            for p in points:
                _check_vector(p.vector, model)
            for batch in chunks(points, self.backend.write_batch):
                self.backend.upsert(name, batch)

    def set_deleted(self, ids: Sequence[uuid.UUID], deleted: bool = True, *, model_id: str | None = None) -> None:
        if not ids:
            return
        with self.backend.errors("set_deleted"):
            name, _ = self._resolve(model_id)
            for chunk in chunks(list(ids), self.id_chunk_size):
                self.backend.set_payload(name, chunk, {"deleted": bool(deleted)})

    def delete(self, ids: Sequence[uuid.UUID], *, model_id: str | None = None) -> None:
        if not ids:
            return
        with self.backend.errors("delete"):
            name, _ = self._resolve(model_id)
            for chunk in chunks(list(ids), self.id_chunk_size):
                self.backend.delete(name, chunk)

    def search(
        self,
        vector: Sequence[float],
        flt: VectorFilter,
        limit: int,
        *,
        model_id: str,
        score_threshold: float | None = None,
        inactive_ok: bool = False,
    ) -> list[VectorHit]:
        if limit <= 0 or empty_selection(flt):
            return []
        with self.backend.errors("search"):
            name, model = self._resolve(model_id) if inactive_ok else self._searchable(model_id)
            _check_vector(vector, model)
            id_lists: list[Sequence[uuid.UUID] | None] = (
                [None] if flt.ids is None else list(chunks(list(dict.fromkeys(flt.ids)), self.id_chunk_size))
            )
            request = Search(
                vector=floats(vector),
                filters=[build_filter(flt, ids) for ids in id_lists],
                limit=limit,
                score_threshold=score_threshold,
                filters_metadata=bool(flt.meta),
            )
            lists = self.backend.search(name, request)
        return merge_hits(lists, limit, model.distance)

    def scroll(
        self, *, agent_id: str | None = None, model_id: str | None = None, batch: int = 1000
    ) -> Iterator[list[VectorRecord]]:
        """Every point (soft-deleted ones too: reconciliation needs them), page by page."""
        with self.backend.errors("scroll"):
            name, model = self._resolve(model_id)
        flt = build_filter(VectorFilter(agent_id=agent_id, include_deleted=True))
        offset: Any = None
        while True:
            with self.backend.errors("scroll"):
                records, offset = self.backend.scroll(name, flt, batch, offset)
            if records:
                yield [VectorRecord(r.id, r.agent_id, r.content_hash, r.deleted, model.model_id) for r in records]
            if offset is None:
                return

    def count(self, *, agent_id: str | None = None, model_id: str | None = None) -> int:
        """Points in the collection, soft-deleted ones included (the same set ``scroll`` yields)."""
        with self.backend.errors("count"):
            name, _ = self._resolve(model_id)
            return self.backend.count(name, build_filter(VectorFilter(agent_id=agent_id, include_deleted=True)))

    def ping(self) -> dict[str, Any]:
        with self.backend.errors("ping"):
            name = self.backend.active(fresh=True)
            model = self._model(name) if name else None
            return {
                "engine": self.backend.kind,
                "location": self.backend.location,
                "version": self.backend.version(),
                "collection": name,
                "model_id": model.model_id if model else None,
                "dim": model.dim if model else None,
                **self.backend.describe(),
            }

    def close(self) -> None:
        self.backend.close()


def _check_vector(vector: Sequence[float], model: EmbeddingModelInfo) -> None:
    if len(vector) != model.dim:
        raise StoreError(
            STORE,
            f"vector has {len(vector)} dimensions; model {model.model_id!r} has {model.dim}",
            hint="the embedder configuration does not match the active collection; see `memoryctl migrate`",
        )


def floats(vector: Sequence[float]) -> list[float]:
    """The vector as the list of Python floats the engines convert fastest.

    Callers mostly hand over ``ndarray.tolist()`` rows already; converting those element by element
    again cost ~40 % of a bulk upsert (benchmarks/ops.py). Anything else (numpy rows, tuples, ints)
    goes through one conversion.
    """
    if type(vector) is list and (not vector or type(vector[0]) is float):
        return vector
    if isinstance(vector, np.ndarray):
        return cast(list[float], vector.astype(np.float64, copy=False).tolist())
    return [float(x) for x in vector]
