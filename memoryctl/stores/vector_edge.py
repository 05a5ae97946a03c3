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

The store's semantics (which collection, model checks, chunking, payload, filter meaning) are
``vector_core``'s; this module maps them onto Edge's shards and typed condition objects only; no
string is ever parsed.
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
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, cast

import numpy as np
import qdrant_edge as qe

from memoryctl.errors import InputError, StoreError, StoreUnavailable
from memoryctl.stores import vector_filter as vf
from memoryctl.stores.protocols import EmbeddingModelInfo, VectorHit, VectorPoint, VectorRecord
from memoryctl.stores.vector_core import (
    DEFAULT_ID_CHUNK,
    HIT_FIELDS,
    RECORD_FIELDS,
    STORE,
    Distance,
    IndexField,
    Search,
    VectorCore,
    collection_name,
    floats,
    hit_from,
    iso,
    options,
    point_payload,
    record_from,
)

ACTIVE_FILE = "active"
MODEL_FILE = "model.json"
SHARD_DIR = "shard"
LOCK_FILE = ".lock"
# Search params, measured at 100k x 384 on 2 cores. Exact top-10 costs ~6 ms idle and ~86 ms with a
# load average of 9 (benchmarks/vector_chunks.py); HNSW after optimize() is ~10x faster, but its
# recall@10 on random vectors is 0.15 at the default ef and 0.74 at ef=1024. So: exact below 100k
# points (right answers at interactive cost for the sizes an embedded store holds; a per-agent
# filter narrows it further), HNSW with a high ef above. Re-measure recall on real embeddings
# (clustered, so far kinder to HNSW) before lowering either.
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
# The neutral filter nodes as Edge condition objects

EdgeCondition = Any  # qe.FieldCondition | qe.HasIdCondition | qe.IsEmptyCondition | qe.Filter


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


def _condition(c: vf.Condition) -> EdgeCondition:
    if isinstance(c, vf.Match):
        return qe.FieldCondition(c.key, match=_match(c.value))
    if isinstance(c, vf.MatchAny):
        return qe.FieldCondition(c.key, match=qe.MatchAny(list(c.values)))
    if isinstance(c, vf.Range):
        return qe.FieldCondition(c.key, range=qe.RangeFloat(gt=c.gt, gte=c.gte, lt=c.lt, lte=c.lte))
    if isinstance(c, vf.TimeRange):
        bounds = {k: iso(v) for k, v in (("gt", c.gt), ("gte", c.gte), ("lt", c.lt), ("lte", c.lte)) if v is not None}
        return qe.FieldCondition(c.key, range=qe.RangeDateTime(**bounds))
    if isinstance(c, vf.HasId):
        return qe.HasIdCondition(set(c.ids))
    if isinstance(c, vf.IsEmpty):
        return qe.IsEmptyCondition(c.key)
    assert isinstance(c, vf.AnyOf)
    return qe.Filter(should=[_condition(x) for x in c.conditions])


def to_edge(flt: vf.Filter) -> qe.Filter:
    return qe.Filter(
        must=[_condition(c) for c in flt.must] or None, must_not=[_condition(c) for c in flt.must_not] or None
    )


def _index_schema(kind: str, is_tenant: bool, hnsw: bool) -> Any:
    if kind == "keyword":
        return qe.KeywordIndexParams(is_tenant=is_tenant or None, enable_hnsw=hnsw)
    if kind == "datetime":
        return qe.DatetimeIndexParams(enable_hnsw=hnsw)
    if kind == "number":
        return qe.FloatIndexParams()
    return qe.BoolIndexParams(enable_hnsw=hnsw)


# --------------------------------------------------------------------------------------------------


class EdgeBackend:
    """The engine primitives on Qdrant Edge: one shard directory per model, an ``active`` file."""

    kind = "qdrant-edge"
    write_batch = 1000

    def __init__(self, base_dir: Path, *, prefix: str, exact_below: int, hnsw_ef: int) -> None:
        self.base = base_dir
        self.location = str(base_dir)
        self.prefix = prefix  # the active file names a model id; collections are named from it
        self.exact_below = exact_below
        self.hnsw_ef = hnsw_ef
        self._rw = _RWLock()
        self._shards: dict[str, qe.EdgeShard] = {}
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

    @contextlib.contextmanager
    def errors(self, op: str) -> Iterator[None]:
        try:
            if self._closed:
                raise StoreUnavailable(STORE, f"{op}: the vector store is closed")
            yield
        except (StoreError, InputError):
            raise
        except Exception as exc:
            # The binding raises plain exceptions: their text is all there is to tell a shard lock
            # held by another process (a store that is busy, not broken) from any other failure.
            text = f"{type(exc).__name__}: {exc}"
            if "WouldBlock" in text or "lock" in text.lower():
                raise StoreUnavailable(
                    STORE, f"{op}: a shard under {self.base} is locked by another process", hint=text[:300]
                ) from exc
            raise StoreError(STORE, f"{op}: {text}"[:500]) from exc

    def pointer(self) -> str:
        return str(self.base / ACTIVE_FILE)

    def describe(self) -> dict[str, Any]:
        name = self.active(fresh=True)
        if name is None or self.model_of(name) is None:
            return {"points": None}
        with self._using(name) as shard:
            return {"points": shard.info().points_count}

    def _dir(self, name: str) -> Path:
        return self.base / name

    # ---- collections ----------------------------------------------------------------------------
    def model_of(self, name: str) -> EmbeddingModelInfo | None:
        try:
            data = json.loads((self._dir(name) / MODEL_FILE).read_text())
        except FileNotFoundError:
            return None
        return EmbeddingModelInfo(
            model_id=str(data["model_id"]), dim=int(data["dim"]), distance=cast(Distance, data["distance"])
        )

    def names(self) -> list[str]:
        return sorted(d.name for d in self.base.iterdir() if not d.name.startswith(".") and d.is_dir())

    def create(self, name: str, model: EmbeddingModelInfo, fields: Sequence[IndexField]) -> None:
        """Shard + indexes + model.json in a scratch directory, then renamed into place, so a
        directory with a final name is always complete."""
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
                self._add_indexes(shard, fields)
                shard.flush()
            finally:
                shard.close()
            meta = {"memoryctl": 1, "model_id": model.model_id, "dim": model.dim, "distance": model.distance}
            (tmp / MODEL_FILE).write_text(json.dumps(meta, indent=1))
            os.rename(tmp, self._dir(name))

    def ensure_indexes(self, name: str, fields: Sequence[IndexField]) -> None:
        with self._using(name) as shard:
            self._add_indexes(shard, fields)

    @staticmethod
    def _add_indexes(shard: qe.EdgeShard, fields: Sequence[IndexField]) -> None:
        present = set(shard.info().payload_schema)
        for field, kind, tenant, hnsw in fields:
            if field not in present:
                shard.update(qe.UpdateOperation.create_field_index(field, _index_schema(kind, tenant, hnsw)))

    def payload_schema(self, name: str) -> dict[str, str]:
        with self._using(name) as shard:
            schema = shard.info().payload_schema
        return {k: str(v.data_type).rsplit(".", 1)[-1].lower() for k, v in schema.items()}

    def drop(self, name: str) -> None:
        with self._rw.write():
            shard = self._shards.pop(name, None)
            if shard is not None:
                shard.close()
            if self._dir(name).exists():
                # Rename first: the collection disappears atomically even if rmtree is cut short.
                doomed = self.base / f".dropping-{name}-{uuid.uuid4().hex[:8]}"
                os.rename(self._dir(name), doomed)
                shutil.rmtree(doomed, ignore_errors=True)

    def active(self, *, fresh: bool) -> str | None:
        """Read every time: the file is local and cheap."""
        try:
            model_id = (self.base / ACTIVE_FILE).read_text().strip()
        except FileNotFoundError:
            return None
        return collection_name(self.prefix, model_id) if model_id else None

    def set_active(self, name: str, model: EmbeddingModelInfo) -> None:
        """Written to a temporary file, fsynced, then ``os.replace``d: atomic on POSIX."""
        tmp = self.base / f".{ACTIVE_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as fh:
            fh.write(model.model_id + "\n")
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

    # ---- points ---------------------------------------------------------------------------------
    def upsert(self, name: str, points: Sequence[VectorPoint]) -> None:
        batch = [qe.Point(p.id, floats(p.vector), point_payload(p)) for p in points]
        with self._using(name) as shard:
            shard.update(qe.UpdateOperation.upsert_points(batch))

    def set_payload(self, name: str, ids: Sequence[uuid.UUID], payload: dict[str, Any]) -> None:
        # By filter: an id that is not (yet) in the shard is not an error.
        selected = qe.Filter(must=[qe.HasIdCondition(set(ids))])
        with self._using(name) as shard:
            shard.update(qe.UpdateOperation.set_payload_by_filter(selected, payload))

    def delete(self, name: str, ids: Sequence[uuid.UUID]) -> None:
        with self._using(name) as shard:
            shard.update(qe.UpdateOperation.delete_points(list(ids)))

    def search(self, name: str, search: Search) -> list[list[VectorHit]]:
        query = qe.Query.Nearest(search.vector)
        with self._using(name) as shard:
            params = self._params(shard, search)
            requests = [
                qe.QueryRequest(
                    limit=search.limit,
                    query=query,
                    filter=to_edge(f),
                    score_threshold=search.score_threshold,
                    params=params,
                    with_payload=HIT_FIELDS,
                )
                for f in search.filters
            ]
            results = (
                [shard.query(requests[0])] if len(requests) == 1 else shard.query_batch(qe.QueryBatchRequest(requests))
            )
        return [[hit_from(p.id, p.score, p.payload) for p in points] for points in results]

    def _params(self, shard: qe.EdgeShard, search: Search) -> qe.SearchParams:
        """Exact below ``exact_below`` points, and always when a metadata condition filters.

        HNSW must check a metadata condition while it walks the graph and misses neighbours behind
        points the filter rejects: at 100k points (benchmarks/query.py) ``kind = note AND
        sentiment > 0.4`` returned the exact top-10 in 7 queries of 10, recall@10 0.72-0.85 at
        ef=512 (ACORN: 1.00 but 2-3x slower than exact), and recall@30 0.59 with the key indexed.
        Exact is right; its cost is the filter's: ~130 ms there when every point's payload is read,
        ~10 ms when the key has a payload index (``[qdrant] indexed_metadata``) and the matching
        points are enumerated from it.
        """
        if search.filters_metadata or shard.info().points_count < self.exact_below:
            return qe.SearchParams(exact=True)
        return qe.SearchParams(hnsw_ef=self.hnsw_ef)

    def scroll(self, name: str, flt: vf.Filter, limit: int, offset: Any) -> tuple[list[VectorRecord], Any]:
        request = qe.ScrollRequest(offset=offset, limit=limit, filter=to_edge(flt), with_payload=RECORD_FIELDS)
        with self._using(name) as shard:
            records, nxt = shard.scroll(request)
        return [record_from(r.id, r.payload, "") for r in records], nxt

    def count(self, name: str, flt: vf.Filter) -> int:
        with self._using(name) as shard:
            return int(shard.count(qe.CountRequest(exact=True, filter=to_edge(flt))))

    def optimize(self, name: str) -> bool:
        with self._using(name) as shard:
            return bool(shard.optimize())

    def version(self) -> str | None:
        try:
            return importlib_metadata.version("qdrant-edge-py")
        except importlib_metadata.PackageNotFoundError:
            return None

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


class EdgeVectorStore(VectorCore):
    """The vector store on Qdrant Edge."""

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
        fields = options(id_chunk_size, meta_indexes)
        backend = EdgeBackend(Path(base_dir), prefix=collection_prefix, exact_below=exact_below, hnsw_ef=hnsw_ef)
        super().__init__(backend, collection_prefix=collection_prefix, id_chunk_size=id_chunk_size, fields=fields)
        self.edge = backend

    def payload_schema(self, model_id: str | None = None) -> dict[str, str]:
        """Field -> index type of a collection (for ``health`` and tests)."""
        with self.backend.errors("payload_schema"):
            name, _ = self._resolve(model_id)
            return self.edge.payload_schema(name)

    def optimize(self, model_id: str | None = None) -> bool:
        """Merge segments, vacuum deletions and build HNSW (blocking; ~70 s at 100k x 384 on 2 cores).

        Searches keep running meanwhile. Returns whether anything changed. Run it from
        ``memoryctl nightly`` or after a bulk re-embed, not on the write path.
        """
        with self.backend.errors("optimize"):
            name, _ = self._resolve(model_id)
            return self.edge.optimize(name)
