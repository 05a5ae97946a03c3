"""``VectorStore`` on the official qdrant-client: a Qdrant server, or the client's local mode.

Layout (DESIGN.md, "Data model"): one collection per embedding model version, named from the model
id (``<prefix>__<slug>__<hash8>``: the slug keeps it readable, the hash keeps two ids that slug
alike apart), reached through the alias ``settings.alias`` (``memories``). The model id, dimension
and distance live in the collection ``metadata``, so a collection describes itself and a restore or
a second operator never has to guess which model made its vectors. Local mode keeps ``metadata``
too (checked with qdrant-client 1.20), so no sidecar is needed.

Payload per point: ``agent_id``, ``kind``, ``created_at`` (RFC 3339, UTC), ``content_hash``,
``entity_keys`` (list), ``deleted`` (bool) and ``meta`` (scalar metadata, filterable as
``meta.<key>``). The memory id is the point id and is not repeated in the payload: every payload
value costs ~5 us to convert in qdrant-edge-py's binding, which bounds bulk writes (migrate).
The payload indexes are created together with the collection, before it can receive a point,
never on demand: building an index on a live collection is a slow, lock-taking operation that must
not be triggered by a query. (Local mode ignores payload indexes; it scans in Python. It is for
correctness tests, not speed.)

Filters are built from typed model objects only; no user value is ever spliced into a string the
engine parses. Metadata keys reach a payload *path* (``meta.<key>``) and are therefore checked
against the identifier pattern of ``memoryctl.model`` once more here.

Candidate id lists (graph -> ids -> vector search) are split into chunks of ``id_chunk_size``:
each chunk becomes one query of a single ``query_batch_points`` call (one round trip) and the
per-chunk top-k lists are merged. Why chunk at all: the request body grows ~40 bytes per id, the
server must materialise the id set per request and, in a cluster, per shard; an unbounded list from
a 3-hop traversal can be hundreds of thousands of ids. With chunks every request stays bounded and
the merge is exact (the global top-k is contained in the union of the per-chunk top-k). The default
(1,000) comes from benchmarks/vector_chunks.py (Edge, 100k x 384, ``HasIdCondition``, top-10, on a
2-core box with load average ~9): 100 ids 0.5 ms, 1,000 ids 5.7 ms, 2,000 ids 16 ms, 5,000 ids
91 ms, 10,000 ids 162 ms: the cost per id grows past ~1,000, and 1,000 keeps a server request under
~40 kB. Through the store (chunks as one batch), 5,000 ids cost 110-240 ms whatever the chunk size
between 500 and 5,000 under that load: chunking is about bounded requests, not speed; re-measure
on an idle machine before tuning. ``HasIdCondition`` (point ids) beat ``MatchAny`` on a
keyword-indexed ``id`` field at every size (1,000 ids: 5.7 vs 21 ms), hence no index on ``id``.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
import threading
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, cast

import httpx
from qdrant_client import QdrantClient
from qdrant_client import models as qm
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from memoryctl.config import QdrantSettings
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

STORE = "qdrant"
DEFAULT_ID_CHUNK = 1000
# Payload fields read back by search / scroll; the rest stays on the server.
HIT_FIELDS = ["agent_id", "created_at", "kind"]
RECORD_FIELDS = ["agent_id", "content_hash", "deleted"]
_META_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_SLUG = re.compile(r"[^a-z0-9]+")
Distance = Literal["cosine", "dot", "euclid"]

# The payload schema every collection (and every Edge shard) is created with:
# (field, kind, is_tenant, hnsw). ``agent_id`` is the tenant key, so Qdrant co-locates each agent's
# points. ``hnsw`` False = no per-value HNSW subgraphs for that field: ``deleted`` is false for almost
# every point (its subgraph would duplicate the main graph) and ``content_hash`` is unique per point
# (a subgraph per value is never usable); both only filter, and each subgraph adds build time to
# optimize() / the server's indexer.
PAYLOAD_SCHEMA: tuple[tuple[str, str, bool, bool], ...] = (
    ("agent_id", "keyword", True, True),
    ("kind", "keyword", False, True),
    ("created_at", "datetime", False, True),
    ("entity_keys", "keyword", False, True),
    ("deleted", "bool", False, False),
    ("content_hash", "keyword", False, False),
)


def index_fields(meta_indexes: Mapping[str, str]) -> tuple[tuple[str, str, bool, bool], ...]:
    """PAYLOAD_SCHEMA plus the configured metadata indexes (``[qdrant] indexed_metadata``)."""
    extra = tuple((meta_key(k), kind, False, kind != "number") for k, kind in sorted(meta_indexes.items()))
    for _, kind, _, _ in extra:
        if kind not in ("number", "keyword", "bool"):
            raise InputError(f"metadata index type {kind!r} is not number, keyword or bool")
    return PAYLOAD_SCHEMA + extra


# --------------------------------------------------------------------------------------------------
# Helpers shared with the Edge store (pure functions, no client types).


def collection_name(prefix: str, model_id: str) -> str:
    """``<prefix>__<slug>__<hash8>``: readable, safe for paths and Qdrant, unique per model id."""
    if not model_id or not isinstance(model_id, str):
        raise InputError(f"invalid embedding model id {model_id!r}", hint="a model id is a non-empty string")
    slug = _SLUG.sub("-", model_id.lower()).strip("-")[:48] or "model"
    digest = hashlib.sha256(model_id.encode("utf-8")).hexdigest()[:8]
    return f"{prefix}__{slug}__{digest}"


def to_utc(value: datetime) -> datetime:
    """Aware UTC; a naive datetime is taken to be UTC already (that is what memoryctl stores)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def iso(value: datetime) -> str:
    return to_utc(value).isoformat()


def parse_dt(value: Any) -> datetime:
    return to_utc(datetime.fromisoformat(str(value)))


def scalar_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """The metadata that can be pushed down: identifier keys with str/int/float/bool values.

    Anything else (nested objects, lists, None, keys that are not identifiers) is not filterable by
    ``VectorFilter.meta`` anyway, so it is left out rather than rejected: the sync daemon must never
    wedge on a record whose metadata the source of truth already accepted.
    """
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if not isinstance(key, str) or not _META_KEY.match(key):
            continue
        if isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value)):
            out[key] = value
    return out


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


def check_vector(vector: Sequence[float], model: EmbeddingModelInfo) -> None:
    if len(vector) != model.dim:
        raise StoreError(
            STORE,
            f"vector has {len(vector)} dimensions; model {model.model_id!r} has {model.dim}",
            hint="the embedder configuration does not match the active collection; see `memoryctl migrate`",
        )


def meta_key(key: str) -> str:
    if not isinstance(key, str) or not _META_KEY.match(key):
        raise InputError(f"invalid metadata key {key!r}", hint="metadata keys are identifiers")
    return f"meta.{key}"


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for lo in range(0, len(items), size):
        yield items[lo : lo + size]


def empty_selection(flt: VectorFilter) -> bool:
    """An empty candidate list selects nothing (it is a set, not "no restriction": that is None)."""
    return any(v is not None and len(v) == 0 for v in (flt.ids, flt.kinds, flt.entity_keys_any))


def merge_hits(lists: Sequence[Sequence[VectorHit]], limit: int, distance: Distance) -> list[VectorHit]:
    """Exact global top-k from per-chunk top-k lists (Euclid scores are distances: lower is better)."""
    seen: dict[uuid.UUID, VectorHit] = {}
    for hits in lists:
        for h in hits:
            seen.setdefault(h.id, h)
    return sorted(seen.values(), key=lambda h: h.score, reverse=distance != "euclid")[:limit]


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def meta_value_error(cond: MetaCondition, why: str) -> InputError:
    return InputError(
        f"metadata filter {cond.key} {cond.op} {cond.value!r}: {why}",
        hint="= / != / in take strings, integers, floats or booleans; < <= > >= take numbers or datetimes",
    )


# --------------------------------------------------------------------------------------------------
# Filter translation (qdrant-client models)

_DIST = {"cosine": qm.Distance.COSINE, "dot": qm.Distance.DOT, "euclid": qm.Distance.EUCLID}
_RANGE_OP = {"<": "lt", "<=": "lte", ">": "gt", ">=": "gte"}


def _eq(key: str, value: Any, cond: MetaCondition) -> qm.Condition:
    if isinstance(value, bool | str):
        return qm.FieldCondition(key=key, match=qm.MatchValue(value=value))
    if is_number(value):
        # A number is a point range, not a match: exact match takes str/int/bool only, and an int
        # match would miss the same number stored as a float (1 vs 1.0 after a JSON round trip).
        if isinstance(value, int) and abs(value) > 2**53:  # beyond float precision: match exactly
            return qm.FieldCondition(key=key, match=qm.MatchValue(value=value))
        return qm.FieldCondition(key=key, range=qm.Range(gte=float(value), lte=float(value)))
    raise meta_value_error(cond, "unsupported value type")


def _meta_condition(cond: MetaCondition) -> tuple[list[qm.Condition], list[qm.Condition]]:
    """(must, must_not) for one metadata condition."""
    key = meta_key(cond.key)
    if cond.op == "=":
        return [_eq(key, cond.value, cond)], []
    if cond.op == "!=":
        # SQL semantics: a point without the key does not satisfy "key != v" (it is NULL there).
        return [], [qm.IsEmptyCondition(is_empty=qm.PayloadField(key=key)), _eq(key, cond.value, cond)]
    if cond.op == "in":
        values = list(cond.value) if isinstance(cond.value, list | tuple | set | frozenset) else None
        if not values:
            raise meta_value_error(cond, "'in' needs a non-empty list")
        if all(isinstance(v, str) for v in values):
            return [qm.FieldCondition(key=key, match=qm.MatchAny(any=values))], []
        return [qm.Filter(should=[_eq(key, v, cond) for v in values])], []
    if cond.op in _RANGE_OP:
        arg = _RANGE_OP[cond.op]
        if isinstance(cond.value, datetime):
            return [qm.FieldCondition(key=key, range=qm.DatetimeRange(**{arg: to_utc(cond.value)}))], []
        if is_number(cond.value):
            return [qm.FieldCondition(key=key, range=qm.Range(**{arg: float(cond.value)}))], []
        raise meta_value_error(cond, "ranges need a number or a datetime")
    raise meta_value_error(cond, "unknown operator")


def build_filter(flt: VectorFilter, ids: Sequence[uuid.UUID] | None = None) -> qm.Filter:
    """The Qdrant filter for ``flt`` with ``ids`` (one chunk) in place of ``flt.ids``."""
    must: list[qm.Condition] = []
    must_not: list[qm.Condition] = []
    if flt.agent_id is not None:
        must.append(qm.FieldCondition(key="agent_id", match=qm.MatchValue(value=flt.agent_id)))
    if ids is not None:
        must.append(qm.HasIdCondition(has_id=[str(i) for i in ids]))
    if flt.kinds is not None:
        must.append(qm.FieldCondition(key="kind", match=qm.MatchAny(any=list(flt.kinds))))
    if flt.exclude_kinds:
        must_not.append(qm.FieldCondition(key="kind", match=qm.MatchAny(any=list(flt.exclude_kinds))))
    if flt.created_from is not None or flt.created_to is not None:
        # Half-open [from, to): consecutive windows never count a memory twice.
        must.append(
            qm.FieldCondition(
                key="created_at",
                range=qm.DatetimeRange(
                    gte=to_utc(flt.created_from) if flt.created_from else None,
                    lt=to_utc(flt.created_to) if flt.created_to else None,
                ),
            )
        )
    if flt.entity_keys_any is not None:
        must.append(qm.FieldCondition(key="entity_keys", match=qm.MatchAny(any=list(flt.entity_keys_any))))
    for cond in flt.meta:
        m, n = _meta_condition(cond)
        must.extend(m)
        must_not.extend(n)
    if not flt.include_deleted:
        must_not.append(qm.FieldCondition(key="deleted", match=qm.MatchValue(value=True)))
    return qm.Filter(must=must or None, must_not=must_not or None)


def _schema(kind: str, is_tenant: bool, hnsw: bool) -> qm.PayloadSchemaParams:
    if kind == "keyword":
        return qm.KeywordIndexParams(type=qm.KeywordIndexType.KEYWORD, is_tenant=is_tenant or None, enable_hnsw=hnsw)
    if kind == "datetime":
        return qm.DatetimeIndexParams(type=qm.DatetimeIndexType.DATETIME, enable_hnsw=hnsw)
    if kind == "number":
        return qm.FloatIndexParams(type=qm.FloatIndexType.FLOAT)
    return qm.BoolIndexParams(type=qm.BoolIndexType.BOOL, enable_hnsw=hnsw)


# --------------------------------------------------------------------------------------------------


def _uuid(point_id: Any) -> uuid.UUID:
    return point_id if isinstance(point_id, uuid.UUID) else uuid.UUID(str(point_id))


def hit_from(point_id: Any, score: float, payload: dict[str, Any] | None) -> VectorHit:
    """A search hit from a point's id, score and payload (both engines store the same payload)."""
    pl = payload or {}
    return VectorHit(
        id=_uuid(point_id),
        score=float(score),
        agent_id=str(pl.get("agent_id", "")),
        created_at=parse_dt(pl["created_at"]),
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


class QdrantVectorStore:
    """The vector store on qdrant-client. Thread-safe: the HTTP client is, local mode gets a lock."""

    name = STORE

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
    ) -> None:
        """``url`` = a server; else ``path`` (local mode on disk) or ``:memory:`` / None (in memory).

        ``alias_cache_s``: how long the alias -> collection resolution is trusted. Searches always
        go to the concrete collection whose model was checked, never through the alias, so a swap
        by another process can at worst make a search use the previous (consistent) collection for
        that long; a model id that does not match forces a fresh lookup before refusing.
        """
        if id_chunk_size < 1:
            raise InputError("id_chunk_size must be >= 1")
        self.alias = alias
        self.prefix = collection_prefix
        self.index_fields = index_fields(meta_indexes or {})
        self.id_chunk_size = id_chunk_size
        self.alias_cache_s = alias_cache_s
        self.local = url is None
        self.engine = "qdrant-local" if self.local else "qdrant"
        self.location = url or path or ":memory:"
        # Local mode is a Python object graph without its own locking; a server client is safe.
        self._lock: contextlib.AbstractContextManager[Any] = (
            threading.RLock() if self.local else contextlib.nullcontext()
        )
        self._models: dict[str, EmbeddingModelInfo] = {}  # collection name -> model (immutable)
        self._active: tuple[float, str | None] | None = None  # (fetched at, collection name)
        with self._errors("connect"):
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

    @classmethod
    def from_settings(cls, settings: QdrantSettings, **kwargs: Any) -> QdrantVectorStore:
        return cls(
            url=settings.url,
            path=settings.path,
            api_key=settings.api_key.get_secret_value() if settings.api_key else None,
            timeout_s=settings.timeout_s,
            alias=settings.alias,
            collection_prefix=settings.collection_prefix,
            meta_indexes=settings.indexed_metadata,
            **kwargs,
        )

    # ---------------------------------------------------------------------------------- errors

    @contextlib.contextmanager
    def _errors(self, op: str) -> Iterator[None]:
        """Map client exceptions: cannot reach -> StoreUnavailable, anything else -> StoreError."""
        try:
            with self._lock:
                yield
        except StoreError:
            raise
        except InputError:
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
            raise StoreError(STORE, f"{op}: HTTP {exc.status_code}: {exc.content!r}"[:500], hint=hint) from exc
        except Exception as exc:
            raise StoreError(STORE, f"{op}: {type(exc).__name__}: {exc}"[:500]) from exc

    # ---------------------------------------------------------------------------------- models

    def _model_of(self, name: str) -> EmbeddingModelInfo | None:
        """The model a collection was created for (from its metadata); None if it is not ours."""
        if name in self._models:
            return self._models[name]
        info = self.client.get_collection(name)
        meta = info.config.metadata or {}
        if "model_id" not in meta or "dim" not in meta:
            return None
        model = EmbeddingModelInfo(
            model_id=str(meta["model_id"]),
            dim=int(meta["dim"]),
            distance=cast(Distance, meta.get("distance", "cosine")),
        )
        self._models[name] = model
        return model

    def _alias_target(self, *, fresh: bool = False) -> str | None:
        now = time.monotonic()
        if not fresh and self._active is not None and now - self._active[0] < self.alias_cache_s:
            return self._active[1]
        target = None
        for a in self.client.get_aliases().aliases:
            if a.alias_name == self.alias:
                target = a.collection_name
        self._active = (now, target)
        return target

    def _collection_for(self, model_id: str | None) -> tuple[str, EmbeddingModelInfo]:
        """The concrete collection for ``model_id`` (None = the active one), which must exist."""
        if model_id is None:
            name = self._alias_target(fresh=True)
            if name is None:
                raise StoreError(
                    STORE,
                    f"no collection is active (alias {self.alias!r} does not exist)",
                    hint="run `memoryctl migrate` or ensure_collection() for the configured embedder",
                )
        else:
            name = collection_name(self.prefix, model_id)
            if not self.client.collection_exists(name):
                raise StoreError(
                    STORE, f"no collection for model {model_id!r} ({name})", hint="ensure_collection() first"
                )
        model = self._model_of(name)
        if model is None:
            raise StoreError(STORE, f"collection {name} has no memoryctl metadata (model id, dim)")
        return name, model

    # ---------------------------------------------------------------------------------- protocol

    def ensure_collection(self, model: EmbeddingModelInfo, *, activate_if_none: bool = True) -> str:
        name = collection_name(self.prefix, model.model_id)
        with self._errors("ensure_collection"):
            if self.client.collection_exists(name):
                existing = self._model_of(name)
                if existing is not None and existing != model:
                    raise StoreError(
                        STORE,
                        f"collection {name} exists for {existing}, not {model}",
                        hint="a model id must always mean the same dimension and distance; use a new id",
                    )
                self._ensure_indexes(name, created=False)
            else:
                try:
                    self.client.create_collection(
                        name,
                        vectors_config=qm.VectorParams(size=model.dim, distance=_DIST[model.distance]),
                        metadata={
                            "memoryctl": 1,
                            "model_id": model.model_id,
                            "dim": model.dim,
                            "distance": model.distance,
                        },
                    )
                except (UnexpectedResponse, ValueError) as exc:
                    # Another process created it between our check and our create: fine.
                    if not self.client.collection_exists(name):
                        raise exc
                if self._model_of(name) is None:
                    raise StoreError(
                        STORE,
                        f"collection {name} was created but its metadata (model id, dim) was not kept",
                        hint="collection metadata needs Qdrant >= 1.16; upgrade the server",
                    )
                self._ensure_indexes(name, created=True)
            if activate_if_none and self._alias_target(fresh=True) is None:
                self.client.update_collection_aliases(
                    change_aliases_operations=[
                        qm.CreateAliasOperation(
                            create_alias=qm.CreateAlias(collection_name=name, alias_name=self.alias)
                        )
                    ]
                )
                self._active = None
        return name

    def _ensure_indexes(self, name: str, *, created: bool) -> None:
        """Create the payload indexes that are missing (all of them right after creation).

        A server reports its payload schema, so a collection whose creator died between creating
        it and indexing it is completed here. Local mode never reports a schema (its indexes are
        no-ops), so there they are only issued once, at creation.
        """
        if self.local and not created:
            return
        present = set(self.client.get_collection(name).payload_schema or {})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # local mode warns that indexes have no effect there
            for field, kind, tenant, hnsw in self.index_fields:
                if field not in present:
                    self.client.create_payload_index(name, field, field_schema=_schema(kind, tenant, hnsw), wait=True)

    def active_model(self) -> EmbeddingModelInfo | None:
        with self._errors("active_model"):
            name = self._alias_target(fresh=True)
            return None if name is None else self._model_of(name)

    def activate(self, model_id: str) -> None:
        name = collection_name(self.prefix, model_id)
        with self._errors("activate"):
            if not self.client.collection_exists(name):
                raise StoreError(STORE, f"no collection for model {model_id!r}", hint="ensure_collection() first")
            ops: list[qm.CreateAliasOperation | qm.DeleteAliasOperation] = []
            if self._alias_target(fresh=True) is not None:
                ops.append(qm.DeleteAliasOperation(delete_alias=qm.DeleteAlias(alias_name=self.alias)))
            ops.append(
                qm.CreateAliasOperation(create_alias=qm.CreateAlias(collection_name=name, alias_name=self.alias))
            )
            # One call: the server applies delete+create atomically, so readers never see no alias.
            self.client.update_collection_aliases(change_aliases_operations=ops)
            self._active = None

    def collections(self) -> list[CollectionInfo]:
        with self._errors("collections"):
            active = self._alias_target(fresh=True)
            out = []
            for c in self.client.get_collections().collections:
                if not c.name.startswith(self.prefix + "__"):
                    continue
                model = self._model_of(c.name)
                if model is None:
                    continue
                points = self.client.count(c.name, exact=True).count
                out.append(CollectionInfo(name=c.name, model=model, points=points, active=c.name == active))
            return sorted(out, key=lambda ci: ci.name)

    def drop_collection(self, model_id: str) -> None:
        name = collection_name(self.prefix, model_id)
        with self._errors("drop_collection"):
            if self._alias_target(fresh=True) == name:
                raise StoreError(
                    STORE,
                    f"refusing to drop {name}: it is the active collection",
                    hint="activate another model first (`memoryctl migrate` does this)",
                )
            if self.client.collection_exists(name):
                self.client.delete_collection(name)
            self._models.pop(name, None)

    def upsert(self, points: Sequence[VectorPoint], *, model_id: str | None = None) -> None:
        if not points:
            return
        with self._errors("upsert"):
            name, model = self._collection_for(model_id)
            for p in points:
                check_vector(p.vector, model)
            for batch in chunks(points, 512):
                self.client.upsert(
                    name,
                    points=[
                        qm.PointStruct(id=str(p.id), vector=[float(x) for x in p.vector], payload=point_payload(p))
                        for p in batch
                    ],
                    wait=True,
                )

    def set_deleted(self, ids: Sequence[uuid.UUID], deleted: bool = True, *, model_id: str | None = None) -> None:
        if not ids:
            return
        with self._errors("set_deleted"):
            name, _ = self._collection_for(model_id)
            for chunk in chunks(list(ids), self.id_chunk_size):
                # By filter, not by id list: an id that is not (yet) in Qdrant is not an error.
                self.client.set_payload(
                    name,
                    payload={"deleted": bool(deleted)},
                    points=qm.FilterSelector(
                        filter=qm.Filter(must=[qm.HasIdCondition(has_id=[str(i) for i in chunk])])
                    ),
                    wait=True,
                )

    def delete(self, ids: Sequence[uuid.UUID], *, model_id: str | None = None) -> None:
        if not ids:
            return
        with self._errors("delete"):
            name, _ = self._collection_for(model_id)
            for chunk in chunks(list(ids), self.id_chunk_size):
                self.client.delete(name, points_selector=qm.PointIdsList(points=[str(i) for i in chunk]), wait=True)

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
            name, model = self._collection_for(model_id) if inactive_ok else self._searchable(model_id)
            check_vector(vector, model)
            query = [float(x) for x in vector]
            id_lists: list[Sequence[uuid.UUID] | None] = (
                [None] if flt.ids is None else list(chunks(list(dict.fromkeys(flt.ids)), self.id_chunk_size))
            )
            requests = [
                qm.QueryRequest(
                    query=query,
                    filter=build_filter(flt, ids),
                    limit=limit,
                    score_threshold=score_threshold,
                    with_payload=HIT_FIELDS,
                )
                for ids in id_lists
            ]
            responses = self.client.query_batch_points(name, requests=requests)
            lists = [[self._hit(p) for p in r.points] for r in responses]
        return merge_hits(lists, limit, model.distance)

    def _searchable(self, model_id: str) -> tuple[str, EmbeddingModelInfo]:
        """The active collection, provided ``model_id`` made the query vector for it.

        The cached alias is tried first; on a mismatch the alias is read again before refusing, so
        a swap made by another process is seen at once by a caller that already uses the new model.
        """
        active: EmbeddingModelInfo | None = None
        for fresh in (False, True):
            name = self._alias_target(fresh=fresh)
            active = self._model_of(name) if name else None
            if name is not None and active is not None and active.model_id == model_id:
                return name, active
        raise StoreError(
            STORE,
            f"query vector is from model {model_id!r} but the active collection is for "
            f"{active.model_id if active else None!r}",
            hint="vectors of two models are not comparable even when their dimensions match; embed with "
            "the active model, or finish `memoryctl migrate` so the alias points at the new model",
        )

    @staticmethod
    def _hit(p: qm.ScoredPoint) -> VectorHit:
        return hit_from(p.id, p.score, p.payload)

    def scroll(
        self, *, agent_id: str | None = None, model_id: str | None = None, batch: int = 1000
    ) -> Iterator[list[VectorRecord]]:
        """Every point (soft-deleted ones too: reconciliation needs them), page by page."""
        with self._errors("scroll"):
            name, model = self._collection_for(model_id)
        flt = build_filter(VectorFilter(agent_id=agent_id, include_deleted=True))
        offset: Any = None
        while True:
            with self._errors("scroll"):
                records, offset = self.client.scroll(
                    name,
                    scroll_filter=flt,
                    limit=batch,
                    offset=offset,
                    with_payload=RECORD_FIELDS,
                    with_vectors=False,
                )
            page = [record_from(r.id, r.payload, model.model_id) for r in records]
            if page:
                yield page
            if offset is None:
                return

    def count(self, *, agent_id: str | None = None, model_id: str | None = None) -> int:
        """Points in the collection, soft-deleted ones included (the same set ``scroll`` yields)."""
        with self._errors("count"):
            name, _ = self._collection_for(model_id)
            flt = build_filter(VectorFilter(agent_id=agent_id, include_deleted=True))
            return int(self.client.count(name, count_filter=flt, exact=True).count)

    def ping(self) -> dict[str, Any]:
        with self._errors("ping"):
            version = None if self.local else self.client.info().version
            name = self._alias_target(fresh=True)
            model = self._model_of(name) if name else None
            return {
                "engine": self.engine,
                "location": self.location,
                "version": version,
                "alias": self.alias,
                "collection": name,
                "model_id": model.model_id if model else None,
                "dim": model.dim if model else None,
            }

    def close(self) -> None:
        with contextlib.suppress(Exception), self._lock:
            self.client.close()
