"""The composition root: which engine implements which store, decided once from the profile.

Nothing else in memoryctl chooses an implementation. Secondary stores are opened lazily and a
failure to open one is remembered (``unavailable``) instead of raised, so a write can still land in
PostgreSQL and a query can still answer, degraded, when Qdrant or Neo4j is down. A store that could
not be opened is tried again once :data:`REOPEN_AFTER_S` have passed: a resident process
(``memoryctl serve``) that started before Neo4j did — every boot of the cluster — would otherwise
answer degraded until it is restarted.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from functools import cached_property
from typing import TYPE_CHECKING, TypeVar

from memoryctl.config import Neo4jSettings, PostgresSettings, QdrantSettings, Settings, revealed
from memoryctl.errors import MemoryctlError, StoreUnavailable
from memoryctl.stores import names
from memoryctl.stores.events import EventLog
from memoryctl.stores.pg import EmbeddedPostgres, Pool, open_pool
from memoryctl.stores.records import RecordStore, RunLog
from memoryctl.stores.schema import apply_schema, schema_state

if TYPE_CHECKING:
    from memoryctl.embed import Embedder
    from memoryctl.extract import Extractor
    from memoryctl.stores.graph_neo4j import Neo4jGraphStore
    from memoryctl.stores.protocols import CypherReader, GraphStore, VectorStore
    from memoryctl.stores.vector_qdrant import QdrantVectorStore


REOPEN_AFTER_S = 15.0

S = TypeVar("S", "VectorStore", "GraphStore")


def _ensure_schema(store: GraphStore) -> None:
    store.ensure_schema()


class Stack:
    def __init__(self, settings: Settings, *, auto_migrate: bool = True) -> None:
        self.settings = settings
        self.auto_migrate = auto_migrate
        self.unavailable: dict[str, str] = {}
        self._embedded_pg: EmbeddedPostgres | None = None
        self._vectors: VectorStore | None = None
        self._graph: GraphStore | None = None
        self._cypher: CypherReader | None = None
        self._tried: set[str] = set()
        self._failed_at: dict[str, float] = {}  # when opening a secondary store last failed
        self._open_lock = {"vector": threading.Lock(), "graph": threading.Lock()}
        # Logical store names in reports: the embedded graph is SQL tables, not Neo4j.
        self.store_names = {
            "vector": names.QDRANT,
            "graph": names.NEO4J if settings.profile == "cluster" else names.SQL_GRAPH,
        }

    # ---- PostgreSQL (required) ----------------------------------------------------------------
    @cached_property
    def pool(self) -> Pool:
        s = self.settings
        if s.profile == "embedded":
            self._embedded_pg = EmbeddedPostgres(s.pg_dir)
            uri = self._embedded_pg.start()
            pool = postgres_pool(s.postgres, dsn=uri)
        else:
            pool = postgres_pool(s.postgres)
        if self.auto_migrate and not schema_state(pool):
            apply_schema(pool)
        return pool

    @cached_property
    def records(self) -> RecordStore:
        return RecordStore(self.pool, failover_wait_s=self.settings.postgres.failover_wait_s)

    @cached_property
    def runs(self) -> RunLog:
        return RunLog(self.pool)

    @cached_property
    def events(self) -> EventLog:
        return EventLog(self.pool)

    # ---- models -------------------------------------------------------------------------------
    @cached_property
    def embedder(self) -> Embedder:
        from memoryctl.embed import make_embedder
        from memoryctl.maintenance.models import effective_embedder_settings

        # The model `migrate` made active (recorded in PostgreSQL) wins over the config: see maintenance.models.
        return make_embedder(effective_embedder_settings(lambda: self.pool, self.settings.embedder))

    def reload_embedder(self) -> None:
        """Forget the cached embedder: after `migrate` swapped the active model, the next use
        builds the embedder for the model now recorded as active."""
        self.__dict__.pop("embedder", None)

    @cached_property
    def extractor(self) -> Extractor:
        from memoryctl.extract import make_extractor

        return make_extractor(self.settings.extractor, self.settings.vllm)

    # ---- secondary stores (optional at run time) ----------------------------------------------
    def _should_open(self, kind: str) -> bool:
        """Not tried yet, or the last try failed at least REOPEN_AFTER_S ago."""
        if kind not in self._tried:
            return True
        failed = self._failed_at.get(kind)
        return failed is not None and time.monotonic() - failed >= REOPEN_AFTER_S

    def _opened(self, kind: str, error: MemoryctlError | None) -> None:
        self._tried.add(kind)
        name = self.store_names[kind]
        if error is None:
            self._failed_at.pop(kind, None)
            self.unavailable.pop(name, None)
        else:
            self._failed_at[kind] = time.monotonic()
            self.unavailable[name] = error.message

    @staticmethod
    def _discard(store: VectorStore | GraphStore | None) -> None:
        """Close a store whose opening failed half-way (its client would leak on the next try)."""
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()

    @contextlib.contextmanager
    def _opening(self, kind: str) -> Iterator[bool]:
        """Whether this thread is to open ``kind`` now: it is due (``_should_open``) and no other
        thread is opening it. One opener at a time: in ``memoryctl serve`` the requests that came
        in while a store was down all found it due at once, and when one of their attempts failed
        after another had succeeded, the failure put None back and the success then cleared the
        failure's time, so the store was never tried again (the service answered "unavailable"
        for Qdrant until restarted: a fresh cluster's deploy test, 2026-12-03). A thread that
        finds another one opening answers with what there is now (degraded), as while it is down,
        instead of waiting for that attempt's timeouts; but the first opening of a store is waited
        for (parallel query legs or health probes of a process that just started would otherwise
        call a store that was never down "unavailable")."""
        first = kind not in self._tried
        if not self._should_open(kind) or not self._open_lock[kind].acquire(blocking=first):
            yield False
            return
        try:
            yield self._should_open(kind)  # the attempt that held the lock may just have finished
        finally:
            self._open_lock[kind].release()

    def _attempt(self, kind: str, open_store: Callable[[], S], ready: Callable[[S], None]) -> S | None:
        """One opening of ``kind`` (the caller holds its turn from ``_opening``): the store once
        ``ready`` accepted it, else None with the failure recorded; anything but a MemoryctlError (a
        bug, an interrupt) closes the half-opened client and propagates."""
        store: S | None = None
        try:
            store = open_store()
            ready(store)
        except MemoryctlError as exc:
            self._discard(store)
            self._opened(kind, exc)
            return None
        except BaseException:
            self._discard(store)
            raise
        return store

    def vectors(self) -> VectorStore | None:
        with self._opening("vector") as due:
            if due and (store := self._attempt("vector", self._open_vectors, self._ensure_collection)) is not None:
                self._vectors = store
                self._opened("vector", None)
        return self._vectors

    def graph(self) -> GraphStore | None:
        with self._opening("graph") as due:
            if due and (store := self._attempt("graph", self._open_graph, _ensure_schema)) is not None:
                self._graph = store
                self._opened("graph", None)
        return self._graph

    def _ensure_collection(self, store: VectorStore) -> None:
        store.ensure_collection(self.embedder.info)

    def _open_vectors(self) -> VectorStore:
        s = self.settings
        if s.profile == "embedded":
            from memoryctl.stores.vector_edge import EdgeVectorStore

            # The embedded profile: the shards live under the data directory.
            return EdgeVectorStore(
                s.vectors_dir, collection_prefix=s.qdrant.collection_prefix, meta_indexes=s.qdrant.indexed_metadata
            )
        return qdrant_vectors(s.qdrant)

    def _open_graph(self) -> GraphStore:
        s = self.settings
        if s.profile == "embedded":
            from memoryctl.stores.graph_sql import SqlGraphStore

            return SqlGraphStore(self.pool)
        from memoryctl.stores.cypher_sandbox import ReadOnlyCypher

        store = neo4j_graph(s.neo4j)
        self._cypher = ReadOnlyCypher(store.backend)
        return store

    def require_vectors(self) -> VectorStore:
        store = self.vectors()
        if store is None:
            raise StoreUnavailable(names.QDRANT, self.unavailable.get(names.QDRANT, "unavailable"))
        return store

    def cypher(self) -> CypherReader | None:
        """Caller-written read-only Cypher, on the graph this profile opened: Neo4j offers it,
        the embedded profile's SQL graph does not (None)."""
        self.require_graph()
        return self._cypher

    def require_graph(self) -> GraphStore:
        store = self.graph()
        if store is None:
            name = self.store_names["graph"]
            raise StoreUnavailable(name, self.unavailable.get(name, "unavailable"))
        return store

    def close(self) -> None:
        for store in (self._vectors, self._graph):
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()
        if "pool" in self.__dict__:
            self.pool.close()
        if self._embedded_pg is not None:
            self._embedded_pg.stop()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def neo4j_graph(settings: Neo4jSettings) -> Neo4jGraphStore:
    """The Neo4j graph store for ``[neo4j]``: the adapter gets its connection, not the settings."""
    from memoryctl.stores.graph_neo4j import Neo4jGraphStore

    password = settings.password.get_secret_value() if settings.password is not None else None
    return Neo4jGraphStore(
        settings.uri, user=settings.user, password=password, database=settings.database, timeout_s=settings.timeout_s
    )


# The adapters take what they need, not the settings: the config is mapped here, once.
def postgres_pool(settings: PostgresSettings, dsn: str | None = None) -> Pool:
    """The connection pool for ``[postgres]`` (``dsn``: the embedded server's, instead of the configured one)."""
    return open_pool(
        dsn or settings.conninfo(),
        password=revealed(settings.password),
        min_size=settings.pool_min,
        max_size=settings.pool_max,
        connect_timeout_s=settings.connect_timeout_s,
        statement_timeout_ms=settings.statement_timeout_ms,
        tcp_user_timeout_ms=settings.tcp_user_timeout_ms,
    )


def qdrant_vectors(settings: QdrantSettings) -> QdrantVectorStore:
    """The vector store on a Qdrant server (``url``) or qdrant-client's local mode (``path``)."""
    from memoryctl.stores.vector_qdrant import QdrantVectorStore

    return QdrantVectorStore(
        url=settings.url,
        path=settings.path,
        api_key=revealed(settings.api_key),
        timeout_s=settings.timeout_s,
        alias=settings.alias,
        collection_prefix=settings.collection_prefix,
        meta_indexes=settings.indexed_metadata,
        layout=settings.collection_layout(),
    )
