"""The small protocols the engine talks to. No client library type crosses these lines.

Two implementations exist for each secondary store, and the write path, the query engine and the
ops commands must not know which one they hold:

- ``VectorStore``: ``QdrantVectorStore`` (qdrant-client: a server, or its local mode in tests) and
  ``EdgeVectorStore`` (Qdrant Edge, the Rust engine in-process, for the embedded profile and the
  benchmarks).
- ``GraphStore``: ``Neo4jGraphStore`` (Bolt, Cypher) and ``SqlGraphStore`` (node/edge tables in the
  embedded PostgreSQL, traversals compiled to recursive SQL), both ``GraphCore`` over an engine's
  ``GraphBackend`` (``graph_core``), as both vector stores are ``VectorCore`` over a backend.
- ``CypherReader``: caller-written read-only Cypher, on Neo4j only (``cypher_sandbox``).

Every call may raise ``StoreUnavailable`` (could not reach it in time) or ``StoreError``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from memoryctl.query_terms import Direction, MetaOp

if TYPE_CHECKING:  # the protocols stay importable without PostgreSQL's driver
    from memoryctl.stores.records import RecordStore


@dataclass(frozen=True, slots=True)
class EmbeddingModelInfo:
    """An embedding model version. ``model_id`` names the collection; never mix two of them."""

    model_id: str
    dim: int
    distance: Literal["cosine", "dot", "euclid"] = "cosine"


@dataclass(frozen=True, slots=True)
class CollectionInfo:
    name: str
    model: EmbeddingModelInfo
    points: int
    active: bool


@dataclass(frozen=True, slots=True)
class VectorPoint:
    """What the vector store keeps per memory: the vector plus the payload filters push down to."""

    id: uuid.UUID
    vector: Sequence[float]
    agent_id: str
    kind: str
    created_at: datetime
    content_hash: str
    entity_keys: Sequence[str] = ()
    deleted: bool = False
    # Scalar metadata values (str, int, float, bool) replicated for filter pushdown.
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MetaCondition:
    key: str  # already validated by memoryctl.model.validate_meta_key
    op: MetaOp
    value: Any


@dataclass(frozen=True, slots=True)
class VectorFilter:
    """Conditions that are pushed into the vector search itself (all AND-ed).

    ``ids`` restricts to candidate memories (e.g. from a graph traversal); adapters chunk it.
    ``include_deleted`` is only for reconciliation; queries never set it.
    """

    agent_id: str | None = None
    ids: Sequence[uuid.UUID] | None = None
    kinds: Sequence[str] | None = None
    exclude_kinds: Sequence[str] | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    entity_keys_any: Sequence[str] | None = None
    meta: Sequence[MetaCondition] = ()
    include_deleted: bool = False


@dataclass(frozen=True, slots=True)
class VectorHit:
    id: uuid.UUID
    score: float
    agent_id: str
    created_at: datetime
    kind: str


@dataclass(frozen=True, slots=True)
class VectorRecord:
    """One point as reconciliation sees it (no vector)."""

    id: uuid.UUID
    agent_id: str
    content_hash: str
    deleted: bool
    model_id: str


@runtime_checkable
class VectorStore(Protocol):
    name: str  # "qdrant" in reports, whichever implementation

    def ensure_collection(self, model: EmbeddingModelInfo, *, activate_if_none: bool = True) -> str:
        """Create the versioned collection for ``model`` with its payload indexes if absent.

        Returns the collection name. When no collection is active yet and ``activate_if_none``,
        points the ``memories`` alias at it.
        """
        ...

    def active_model(self) -> EmbeddingModelInfo | None:
        """The model behind the ``memories`` alias (None when nothing is active yet)."""
        ...

    def activate(self, model_id: str) -> None:
        """Atomically point the alias at the collection for ``model_id``."""
        ...

    def collections(self) -> list[CollectionInfo]: ...

    def drop_collection(self, model_id: str) -> None: ...

    def upsert(self, points: Sequence[VectorPoint], *, model_id: str | None = None) -> None:
        """Idempotent by point id. ``model_id`` None writes to the active collection."""
        ...

    def set_deleted(self, ids: Sequence[uuid.UUID], deleted: bool = True, *, model_id: str | None = None) -> None: ...

    def delete(self, ids: Sequence[uuid.UUID], *, model_id: str | None = None) -> None:
        """Purge points for good."""
        ...

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
        """Nearest neighbours under ``flt``. ``model_id`` must equal the active model's id:

        the query vector was made by that model, and searching another model's collection is
        refused (``StoreError``) even when dimensions match. ``inactive_ok`` searches the collection
        of ``model_id`` even though it is not active: only ``migrate`` sets it, to measure recall
        on the new collection before the swap (the vector is still from that collection's model).
        """
        ...

    def scroll(
        self, *, agent_id: str | None = None, model_id: str | None = None, batch: int = 1000
    ) -> Iterator[list[VectorRecord]]:
        """Every point, page by page, without vectors, in ascending id order.

        The order is part of the contract: UUID byte order, which is PostgreSQL's ``uuid`` order, so
        reconciliation can merge-join the stores' pages without loading any id set into memory.
        """
        ...

    def count(self, *, agent_id: str | None = None, model_id: str | None = None) -> int: ...

    def ping(self) -> dict[str, Any]:
        """Cheap liveness probe; returns details for ``health`` (version, collection, …)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class GraphEntity:
    key: str  # memoryctl.model.entity_key(...)
    type: str  # validated identifier
    name: str


@dataclass(frozen=True, slots=True)
class GraphEdge:
    """A typed edge between two nodes; a node is an entity key or a memory id."""

    source: str | uuid.UUID
    type: str  # validated by memoryctl.model.validate_relation_type (any identifier of that shape)
    target: str | uuid.UUID


@dataclass(frozen=True, slots=True)
class GraphMemory:
    """What the graph keeps per memory: the node, its MENTIONS, and its typed relations."""

    id: uuid.UUID
    agent_id: str
    created_at: datetime
    deleted: bool
    entities: Sequence[GraphEntity]  # every entity node this memory touches (mentions + relation ends)
    mentions: Sequence[str]  # entity keys
    edges: Sequence[GraphEdge]


@dataclass(frozen=True, slots=True)
class GraphTraversal:
    """A structured graph filter: from an entity, along allowed relation types, up to ``hops``.

    Returns the memories reached: a memory node on the path, or a memory that MENTIONS an entity
    on the path (so "memories connected to Alice within 2 hops").
    """

    agent_id: str | None
    start_key: str
    relation_types: Sequence[str] = ()  # empty = any type
    hops: int = 1  # 1..MAX_HOPS (memoryctl.query_terms)
    direction: Direction = "both"
    limit: int | None = None
    # Restrict the memories returned (not the path) to [created_from, created_to), and order them
    # newest first instead of nearest first: a graph-only query then needs no other store.
    created_from: datetime | None = None
    created_to: datetime | None = None
    newest_first: bool = False


@dataclass(frozen=True, slots=True)
class GraphRecord:
    id: uuid.UUID
    agent_id: str
    deleted: bool


class GraphIdentity(Protocol):
    """What a graph store, and each engine's backend under it, says about itself."""

    @property
    def name(self) -> str:
        """The graph's name in reports: "neo4j" (the cluster profile), "graph" (the embedded one)."""
        ...

    @property
    def engine(self) -> str:
        """Which engine implements it ("neo4j", "postgres-sql"), for ``ping`` and messages."""
        ...

    @property
    def cheap_membership(self) -> bool:
        """connected() at one hop costs per candidate, not per reachable memory."""
        ...


@runtime_checkable
class GraphStore(GraphIdentity, Protocol):
    def ensure_schema(self) -> None: ...

    def upsert_memories(self, items: Sequence[GraphMemory]) -> None:
        """Idempotent by memory id / entity key; replaces the memory's outgoing relations."""
        ...

    def set_deleted(self, ids: Sequence[uuid.UUID], deleted: bool = True) -> None: ...

    def delete(self, ids: Sequence[uuid.UUID]) -> None:
        """Purge memory nodes and their edges; entity nodes left with no edges go too."""
        ...

    def traverse(self, query: GraphTraversal) -> list[uuid.UUID]:
        """Memory ids reached (never soft-deleted ones)."""
        ...

    def fanout(self, query: GraphTraversal) -> int:
        """A cheap estimate of how many memories ``traverse(query)`` reaches, without traversing.

        The larger of the start entity's degree over the allowed types and the number of memories
        that mention it (Neo4j answers both from its degree counts). Not the sum: an author's
        memories usually both mention and are AUTHORED by her. The planner uses it to pick
        graph-first or vector-first and to size the vector-first top K; never to filter.
        """
        ...

    def near_entities(self, query: GraphTraversal) -> frozenset[str] | None:
        """Opaque handles of the entities one hop from the start (None: not offered for this query).

        Independent of any candidate, so the engine fetches it while the vector search runs and
        hands it to ``connected``, which then needs no second expansion of a dense start entity.
        """
        ...

    def connected(
        self, query: GraphTraversal, ids: Sequence[uuid.UUID], *, near: frozenset[str] | None = None
    ) -> set[uuid.UUID]:
        """The subset of ``ids`` that ``traverse(query)`` reaches (its limit, window and order ignored).

        Answers "are these few memories reachable?" without enumerating everything reachable: the
        vector-first plan checks a few hundred candidates against a start entity with tens of
        thousands of memories. ``near``: what ``near_entities(query)`` returned, if already known.
        """
        ...

    def relationships(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[dict[str, Any]]]:
        """Per memory, its edges as ``{"type", "direction", "node": {...}}`` for query results."""
        ...

    def scroll(self, *, agent_id: str | None = None, batch: int = 1000) -> Iterator[list[GraphRecord]]:
        """Every memory node, keyset pages in ascending id order (the same order as the vector store's)."""
        ...

    def count(self, *, agent_id: str | None = None) -> int: ...

    def ping(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class CypherReader(Protocol):
    """Caller-written Cypher, read-only (``memoryctl cypher``; ``stores.cypher_sandbox``). Only a
    Neo4j graph offers one; every refusal is a ``UsageError`` saying what was refused."""

    def run_read(
        self, cypher: str, params: dict[str, Any] | None = None, agent_id: str | None = None, *, limit: int = 1000
    ) -> list[dict[str, Any]]:
        """At most ``limit`` rows of ``cypher`` run in a read transaction; with ``agent_id`` the query
        gets ``$agent_id`` bound and must use it."""
        ...


class OpenedStores(Protocol):
    """The stores a composition root (``memoryctl.stack.Stack``) opened, as their users see them:
    PostgreSQL's records always; the vector store and the graph when they could be opened (else
    ``None``, and ``unavailable`` says why). The write path and the maintenance jobs each declare
    what they take besides."""

    unavailable: dict[str, str]  # store name -> why it could not be opened
    store_names: dict[str, str]  # "vector"/"graph" -> the store's name in reports

    @property
    def records(self) -> RecordStore: ...

    def vectors(self) -> VectorStore | None: ...

    def graph(self) -> GraphStore | None: ...
