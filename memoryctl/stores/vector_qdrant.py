"""``VectorStore`` on the official qdrant-client: a Qdrant server, or the client's local mode.

The store's semantics are ``vector_core``'s; this module is the engine underneath: collections
with their ``metadata`` (model id, dimension, distance; local mode keeps it too, checked with
qdrant-client 1.20), the alias ``settings.alias`` as the active pointer, and the neutral filter
nodes of ``vector_filter`` mapped onto qdrant-client's typed models. Local mode ignores payload
indexes and scans in Python: it is for correctness tests, not speed.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar, cast

import httpx
from qdrant_client import QdrantClient
from qdrant_client import models as qm
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from memoryctl.errors import BadRecord, InputError, StoreError, StoreUnavailable
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
    floats,
    hit_from,
    options,
    point_payload,
    record_from,
)

_DIST = {"cosine": qm.Distance.COSINE, "dot": qm.Distance.DOT, "euclid": qm.Distance.EUCLID}

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _stale_connection(exc: BaseException) -> bool:
    """The connection closed before any answer ("Server disconnected without sending a response"):
    most often Qdrant closed an idle kept-alive connection as the client reused it."""
    source = exc.source if isinstance(exc, ResponseHandlingException) else exc
    return isinstance(source, httpx.RemoteProtocolError)


def retry_stale(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run an idempotent call a second time when its pooled connection was stale.

    Only idempotent calls carry it (reads; upserts, payload updates and deletes by id), so a
    request that did reach the server before the connection broke is harmless to repeat. Without
    it, one idle connection closed by Qdrant failed a whole nightly re-embed step (#21's cluster).
    """

    @functools.wraps(method)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            if not _stale_connection(exc):
                raise
            return method(*args, **kwargs)

    return call


def _condition(c: vf.Condition) -> qm.Condition:
    if isinstance(c, vf.Match):
        return qm.FieldCondition(key=c.key, match=qm.MatchValue(value=c.value))
    if isinstance(c, vf.MatchAny):
        return qm.FieldCondition(key=c.key, match=qm.MatchAny(any=list(c.values)))
    if isinstance(c, vf.Range):
        return qm.FieldCondition(key=c.key, range=qm.Range(gt=c.gt, gte=c.gte, lt=c.lt, lte=c.lte))
    if isinstance(c, vf.TimeRange):
        return qm.FieldCondition(key=c.key, range=qm.DatetimeRange(gt=c.gt, gte=c.gte, lt=c.lt, lte=c.lte))
    if isinstance(c, vf.HasId):
        return qm.HasIdCondition(has_id=[str(i) for i in c.ids])
    if isinstance(c, vf.IsEmpty):
        return qm.IsEmptyCondition(is_empty=qm.PayloadField(key=c.key))
    return qm.Filter(should=[_condition(x) for x in c.conditions])


def to_qdrant(flt: vf.Filter) -> qm.Filter:
    return qm.Filter(
        must=[_condition(c) for c in flt.must] or None, must_not=[_condition(c) for c in flt.must_not] or None
    )


def _schema(kind: str, is_tenant: bool, hnsw: bool) -> qm.PayloadSchemaParams:
    if kind == "keyword":
        return qm.KeywordIndexParams(type=qm.KeywordIndexType.KEYWORD, is_tenant=is_tenant or None, enable_hnsw=hnsw)
    if kind == "datetime":
        return qm.DatetimeIndexParams(type=qm.DatetimeIndexType.DATETIME, enable_hnsw=hnsw)
    if kind == "number":
        return qm.FloatIndexParams(type=qm.FloatIndexType.FLOAT)
    return qm.BoolIndexParams(type=qm.BoolIndexType.BOOL, enable_hnsw=hnsw)


class QdrantBackend:
    """The engine primitives on qdrant-client. Thread-safe: the HTTP client is, local mode gets a lock."""

    write_batch = 512

    def __init__(
        self,
        *,
        url: str | None,
        path: str | None,
        api_key: str | None,
        timeout_s: float,
        alias: str,
        alias_cache_s: float,
        layout: Mapping[str, int] | None = None,
    ) -> None:
        self.alias = alias
        self.alias_cache_s = alias_cache_s
        self.layout = dict(layout or {})
        self.local = url is None
        self.kind = "qdrant-local" if self.local else "qdrant"
        self.location = url or path or ":memory:"
        # Local mode is a Python object graph without its own locking; a server client is safe.
        self._lock: contextlib.AbstractContextManager[Any] = (
            threading.RLock() if self.local else contextlib.nullcontext()
        )
        self._active: tuple[float, str | None] | None = None  # (fetched at, collection name)
        with self.errors("connect"):
            if url is not None:
                with warnings.catch_warnings():
                    # An API key over http is the design: the traffic runs inside the WireGuard mesh
                    # (or on loopback), and the client's warning would print on every command.
                    warnings.filterwarnings("ignore", "Api key is used with an insecure connection")
                    self.client = QdrantClient(
                        url=url,
                        api_key=api_key,
                        timeout=max(1, math.ceil(timeout_s)),
                        check_compatibility=False,  # no network in a constructor; ping() reports versions
                    )
            elif path and path != ":memory:":
                self.client = QdrantClient(path=path)
            else:
                self.client = QdrantClient(location=":memory:")

    @contextlib.contextmanager
    def errors(self, op: str) -> Iterator[None]:
        """Map client exceptions: cannot reach -> StoreUnavailable, anything else -> StoreError."""
        try:
            with self._lock:
                yield
        except (StoreError, InputError):
            raise
        except (ResponseHandlingException, httpx.TransportError, ConnectionError, TimeoutError) as exc:
            raise StoreUnavailable(
                STORE,
                f"{op}: cannot reach {self.location}: {exc}",
                hint="check that Qdrant is running and reachable (qdrant.url, WireGuard); `memoryctl health`",
            ) from exc
        except UnexpectedResponse as exc:
            if exc.status_code in (401, 403):
                hint = "the API key is wrong or missing (qdrant.api_key / MEMORYCTL_QDRANT__API_KEY)"
            elif exc.status_code in (502, 503, 504):
                raise StoreUnavailable(STORE, f"{op}: {exc}", hint="Qdrant is overloaded or restarting") from exc
            else:
                hint = None
            kind = BadRecord if exc.status_code in (400, 422) else StoreError  # the request's data
            raise kind(STORE, f"{op}: HTTP {exc.status_code}: {exc.content!r}"[:500], hint=hint) from exc
        except Exception as exc:
            raise StoreError(STORE, f"{op}: {type(exc).__name__}: {exc}"[:500]) from exc

    def pointer(self) -> str:
        return f"alias {self.alias!r}"

    def describe(self) -> dict[str, Any]:
        return {"alias": self.alias}

    # ---- collections ----------------------------------------------------------------------------
    @retry_stale
    def model_of(self, name: str) -> EmbeddingModelInfo | None:
        if not self.client.collection_exists(name):
            return None
        meta = self.client.get_collection(name).config.metadata or {}
        if "model_id" not in meta or "dim" not in meta:
            return None
        return EmbeddingModelInfo(
            model_id=str(meta["model_id"]),
            dim=int(meta["dim"]),
            distance=cast(Distance, meta.get("distance", "cosine")),
        )

    @retry_stale
    def names(self) -> list[str]:
        return [c.name for c in self.client.get_collections().collections]

    def create(self, name: str, model: EmbeddingModelInfo, fields: Sequence[IndexField]) -> None:
        try:
            self.client.create_collection(
                name,
                vectors_config=qm.VectorParams(size=model.dim, distance=_DIST[model.distance]),
                metadata={"memoryctl": 1, "model_id": model.model_id, "dim": model.dim, "distance": model.distance},
                # A cluster: shards spread over the peers, each kept by `replication_factor` of them.
                shard_number=self.layout.get("shard_number"),
                replication_factor=self.layout.get("replication_factor"),
                write_consistency_factor=self.layout.get("write_consistency_factor"),
            )
        except (UnexpectedResponse, ValueError):
            # Another process created it between our check and our create: fine.
            if not self.client.collection_exists(name):
                raise
        self._indexes(name, fields, created=True)

    def ensure_indexes(self, name: str, fields: Sequence[IndexField]) -> None:
        self._indexes(name, fields, created=False)

    def _indexes(self, name: str, fields: Sequence[IndexField], *, created: bool) -> None:
        """A server reports its payload schema, so a collection whose creator died between creating
        it and indexing it is completed here. Local mode never reports a schema (its indexes are
        no-ops), so there they are only issued once, at creation."""
        if self.local and not created:
            return
        present = set(self.client.get_collection(name).payload_schema or {})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # local mode warns that indexes have no effect there
            for field, kind, tenant, hnsw in fields:
                if field not in present:
                    self.client.create_payload_index(name, field, field_schema=_schema(kind, tenant, hnsw), wait=True)

    def drop(self, name: str) -> None:
        if self.client.collection_exists(name):
            self.client.delete_collection(name)

    @retry_stale
    def active(self, *, fresh: bool) -> str | None:
        """The alias target, trusted for ``alias_cache_s`` unless ``fresh``.

        Searches always go to the concrete collection whose model was checked, never through the
        alias, so a swap by another process can at worst make a search use the previous
        (consistent) collection for that long.
        """
        now = time.monotonic()
        if not fresh and self._active is not None and now - self._active[0] < self.alias_cache_s:
            return self._active[1]
        target = next(
            (a.collection_name for a in self.client.get_aliases().aliases if a.alias_name == self.alias), None
        )
        self._active = (now, target)
        return target

    def set_active(self, name: str, model: EmbeddingModelInfo) -> None:
        ops: list[qm.CreateAliasOperation | qm.DeleteAliasOperation] = []
        if self.active(fresh=True) is not None:
            ops.append(qm.DeleteAliasOperation(delete_alias=qm.DeleteAlias(alias_name=self.alias)))
        ops.append(qm.CreateAliasOperation(create_alias=qm.CreateAlias(collection_name=name, alias_name=self.alias)))
        # One call: the server applies delete+create atomically, so readers never see no alias.
        self.client.update_collection_aliases(change_aliases_operations=ops)
        self._active = None

    # ---- points ---------------------------------------------------------------------------------
    @retry_stale
    def upsert(self, name: str, points: Sequence[VectorPoint]) -> None:
        self.client.upsert(
            name,
            points=[qm.PointStruct(id=str(p.id), vector=floats(p.vector), payload=point_payload(p)) for p in points],
            wait=True,
        )

    @retry_stale
    def set_payload(self, name: str, ids: Sequence[uuid.UUID], payload: dict[str, Any]) -> None:
        # By filter, not by id list: an id that is not (yet) in Qdrant is not an error.
        selector = qm.FilterSelector(filter=qm.Filter(must=[qm.HasIdCondition(has_id=[str(i) for i in ids])]))
        self.client.set_payload(name, payload=payload, points=selector, wait=True)

    @retry_stale
    def delete(self, name: str, ids: Sequence[uuid.UUID]) -> None:
        self.client.delete(name, points_selector=qm.PointIdsList(points=[str(i) for i in ids]), wait=True)

    @retry_stale
    def search(self, name: str, search: Search) -> list[list[VectorHit]]:
        requests = [
            qm.QueryRequest(
                query=search.vector,
                filter=to_qdrant(f),
                limit=search.limit,
                score_threshold=search.score_threshold,
                with_payload=HIT_FIELDS,
            )
            for f in search.filters
        ]
        responses = self.client.query_batch_points(name, requests=requests)
        return [[hit_from(p.id, p.score, p.payload) for p in r.points] for r in responses]

    @retry_stale
    def scroll(self, name: str, flt: vf.Filter, limit: int, offset: Any) -> tuple[list[VectorRecord], Any]:
        records, nxt = self.client.scroll(
            name,
            scroll_filter=to_qdrant(flt),
            limit=limit,
            offset=offset,
            with_payload=RECORD_FIELDS,
            with_vectors=False,
        )
        return [record_from(r.id, r.payload, "") for r in records], nxt

    @retry_stale
    def count(self, name: str, flt: vf.Filter) -> int:
        return int(self.client.count(name, count_filter=to_qdrant(flt), exact=True).count)

    @retry_stale
    def version(self) -> str | None:
        return None if self.local else self.client.info().version

    def close(self) -> None:
        with contextlib.suppress(Exception), self._lock:
            self.client.close()


class QdrantVectorStore(VectorCore):
    """The vector store on qdrant-client (a server, or local mode)."""

    def __init__(
        self,
        *,
        url: str | None = None,
        path: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 5.0,
        alias: str = "memories",
        collection_prefix: str = "memories",
        id_chunk_size: int = DEFAULT_ID_CHUNK,
        alias_cache_s: float = 5.0,
        meta_indexes: Mapping[str, str] | None = None,
        layout: Mapping[str, int] | None = None,
    ) -> None:
        """``url`` = a server; else ``path`` (local mode on disk) or ``:memory:`` / None (in memory).

        ``layout``: ``shard_number`` / ``replication_factor`` / ``write_consistency_factor`` for
        the collections this store creates (a Qdrant cluster); existing collections keep theirs.

        ``alias_cache_s``: how long the alias -> collection resolution is trusted; a model id that
        does not match forces a fresh lookup before a search is refused.
        """
        fields = options(id_chunk_size, meta_indexes)
        backend = QdrantBackend(
            url=url,
            path=path,
            api_key=api_key,
            timeout_s=timeout_s,
            alias=alias,
            alias_cache_s=alias_cache_s,
            layout=layout,
        )
        super().__init__(backend, collection_prefix=collection_prefix, id_chunk_size=id_chunk_size, fields=fields)
        self.qdrant = backend

    @property
    def client(self) -> QdrantClient:
        return self.qdrant.client

    @property
    def alias(self) -> str:
        return self.qdrant.alias

    @property
    def local(self) -> bool:
        return self.qdrant.local
