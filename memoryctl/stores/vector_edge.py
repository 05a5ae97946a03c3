"""``VectorStore`` on Qdrant Edge (``qdrant_edge``): the Rust engine in-process, for the embedded
profile and the benchmarks.

Edge is a single shard: no server, no collections, no aliases. This adapter rebuilds the three
things the protocol needs on top of the file system, under one base directory::

    <base>/
      .lock                          flock held while a process has the store open
      active                         the active model id (one line), replaced atomically
      <prefix>__<slug>__<hash8>/     one directory per embedding model version (same names as the
        model.json                     server collections); model id, dim, distance
        shard/                         the Edge shard (segments + WAL)

- *Collections* are those directories; ``model.json`` is written before the directory gets its
  final name (create in ``.creating-*``, then ``os.rename``), so a directory with a final name is
  always complete: payload indexes included, created with the shard, never on demand.
- *The alias* is the ``active`` file: written to a temporary file, fsynced, then ``os.replace``d,
  which is atomic on POSIX, so a reader sees the old model or the new one, never half a name.
- *One process*: Edge takes a WAL lock per shard; the store also takes an ``flock`` on ``.lock`` when
  it opens, so a second process fails fast with ``StoreUnavailable`` naming the holder, instead of
  failing later on whichever shard it touches first.
- *Threads*: the query engine fans out from a few threads. Edge's own calls are safe to run
  concurrently (checked: reads alongside upserts and ``optimize()``, no errors); what is not safe is
  using a shard while another thread closes or drops it. A readers-writer lock therefore lets any
  number of searches/upserts run together and gives open/close/drop exclusive access.

Search params. Until ``optimize()`` has run, segments are plain and every search is exact. After
it, HNSW is approximate, and on random vectors its recall is poor (see
``benchmarks/vector_chunks.py``). Exact search is cheap at the sizes an embedded memory store
reaches, so the store searches exactly up to ``exact_below`` points and with a high ``hnsw_ef``
beyond; filtered searches are planned by Edge itself from the payload-index cardinalities (a
selective filter, e.g. a chunk of candidate ids, is scored exactly anyway).

Filters use the same payload and the same semantics as ``QdrantVectorStore`` (shared helpers in
``vector_qdrant``), built from Edge's typed condition objects only; no string is ever parsed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, cast

import numpy as np
import qdrant_edge as qe

from memoryctl.config import Settings
from memoryctl.errors import InputError, StoreError, StoreUnavailable
from memoryctl.stores.protocols import (
    CollectionInfo,
    EmbeddingModelInfo,
    MetaCondition,
    VectorFilter,
    VectorHit,
    VectorPoint,
    VectorRecord,
)
from memoryctl.stores.vector_qdrant import (
    DEFAULT_ID_CHUNK,
    HIT_FIELDS,
    RECORD_FIELDS,
    STORE,
    Distance,
    check_vector,
    chunks,
    collection_name,
    empty_selection,
    hit_from,
    index_fields,
    is_number,
    iso,
    merge_hits,
    meta_key,
    meta_value_error,
    point_payload,
    record_from,
)

ACTIVE_FILE = "active"
MODEL_FILE = "model.json"
SHARD_DIR = "shard"
LOCK_FILE = ".lock"
# Search params, measured at 100k x 384 on 2 cores. Exact top-10 costs ~6 ms idle
# (shared/notes/embedded-engines.md) and ~86 ms with a load average of 9 (benchmarks/vector_chunks.py);
# HNSW after optimize() is ~10x faster, but its recall@10 on random vectors is 0.15 at the default
# ef and 0.74 at ef=1024. So: exact below 100k points (right answers at interactive cost for the
# sizes an embedded store holds; a per-agent filter narrows it further), HNSW with a high ef above.
# Re-measure recall on real embeddings (clustered, so far kinder to HNSW) before lowering either.
DEFAULT_EXACT_BELOW = 100_000
DEFAULT_HNSW_EF = 512

_DIST = {"cosine": qe.Distance.Cosine, "dot": qe.Distance.Dot, "euclid": qe.Distance.Euclid}


class _RWLock:
    """Many readers or one writer. Readers: shard calls. Writer: open/close/drop of shards."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._readers:
                self._cond.wait()
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


# --------------------------------------------------------------------------------------------------
# Filter translation (Edge condition objects)

_RANGE_OP = {"<": "lt", "<=": "lte", ">": "gt", ">=": "gte"}
Condition = Any  # qe.FieldCondition | qe.HasIdCondition | qe.IsEmptyCondition | qe.Filter


def _match(value: str | int | bool) -> qe.MatchValue:
    """``MatchValue`` that survives qdrant-edge-py 0.9.0's argument conversion.

    The binding tries String, then Integer, then Bool, and a Python ``bool`` *is* an ``int``, so
    ``MatchValue(True)`` becomes the integer 1 and never matches a boolean payload (measured: it
    matches nothing, so ``must_not deleted == true`` hid nothing). ``numpy.bool_`` is not an int
    and reaches the Bool variant.
    """
    if isinstance(value, bool):
        return qe.MatchValue(cast(Any, np.bool_(value)))
    return qe.MatchValue(value)


def _eq(key: str, value: Any, cond: MetaCondition) -> Condition:
    if isinstance(value, bool | str):
        return qe.FieldCondition(key, match=_match(value))
    if is_number(value):
        # A point range, not a match: see vector_qdrant._eq (1 must also find 1.0).
        if isinstance(value, int) and abs(value) > 2**53:
            return qe.FieldCondition(key, match=_match(value))
        return qe.FieldCondition(key, range=qe.RangeFloat(gte=float(value), lte=float(value)))
    raise meta_value_error(cond, "unsupported value type")


def _meta_condition(cond: MetaCondition) -> tuple[list[Condition], list[Condition]]:
    key = meta_key(cond.key)
    if cond.op == "=":
        return [_eq(key, cond.value, cond)], []
    if cond.op == "!=":
        # SQL semantics: a point without the key does not satisfy "key != v".
        return [], [qe.IsEmptyCondition(key), _eq(key, cond.value, cond)]
    if cond.op == "in":
        values = list(cond.value) if isinstance(cond.value, list | tuple | set | frozenset) else None
        if not values:
            raise meta_value_error(cond, "'in' needs a non-empty list")
        if all(isinstance(v, str) for v in values):
            return [qe.FieldCondition(key, match=qe.MatchAny(values))], []
        return [qe.Filter(should=[_eq(key, v, cond) for v in values])], []
    if cond.op in _RANGE_OP:
        arg = _RANGE_OP[cond.op]
        if isinstance(cond.value, datetime):
            return [qe.FieldCondition(key, range=qe.RangeDateTime(**{arg: iso(cond.value)}))], []
        if is_number(cond.value):
            return [qe.FieldCondition(key, range=qe.RangeFloat(**{arg: float(cond.value)}))], []
        raise meta_value_error(cond, "ranges need a number or a datetime")
    raise meta_value_error(cond, "unknown operator")


def build_filter(flt: VectorFilter, ids: Sequence[uuid.UUID] | None = None) -> qe.Filter:
    """The Edge filter for ``flt`` with ``ids`` (one chunk) in place of ``flt.ids``."""
    must: list[Condition] = []
    must_not: list[Condition] = []
    if flt.agent_id is not None:
        must.append(qe.FieldCondition("agent_id", match=_match(flt.agent_id)))
    if ids is not None:
        must.append(qe.HasIdCondition(set(ids)))
    if flt.kinds is not None:
        must.append(qe.FieldCondition("kind", match=qe.MatchAny(list(flt.kinds))))
    if flt.exclude_kinds:
        must_not.append(qe.FieldCondition("kind", match=qe.MatchAny(list(flt.exclude_kinds))))
    if flt.created_from is not None or flt.created_to is not None:
        # Half-open [from, to), as in QdrantVectorStore.
        must.append(
            qe.FieldCondition(
                "created_at",
                range=qe.RangeDateTime(
                    gte=iso(flt.created_from) if flt.created_from else None,
                    lt=iso(flt.created_to) if flt.created_to else None,
                ),
            )
        )
    if flt.entity_keys_any is not None:
        must.append(qe.FieldCondition("entity_keys", match=qe.MatchAny(list(flt.entity_keys_any))))
    for cond in flt.meta:
        m, n = _meta_condition(cond)
        must.extend(m)
        must_not.extend(n)
    if not flt.include_deleted:
        must_not.append(qe.FieldCondition("deleted", match=_match(True)))
    return qe.Filter(must=must or None, must_not=must_not or None)


def _index_schema(kind: str, is_tenant: bool, hnsw: bool) -> Any:
    if kind == "keyword":
        return qe.KeywordIndexParams(is_tenant=is_tenant or None, enable_hnsw=hnsw)
    if kind == "datetime":
        return qe.DatetimeIndexParams(enable_hnsw=hnsw)
    if kind == "number":
        return qe.FloatIndexParams()
    return qe.BoolIndexParams(enable_hnsw=hnsw)


def _floats(vector: Sequence[float]) -> list[float]:
    """The vector as the list of Python floats Edge converts fastest.

    Callers mostly hand over ``ndarray.tolist()`` rows already; converting those element by element
    again cost ~40 % of a bulk upsert (benchmarks/ops.py). Anything else (numpy rows, tuples, ints)
    goes through one conversion.
    """
    if type(vector) is list and (not vector or type(vector[0]) is float):
        return vector
    if isinstance(vector, np.ndarray):
        return cast(list[float], vector.astype(np.float64, copy=False).tolist())
    return [float(x) for x in vector]


# --------------------------------------------------------------------------------------------------


class EdgeVectorStore:
    """The vector store on Qdrant Edge: one shard directory per model, an ``active`` pointer file."""

    name = STORE
    engine = "qdrant-edge"

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        collection_prefix: str = "memories",
        id_chunk_size: int = DEFAULT_ID_CHUNK,
        exact_below: int = DEFAULT_EXACT_BELOW,
        hnsw_ef: int = DEFAULT_HNSW_EF,
        meta_indexes: Mapping[str, str] | None = None,
    ) -> None:
        if id_chunk_size < 1:
            raise InputError("id_chunk_size must be >= 1")
        self.base = Path(base_dir)
        self.prefix = collection_prefix
        self.id_chunk_size = id_chunk_size
        self.exact_below = exact_below
        self.hnsw_ef = hnsw_ef
        self.index_fields = index_fields(meta_indexes or {})
        self._rw = _RWLock()
        self._shards: dict[str, qe.EdgeShard] = {}
        self._models: dict[str, EmbeddingModelInfo] = {}
        self._closed = False
        try:
            self.base.mkdir(parents=True, exist_ok=True)
            self._lock_fd: int | None = os.open(self.base / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreError(STORE, f"cannot use {self.base}: {exc}", hint="check data_dir permissions") from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self._lock_fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(self._lock_fd)
            self._lock_fd = None
            raise StoreUnavailable(
                STORE,
                f"the embedded vector store {self.base} is in use by another process (pid {holder})",
                hint="Qdrant Edge is single-process: stop the other memoryctl (e.g. `sync --daemon`) or use "
                "the cluster profile with a Qdrant server",
            ) from None
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, str(os.getpid()).encode(), 0)
        # Leftovers of a process that died mid-create or mid-drop; we hold the lock, nobody else runs.
        for leftover in self.base.glob(".creating-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        for leftover in self.base.glob(".dropping-*"):
            shutil.rmtree(leftover, ignore_errors=True)

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> EdgeVectorStore:
        """From ``memoryctl.config.Settings``: the shards live under ``settings.vectors_dir``."""
        return cls(
            settings.vectors_dir,
            collection_prefix=settings.qdrant.collection_prefix,
            meta_indexes=settings.qdrant.indexed_metadata,
            **kwargs,
        )

    # ---------------------------------------------------------------------------------- plumbing

    @contextlib.contextmanager
    def _errors(self, op: str) -> Iterator[None]:
        try:
            if self._closed:
                raise StoreUnavailable(STORE, f"{op}: the vector store is closed")
            yield
        except (StoreError, InputError):
            raise
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            if "WouldBlock" in text or "lock" in text.lower():
                raise StoreUnavailable(
                    STORE, f"{op}: a shard under {self.base} is locked by another process", hint=text[:300]
                ) from exc
            raise StoreError(STORE, f"{op}: {text}"[:500]) from exc

    def _dir(self, name: str) -> Path:
        return self.base / name

    def _read_model(self, name: str) -> EmbeddingModelInfo | None:
        if name in self._models:
            return self._models[name]
        try:
            data = json.loads((self._dir(name) / MODEL_FILE).read_text())
        except FileNotFoundError:
            return None
        model = EmbeddingModelInfo(
            model_id=str(data["model_id"]), dim=int(data["dim"]), distance=cast(Distance, data["distance"])
        )
        self._models[name] = model
        return model

    def _active_id(self) -> str | None:
        try:
            return (self.base / ACTIVE_FILE).read_text().strip() or None
        except FileNotFoundError:
            return None

    def _write_active(self, model_id: str) -> None:
        tmp = self.base / f".{ACTIVE_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as fh:
            fh.write(model_id + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.base / ACTIVE_FILE)
        dir_fd = os.open(self.base, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself must survive a power cut
        finally:
            os.close(dir_fd)

    @contextlib.contextmanager
    def _using(self, name: str) -> Iterator[qe.EdgeShard]:
        """The open shard for ``name`` under the read lock (opened once, then kept open).

        Holding the read lock for the whole call is what makes close/drop from another thread safe:
        they wait for running calls instead of closing a shard under them.
        """
        while True:
            with self._rw.read():
                if self._closed:
                    raise StoreUnavailable(STORE, "the vector store is closed")
                shard = self._shards.get(name)
                if shard is not None:
                    yield shard
                    return
            with self._rw.write():
                if name not in self._shards and not self._closed:
                    self._shards[name] = qe.EdgeShard.load(str(self._dir(name) / SHARD_DIR))

    def _resolve(self, model_id: str | None) -> tuple[str, EmbeddingModelInfo]:
        """The collection for ``model_id`` (None = the active one), which must exist."""
        if model_id is None:
            model_id = self._active_id()
            if model_id is None:
                raise StoreError(
                    STORE,
                    f"no collection is active ({self.base / ACTIVE_FILE} does not exist)",
                    hint="run `memoryctl migrate` or ensure_collection() for the configured embedder",
                )
        name = collection_name(self.prefix, model_id)
        model = self._read_model(name)
        if model is None:
            raise StoreError(STORE, f"no collection for model {model_id!r} ({name})", hint="ensure_collection() first")
        return name, model

    # ---------------------------------------------------------------------------------- protocol

    def ensure_collection(self, model: EmbeddingModelInfo, *, activate_if_none: bool = True) -> str:
        name = collection_name(self.prefix, model.model_id)
        with self._errors("ensure_collection"):
            existing = self._read_model(name)
            if existing is not None and existing != model:
                raise StoreError(
                    STORE,
                    f"collection {name} exists for {existing}, not {model}",
                    hint="a model id must always mean the same dimension and distance; use a new id",
                )
            if existing is None:
                self._create(name, model)
            else:
                with self._using(name) as shard:
                    self._ensure_indexes(shard)
            if activate_if_none and self._active_id() is None:
                self._write_active(model.model_id)
        return name

    def _create(self, name: str, model: EmbeddingModelInfo) -> None:
        """Build shard + indexes + model.json in a scratch directory, then rename it into place."""
        with self._rw.write():
            if (self._dir(name) / MODEL_FILE).exists():  # another thread won the race
                return
            tmp = self.base / f".creating-{name}-{os.getpid()}-{threading.get_ident()}"
            shutil.rmtree(tmp, ignore_errors=True)
            shard = qe.EdgeShard.create(
                str(tmp / SHARD_DIR),
                qe.EdgeConfig(vectors=qe.EdgeVectorParams(size=model.dim, distance=_DIST[model.distance])),
            )
            try:
                self._ensure_indexes(shard)
                shard.flush()
            finally:
                shard.close()
            (tmp / MODEL_FILE).write_text(
                json.dumps(
                    {
                        "memoryctl": 1,
                        "model_id": model.model_id,
                        "dim": model.dim,
                        "distance": model.distance,
                    },
                    indent=1,
                )
            )
            os.rename(tmp, self._dir(name))
            self._models[name] = model

    def _ensure_indexes(self, shard: qe.EdgeShard) -> None:
        present = set(shard.info().payload_schema)
        for field, kind, tenant, hnsw in self.index_fields:
            if field not in present:
                shard.update(qe.UpdateOperation.create_field_index(field, _index_schema(kind, tenant, hnsw)))

    def payload_schema(self, model_id: str | None = None) -> dict[str, str]:
        """Field -> index type of a collection (for ``health`` and tests)."""
        with self._errors("payload_schema"):
            name, _ = self._resolve(model_id)
            with self._using(name) as shard:
                schema = shard.info().payload_schema
            return {k: str(v.data_type).rsplit(".", 1)[-1].lower() for k, v in schema.items()}

    def active_model(self) -> EmbeddingModelInfo | None:
        with self._errors("active_model"):
            model_id = self._active_id()
            return None if model_id is None else self._read_model(collection_name(self.prefix, model_id))

    def activate(self, model_id: str) -> None:
        with self._errors("activate"):
            self._resolve(model_id)
            self._write_active(model_id)

    def collections(self) -> list[CollectionInfo]:
        with self._errors("collections"):
            active = self._active_id()
            out = []
            for d in sorted(self.base.iterdir()):
                if d.name.startswith(".") or not d.is_dir():
                    continue
                model = self._read_model(d.name)
                if model is None:
                    continue
                out.append(
                    CollectionInfo(
                        name=d.name,
                        model=model,
                        points=self._count(d.name, None),
                        active=model.model_id == active,
                    )
                )
            return out

    def drop_collection(self, model_id: str) -> None:
        name = collection_name(self.prefix, model_id)
        with self._errors("drop_collection"):
            if self._active_id() == model_id:
                raise StoreError(
                    STORE,
                    f"refusing to drop {name}: it is the active collection",
                    hint="activate another model first (`memoryctl migrate` does this)",
                )
            with self._rw.write():
                shard = self._shards.pop(name, None)
                if shard is not None:
                    shard.close()
                self._models.pop(name, None)
                if self._dir(name).exists():
                    # Rename first: the collection disappears atomically even if rmtree is cut short.
                    doomed = self.base / f".dropping-{name}-{uuid.uuid4().hex[:8]}"
                    os.rename(self._dir(name), doomed)
                    shutil.rmtree(doomed, ignore_errors=True)

    def upsert(self, points: Sequence[VectorPoint], *, model_id: str | None = None) -> None:
        if not points:
            return
        with self._errors("upsert"):
            name, model = self._resolve(model_id)
            for p in points:
                check_vector(p.vector, model)
            with self._using(name) as shard:
                for batch in chunks(points, 1000):
                    shard.update(
                        qe.UpdateOperation.upsert_points(
                            [qe.Point(p.id, _floats(p.vector), point_payload(p)) for p in batch]
                        )
                    )

    def set_deleted(self, ids: Sequence[uuid.UUID], deleted: bool = True, *, model_id: str | None = None) -> None:
        if not ids:
            return
        with self._errors("set_deleted"):
            name, _ = self._resolve(model_id)
            with self._using(name) as shard:
                for chunk in chunks(list(ids), self.id_chunk_size):
                    # By filter: an id that is not (yet) in the shard is not an error.
                    shard.update(
                        qe.UpdateOperation.set_payload_by_filter(
                            qe.Filter(must=[qe.HasIdCondition(set(chunk))]), {"deleted": bool(deleted)}
                        )
                    )

    def delete(self, ids: Sequence[uuid.UUID], *, model_id: str | None = None) -> None:
        if not ids:
            return
        with self._errors("delete"):
            name, _ = self._resolve(model_id)
            with self._using(name) as shard:
                for chunk in chunks(list(ids), self.id_chunk_size):
                    shard.update(qe.UpdateOperation.delete_points(list(chunk)))

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
        with self._errors("search"):
            active = self._active_id()
            if active != model_id and not inactive_ok:
                raise StoreError(
                    STORE,
                    f"query vector is from model {model_id!r} but the active collection is for {active!r}",
                    hint="vectors of two models are not comparable even when their dimensions match; embed "
                    "with the active model, or finish `memoryctl migrate` so the active model is the new one",
                )
            name, model = self._resolve(model_id)
            check_vector(vector, model)
            query = qe.Query.Nearest([float(x) for x in vector])
            id_lists: list[Sequence[uuid.UUID] | None] = (
                [None] if flt.ids is None else list(chunks(list(dict.fromkeys(flt.ids)), self.id_chunk_size))
            )
            with self._using(name) as shard:
                params = self._params(shard, flt)
                requests = [
                    qe.QueryRequest(
                        limit=limit,
                        query=query,
                        filter=build_filter(flt, ids),
                        score_threshold=score_threshold,
                        params=params,
                        with_payload=HIT_FIELDS,
                    )
                    for ids in id_lists
                ]
                results = (
                    [shard.query(requests[0])]
                    if len(requests) == 1
                    else shard.query_batch(qe.QueryBatchRequest(requests))
                )
            lists = [[self._hit(p) for p in points] for points in results]
        return merge_hits(lists, limit, model.distance)

    def _params(self, shard: qe.EdgeShard, flt: VectorFilter) -> qe.SearchParams:
        """Exact below ``exact_below`` points, and always when a metadata condition filters.

        HNSW must check a metadata condition while it walks the graph and misses neighbours behind
        points the filter rejects: at 100k points (benchmarks/query.py) ``kind = note AND
        sentiment > 0.4`` returned the exact top-10 in 7 queries of 10, recall@10 0.72-0.85 at
        ef=512 (ACORN: 1.00 but 2-3x slower than exact), and recall@30 0.59 with the key indexed.
        Exact is right; its cost is the filter's: ~130 ms there when every point's payload is read,
        ~10 ms when the key has a payload index (``[qdrant] indexed_metadata``) and the matching
        points are enumerated from it.
        """
        if flt.meta or shard.info().points_count < self.exact_below:
            return qe.SearchParams(exact=True)
        return qe.SearchParams(hnsw_ef=self.hnsw_ef)

    @staticmethod
    def _hit(p: qe.ScoredPoint) -> VectorHit:
        return hit_from(p.id, p.score, p.payload)

    def scroll(
        self, *, agent_id: str | None = None, model_id: str | None = None, batch: int = 1000
    ) -> Iterator[list[VectorRecord]]:
        """Every point (soft-deleted ones too: reconciliation needs them), page by page."""
        with self._errors("scroll"):
            name, model = self._resolve(model_id)
        flt = build_filter(VectorFilter(agent_id=agent_id, include_deleted=True))
        offset: Any = None
        while True:
            with self._errors("scroll"), self._using(name) as shard:
                records, nxt = shard.scroll(
                    qe.ScrollRequest(offset=offset, limit=batch, filter=flt, with_payload=RECORD_FIELDS)
                )
            page = [record_from(r.id, r.payload, model.model_id) for r in records]
            if page:
                yield page
            if nxt is None:
                return
            offset = nxt

    def count(self, *, agent_id: str | None = None, model_id: str | None = None) -> int:
        """Points in the collection, soft-deleted ones included (the same set ``scroll`` yields)."""
        with self._errors("count"):
            name, _ = self._resolve(model_id)
            return self._count(name, agent_id)

    def _count(self, name: str, agent_id: str | None) -> int:
        flt = build_filter(VectorFilter(agent_id=agent_id, include_deleted=True))
        with self._using(name) as shard:
            return int(shard.count(qe.CountRequest(exact=True, filter=flt)))

    def optimize(self, model_id: str | None = None) -> bool:
        """Merge segments, vacuum deletions and build HNSW (blocking; ~70 s at 100k x 384 on 2 cores).

        Searches keep running meanwhile. Returns whether anything changed. Run it from
        ``memoryctl nightly`` or after a bulk re-embed, not on the write path.
        """
        with self._errors("optimize"):
            name, _ = self._resolve(model_id)
            with self._using(name) as shard:
                return bool(shard.optimize())

    def ping(self) -> dict[str, Any]:
        with self._errors("ping"):
            model_id = self._active_id()
            model = self._read_model(collection_name(self.prefix, model_id)) if model_id else None
            points = None
            if model is not None:
                name = collection_name(self.prefix, model.model_id)
                with self._using(name) as shard:
                    info = shard.info()
                points = info.points_count
            try:
                version: str | None = importlib_metadata.version("qdrant-edge-py")
            except importlib_metadata.PackageNotFoundError:
                version = None
            return {
                "engine": self.engine,
                "location": str(self.base),
                "version": version,
                "collection": collection_name(self.prefix, model_id) if model_id else None,
                "model_id": model_id,
                "dim": model.dim if model else None,
                "points": points,
            }

    def close(self) -> None:
        """Flush and close every shard and release the directory lock. Idempotent."""
        with self._rw.write():
            if self._closed:
                return
            self._closed = True
            for shard in self._shards.values():
                with contextlib.suppress(Exception):
                    shard.flush()
                    shard.close()
            self._shards.clear()
            if self._lock_fd is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                    os.close(self._lock_fd)
                self._lock_fd = None
