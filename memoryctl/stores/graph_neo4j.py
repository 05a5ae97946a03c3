"""The graph in Neo4j (the cluster profile), through the official Python driver over Bolt.

A ``GraphBackend`` (``graph_core``): validation, write chunking, relationship assembly and paging
are ``GraphCore``'s, the semantics (origin-tracked edges, traversal rules, ordering, purge of
orphan entities) ``graph_semantics``'; the integration tests run the same cases against this and
``SqlGraphStore``. This module only turns them into Cypher. Caller-written Cypher (``memoryctl
cypher``) is not this module's: ``cypher_sandbox`` checks and runs it over ``Neo4jBackend.read``.

Why the Cypher looks the way it does:

- Values are always parameters. Cypher cannot parameterise relationship types, labels or the bounds
  of a variable-length pattern, so those are spliced in as literals -- and only after validation:
  relationship types must have the documented identifier shape (checked right where they are
  spliced, and backquoted),
  labels come from a constant map, hops is an ``int`` in 1..3.
- Writes are batched with ``UNWIND``, one statement per (relationship type, endpoint labels) group,
  in bounded transactions (``WRITE_ROWS`` memories + edges each; one that times out is retried in
  halves), and their cost is linear whatever the degree of the entities they touch: edges are
  CREATEd after the memory's old declarations are dropped, never MERGEd (see ``_UPSERT_MEMORIES``).
- Every edge carries ``origin`` (the memory that declared it), indexed per relationship type (the
  index is created the first time a type is written as a remote edge: the set is open), so a
  re-upsert replaces exactly that memory's declarations, and a shared edge survives either owner.
- Every call has a deadline: the driver's connection/acquisition timeouts and a server-side
  transaction timeout; managed transactions retry transient failures only within the same budget.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from typing import Any, TypeVar

import neo4j
from neo4j import exceptions as nx

from memoryctl.errors import BadRecord, InputError, StoreError, StoreTimeout, StoreUnavailable
from memoryctl.model import RELATION_TYPE_SHAPE
from memoryctl.stores import names
from memoryctl.stores.graph_core import GraphCore, RelationshipRow
from memoryctl.stores.graph_semantics import PreparedBatch, PreparedEdge, node_ref
from memoryctl.stores.protocols import GraphRecord, GraphTraversal

T = TypeVar("T")
# Rows (memories + the edges they declare) per write transaction. Writes cost O(rows) (see
# ``_UPSERT_MEMORIES``); benchmarks/graph_write.py measured ~150 µs per row on 2 cores at load 9
# (hubs of degree 1k-100k alike), so a full transaction takes well under the default 5 s timeout.
# One that still times out (a slow disk, a busy server) is split in halves and retried.
WRITE_ROWS = 4000

# Labels and key properties by "is this endpoint a memory": constants, never input.
_NODE = {True: ("Memory", "id"), False: ("Entity", "key")}
# A transaction ended by the server: past its timeout (while running, or while waiting for a lock),
# or terminated by an operator. Writes retry these in smaller pieces (``_split_on_timeout``).
_TERMINATED = frozenset(
    {
        "Neo.ClientError.Transaction.TransactionTimedOut",
        "Neo.ClientError.Transaction.TransactionTimedOutClientConfiguration",
        "Neo.ClientError.Transaction.LockClientStopped",
        "Neo.TransientError.Transaction.Terminated",
        "Neo.TransientError.Transaction.LockClientStopped",
    }
)
# Neo4j refused the values of this write, not the store or the statement: the record is set aside
# by delivery (memoryctl.errors.BadRecord) instead of holding back every other one.
_DATA_ERRORS = frozenset(
    {
        "Neo.ClientError.Statement.TypeError",
        "Neo.ClientError.Statement.ArgumentError",
        "Neo.ClientError.Schema.ConstraintValidationFailed",
    }
)
_ARROWS = {"out": ("-", "->"), "in": ("<-", "-"), "both": ("-", "-")}
_REVERSED = {"out": "in", "in": "out", "both": "both"}


def _rel(rel_type: str) -> str:
    """The one place a relationship type becomes Cypher text: checked, then backquoted (so a type
    that happens to be a Cypher keyword is still a name)."""
    if not isinstance(rel_type, str) or not RELATION_TYPE_SHAPE.match(rel_type):
        raise InputError(f"invalid relationship type {rel_type!r}")
    return f"`{rel_type}`"


# Writing a memory replaces the edges it declared. The memory nodes are merged first: MERGE locks
# each node (rows sorted by id, so concurrent writers of the same memories queue rather than
# deadlock), and the remote types declared last time are read before they are replaced. Then the
# old declarations are dropped and the new ones CREATEd. Never MERGE an edge here: MERGE of
# ``(a)-[r:T {origin: $o}]->(b)`` makes the planner choose between expanding ``a``/``b`` and the
# ``origin`` index, by statistics. On a server whose graph holds few edges of T (one that served a
# test suite, or a first import), it chose a full scan of that index per row: quadratic in the
# batch and linear in the graph (PROFILE: 25M db hits, 138 s for 5,000 AUTHORED rows; issue 16).
# After the drop, under the memory's lock, none of the memory's edges exist: CREATE needs no lookup.
_UPSERT_MEMORIES = (
    "UNWIND $rows AS m MERGE (n:Memory {id: m.id}) "
    "WITH n, m, coalesce(n.remote_types, []) AS old "
    "SET n.agent_id = m.agent_id, n.created_at = m.created_at, n.deleted = m.deleted, "
    "n.remote_types = m.remote_types "
    "WITH old UNWIND old AS t RETURN DISTINCT t"
)
# Dropping the edges a memory declared, cheaply: most touch the memory node itself (its MENTIONS,
# ``Alice -AUTHORED-> this``) and are found by expanding from it. The others ("remote" edges, e.g.
# ``Alice -KNOWS-> Bob``) are found through the per-type ``origin`` index, but only for the types
# the memory recorded in ``remote_types`` when it declared them -- usually none. The hints pin the
# plans to those two access paths whatever the statistics say.
_DROP_NEAR = (
    "UNWIND $ids AS mid MATCH (m:Memory {id: mid})-[r]-(x) USING INDEX m:Memory(id) WHERE r.origin = mid "
    "DELETE r RETURN elementId(x) AS a, elementId(x) AS b"
)


def _drop_remote_cypher(rel_type: str) -> str:
    rel = _rel(rel_type)
    return (
        f"UNWIND $ids AS mid MATCH (a)-[r:{rel} {{origin: mid}}]->(b) USING INDEX r:{rel}(origin) "
        "DELETE r RETURN elementId(a) AS a, elementId(b) AS b"
    )


# The remote types a memory declared (``delete`` needs them; ``upsert`` reads them while merging).
_REMOTE_TYPES = (
    "UNWIND $ids AS mid MATCH (m:Memory {id: mid}) UNWIND coalesce(m.remote_types, []) AS t RETURN DISTINCT t"
)
_UPSERT_ENTITIES = (
    "UNWIND $rows AS e MERGE (n:Entity {key: e.key}) SET n.name = e.name, n.type = e.type, n.agent_id = e.agent_id"
)
# Entities left without any edge go; so do memory placeholders (created by an edge pointing at a
# memory whose own upsert had not arrived) that nothing points at any more. Real memories stay.
_PURGE_ORPHANS = (
    "UNWIND $eids AS eid MATCH (n) WHERE elementId(n) = eid "
    "AND (n:Entity OR (n:Memory AND n.agent_id IS NULL)) AND NOT (n)--() DELETE n"
)
_DELETE_MEMORIES = (
    "UNWIND $ids AS mid MATCH (m:Memory {id: mid}) "
    "OPTIONAL MATCH (m)--(x) WHERE x <> m "
    "WITH m, collect(DISTINCT elementId(x)) AS near "
    "DETACH DELETE m RETURN near"
)
_NODE_OK = (
    "x.agent_id IS NOT NULL AND ($agent IS NULL OR x.agent_id = $agent) "
    "AND NOT (x:Memory AND coalesce(x.deleted, false))"
)
_TRAVERSE = """
MATCH (s:Entity {key: $start})
WHERE s.agent_id IS NOT NULL AND ($agent IS NULL OR s.agent_id = $agent)
OPTIONAL MATCH p = (s)%(left)s[%(types)s*1..%(hops)d]%(right)s(n)
WHERE all(x IN nodes(p) WHERE %(node_ok)s)
WITH s, n, min(length(p)) AS d
WITH s, collect(CASE WHEN n IS NULL THEN null ELSE {n: n, d: d} END) AS found
UNWIND found + [{n: s, d: 0}] AS r
WITH r.n AS n, min(r.d) AS d
CALL (n, d) {
  WITH n, d WHERE n:Memory
  RETURN n.id AS id, d AS dist, n.created_at AS ts
  UNION ALL
  MATCH (m:Memory)-[:MENTIONS]->(n:Entity)
  WHERE m.agent_id IS NOT NULL AND NOT coalesce(m.deleted, false) AND ($agent IS NULL OR m.agent_id = $agent)
  RETURN m.id AS id, d + 1 AS dist, m.created_at AS ts
}
WITH id, ts, min(dist) AS dist
WHERE ($from IS NULL OR ts >= $from) AND ($to IS NULL OR ts < $to)
ORDER BY %(order)s
%(limit)s
RETURN collect(id) AS ids
"""
# Whitelisted orders (the only Cypher text a traversal chooses): nearest first, or newest first.
_ORDER = {False: "dist, id", True: "ts DESC, id"}
# Degree lookups only (COUNT of a one-relationship pattern is answered from the node's degree store);
# see GraphStore.fanout for why the larger of the two and not their sum.
_FANOUT = """
MATCH (s:Entity {key: $start})
WHERE s.agent_id IS NOT NULL AND ($agent IS NULL OR s.agent_id = $agent)
WITH COUNT { (s)%(left)s[%(types)s]%(right)s() } AS along, COUNT { (s)<-[:MENTIONS]-() } AS mentioned
RETURN CASE WHEN along > mentioned THEN along ELSE mentioned END AS n
"""
# ``connected``: the reachability of _TRAVERSE, asked of given candidates. A memory is reached when
# it mentions s, lies on a path from s, or mentions an entity on such a path. Measured on the
# 100k benchmark graph (top author: 20k AUTHORED): any var-length pattern between two bound nodes
# is expanded from the start node named first, and from a dense s that is the whole traversal
# again (42 s for 400 candidates); from the candidate's side it is cheap, except for the entities it
# mentions, which are often dense themselves (other authors: 4.7M db hits). Hence, for one hop:
#   _CONNECTED_1: per candidate, expand-into checks (Neo4j expands from the smaller side), and for
#     the rest the entities they mention;
#   _NEAR_ENTITIES_1: one expansion of s (its degree, ~70 ms at 20k) keeping those entities only.
# More hops: the general form below, expanding from the candidate (and mentioned entity) side.
# The start entity and the live candidates of this agent: the head of both forms below.
_CANDIDATES = """
MATCH (s:Entity {key: $start})
WHERE s.agent_id IS NOT NULL AND ($agent IS NULL OR s.agent_id = $agent)
UNWIND $ids AS mid
MATCH (m:Memory {id: mid})
WHERE m.agent_id IS NOT NULL AND ($agent IS NULL OR m.agent_id = $agent) AND NOT coalesce(m.deleted, false)
"""
_CONNECTED_1 = (
    _CANDIDATES
    + """
WITH s, m,
     EXISTS { MATCH (m)-[:MENTIONS]->(s) } OR EXISTS { MATCH (s)%(left)s[%(types)s]%(right)s(m) } AS direct
OPTIONAL MATCH (m)-[:MENTIONS]->(n:Entity)
WHERE NOT direct AND n <> s AND n.agent_id IS NOT NULL AND ($agent IS NULL OR n.agent_id = $agent)
WITH m, direct, collect(elementId(n)) AS via
RETURN collect(CASE WHEN direct THEN m.id END) AS direct,
       collect(CASE WHEN NOT direct AND size(via) > 0 THEN [m.id, via] END) AS rest
"""
)
_NEAR_ENTITIES_1 = """
MATCH (s:Entity {key: $start})
WHERE s.agent_id IS NOT NULL AND ($agent IS NULL OR s.agent_id = $agent)
MATCH (s)%(left)s[%(types)s]%(right)s(x:Entity)
WHERE ($eids IS NULL OR elementId(x) IN $eids) AND x.agent_id IS NOT NULL AND ($agent IS NULL OR x.agent_id = $agent)
RETURN collect(DISTINCT elementId(x)) AS near
"""
_CONNECTED = (
    _CANDIDATES
    + """  AND (EXISTS { MATCH (m)-[:MENTIONS]->(s) }
    OR EXISTS { MATCH p = (m)%(rleft)s[%(types)s*1..%(hops)d]%(rright)s(s) WHERE all(x IN nodes(p) WHERE %(node_ok)s) }
    OR EXISTS {
      MATCH (m)-[:MENTIONS]->(n:Entity)
      WHERE n <> s AND n.agent_id IS NOT NULL AND ($agent IS NULL OR n.agent_id = $agent)
      MATCH p = (n)%(rleft)s[%(types)s*1..%(hops)d]%(rright)s(s)
      WHERE all(x IN nodes(p) WHERE %(node_ok)s)
    })
RETURN collect(m.id) AS ids
"""
)
_RELATIONSHIPS = """
UNWIND $ids AS mid
MATCH (m:Memory {id: mid})-[r]-(x)
WHERE NOT (x:Memory AND coalesce(x.deleted, false))
RETURN DISTINCT mid, type(r) AS type, CASE WHEN startNode(r) = m THEN 'out' ELSE 'in' END AS direction,
       x:Memory AS is_memory, x.id AS xid, x.key AS key, x.type AS etype, x.name AS name
"""
_SCHEMA = [
    "CREATE CONSTRAINT memory_id IF NOT EXISTS FOR (m:Memory) REQUIRE m.id IS UNIQUE",
    "CREATE CONSTRAINT entity_key IF NOT EXISTS FOR (e:Entity) REQUIRE e.key IS UNIQUE",
    "CREATE INDEX memory_agent IF NOT EXISTS FOR (m:Memory) ON (m.agent_id)",
    "CREATE INDEX entity_agent IF NOT EXISTS FOR (e:Entity) ON (e.agent_id)",
]


def _origin_index_cypher(rel_type: str) -> str:
    return f"CREATE INDEX rel_origin_{rel_type.lower()} IF NOT EXISTS FOR ()-[r:{_rel(rel_type)}]-() ON (r.origin)"


def _terminated(exc: Exception) -> bool:
    """Did the server end this transaction for running out of time (or an operator stop it)?"""
    code = getattr(exc, "code", None) or ""
    return code in _TERMINATED or code.endswith(("TimedOut", "Timeout"))


class Neo4jBackend:
    """The Cypher primitives of ``GraphBackend`` on Neo4j 5 (Bolt), and ``read``, the one place a
    read transaction is opened (``cypher_sandbox`` runs caller-written Cypher through it)."""

    name = names.NEO4J
    engine = "neo4j"
    cheap_membership = True  # connected() at one hop: per candidate plus one expansion of s
    write_rows = WRITE_ROWS

    def __init__(
        self, uri: str, *, user: str = "neo4j", password: str | None, database: str = "neo4j", timeout_s: float = 5.0
    ) -> None:
        self.uri, self.database = uri, database
        self.timeout = float(timeout_s)
        self._origin_indexes: set[str] = set()  # relationship types whose origin index exists
        try:
            self.driver = neo4j.GraphDatabase.driver(
                uri,
                auth=(user, password) if password is not None else None,
                connection_timeout=self.timeout,
                connection_acquisition_timeout=self.timeout,
                max_transaction_retry_time=self.timeout,
                max_connection_pool_size=16,
                notifications_min_severity="OFF",
            )
        except (nx.ConfigurationError, ValueError) as exc:
            raise StoreError(self.name, f"invalid Neo4j settings: {exc}", hint="check neo4j.uri") from exc

    # -- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Map driver failures onto memoryctl's errors (StoreUnavailable = degrade, not crash)."""
        hint = (
            f"check that Neo4j is running and reachable at {self.uri} (memoryctl health; neo4j.uri / neo4j.timeout_s)"
        )
        try:
            yield
        except (nx.ServiceUnavailable, nx.SessionExpired, nx.ConnectionPoolError, nx.TransientError) as exc:
            if _terminated(exc):
                raise StoreTimeout(self.name, f"{what}: timed out after {self.timeout}s", hint=hint) from exc
            raise StoreUnavailable(self.name, f"{what}: Neo4j unavailable ({exc})", hint=hint) from exc
        except nx.AuthError as exc:
            raise StoreError(
                self.name,
                f"{what}: authentication failed ({exc.message})",
                hint="set neo4j.user / neo4j.password (MEMORYCTL_NEO4J__PASSWORD)",
            ) from exc
        except nx.Neo4jError as exc:
            if _terminated(exc):
                raise StoreTimeout(self.name, f"{what}: timed out after {self.timeout}s", hint=hint) from exc
            kind = BadRecord if exc.code in _DATA_ERRORS else StoreError
            raise kind(self.name, f"{what}: {exc.code}: {exc.message}") from exc
        except nx.DriverError as exc:
            raise StoreError(self.name, f"{what}: {exc}") from exc
        except (TimeoutError, OSError) as exc:
            raise StoreUnavailable(self.name, f"{what}: {exc}", hint=hint) from exc

    def _session(self, mode: str = neo4j.WRITE_ACCESS) -> neo4j.Session:
        return self.driver.session(database=self.database, default_access_mode=mode)

    def _write(self, what: str, fn: Callable[[neo4j.ManagedTransaction], T]) -> T:
        with self._errors(what), self._session() as session:
            return session.execute_write(neo4j.unit_of_work(timeout=self.timeout)(fn))

    def read(self, what: str, fn: Callable[[neo4j.ManagedTransaction], T]) -> T:
        """``fn`` in a READ transaction under the store's timeout; driver failures mapped."""
        with self._errors(what), self._session(neo4j.READ_ACCESS) as session:
            return session.execute_read(neo4j.unit_of_work(timeout=self.timeout)(fn))

    # -- GraphBackend -----------------------------------------------------------------------

    def ensure_schema(self) -> None:
        """Constraints and indexes; schema commands need auto-commit transactions, one each."""
        with self._errors("ensure_schema"), self._session() as session:
            for stmt in _SCHEMA:
                session.run(neo4j.Query(stmt, timeout=max(self.timeout, 30.0))).consume()

    def upsert(self, batch: PreparedBatch) -> None:
        groups: dict[tuple[str, bool, bool], list[dict[str, Any]]] = {}
        remote: dict[str, set[str]] = {m["id"]: set() for m in batch.memories}
        for e in batch.edges:
            if e.origin not in (e.src, e.dst):
                remote[e.origin].add(e.type)
            groups.setdefault((e.type, e.src_is_memory, e.dst_is_memory), []).append(_edge_row(e))
        memories = sorted(
            ({**m, "remote_types": sorted(remote[m["id"]])} for m in batch.memories), key=lambda m: str(m["id"])
        )
        entities = sorted(batch.entities, key=lambda e: e["key"])
        self._ensure_origin_indexes(set().union(*remote.values()))

        def work(tx: neo4j.ManagedTransaction) -> None:
            old_types = [rec["t"] for rec in tx.run(_UPSERT_MEMORIES, rows=memories)]
            if entities:
                tx.run(_UPSERT_ENTITIES, rows=entities).consume()
            touched = _drop_declared(tx, batch.ids, old_types)
            for (rel_type, src_mem, dst_mem), rows in sorted(groups.items()):
                tx.run(_create_edges_cypher(rel_type, src_mem, dst_mem), rows=rows).consume()
            if touched:
                tx.run(_PURGE_ORPHANS, eids=sorted(touched)).consume()

        self._write("upsert_memories", work)

    def _ensure_origin_indexes(self, types: set[str]) -> None:
        """The ``origin`` index of each relationship type used in a remote edge, on first use.

        The set of types is open, so no fixed list of indexes can cover it. Schema commands cannot
        share a transaction with writes: each runs on its own before the write, then waits until
        the index is online (instant for a type nothing uses yet), because dropping remote edges
        pins its plan to that index. ``IF NOT EXISTS`` makes a race between two processes harmless;
        known types are remembered per store object.
        """
        new = sorted(types - self._origin_indexes)
        if not new:
            return
        with self._errors("ensure_origin_index"), self._session() as session:
            for t in new:
                session.run(neo4j.Query(_origin_index_cypher(t), timeout=max(self.timeout, 30.0))).consume()
                session.run("CALL db.awaitIndex($name, 30)", name=f"rel_origin_{t.lower()}").consume()
        self._origin_indexes.update(new)

    def set_deleted(self, ids: Sequence[str], deleted: bool) -> None:
        self._write(
            "set_deleted",
            lambda tx: tx.run(
                "UNWIND $ids AS mid MATCH (m:Memory {id: mid}) SET m.deleted = $deleted", ids=list(ids), deleted=deleted
            ).consume(),
        )

    def delete(self, ids: Sequence[str]) -> None:
        keys = list(ids)

        def work(tx: neo4j.ManagedTransaction) -> None:
            old_types = [rec["t"] for rec in tx.run(_REMOTE_TYPES, ids=keys)]
            touched = _drop_declared(tx, keys, old_types)
            for rec in tx.run(_DELETE_MEMORIES, ids=keys):
                touched.update(rec["near"])
            if touched:
                tx.run(_PURGE_ORPHANS, eids=sorted(touched)).consume()

        self._write("delete", work)

    def traverse(self, query: GraphTraversal) -> list[uuid.UUID]:
        q = query
        assert type(q.hops) is int and 1 <= q.hops <= 3
        cypher = _TRAVERSE % {
            **_fragments(q),
            "limit": "LIMIT $limit" if q.limit is not None else "",
            "order": _ORDER[q.newest_first],
        }
        params = {
            "start": q.start_key,
            "agent": q.agent_id,
            "limit": q.limit,
            "from": q.created_from,
            "to": q.created_to,
        }

        def work(tx: neo4j.ManagedTransaction) -> list[uuid.UUID]:
            # One record holding the ordered list, not one record per id: the Python driver costs
            # tens of microseconds per record, which made a 25,000-id traversal seconds instead of
            # a fraction of one (benchmarks/query.py; ``collect`` keeps the ORDER BY order).
            rec = tx.run(cypher, params).single()
            return [uuid.UUID(i) for i in rec["ids"]] if rec is not None else []

        return self.read("traverse", work)

    def fanout(self, query: GraphTraversal) -> int:
        cypher = _FANOUT % _fragments(query)

        def work(tx: neo4j.ManagedTransaction) -> int:
            rec = tx.run(cypher, {"start": query.start_key, "agent": query.agent_id}).single()
            return int(rec["n"]) if rec is not None else 0

        return self.read("fanout", work)

    def near_entities(self, query: GraphTraversal) -> frozenset[str] | None:
        if query.hops != 1:
            return None
        cypher = _NEAR_ENTITIES_1 % _fragments(query)

        def work(tx: neo4j.ManagedTransaction) -> frozenset[str]:
            rec = tx.run(cypher, {"start": query.start_key, "agent": query.agent_id, "eids": None}).single()
            return frozenset(rec["near"]) if rec is not None else frozenset()

        return self.read("near_entities", work)

    def connected(self, query: GraphTraversal, ids: list[str], near: frozenset[str] | None) -> set[uuid.UUID]:
        frags = _fragments(query)
        params: dict[str, Any] = {"start": query.start_key, "agent": query.agent_id, "ids": ids}

        def general(tx: neo4j.ManagedTransaction) -> set[uuid.UUID]:
            rec = tx.run(_CONNECTED % frags, params).single()
            return {uuid.UUID(i) for i in rec["ids"]} if rec is not None else set()

        def one_hop(tx: neo4j.ManagedTransaction) -> set[uuid.UUID]:
            rec = tx.run(_CONNECTED_1 % frags, params).single()
            if rec is None:
                return set()
            found = {uuid.UUID(i) for i in rec["direct"]}
            rest: list[tuple[str, list[str]]] = [(r[0], r[1]) for r in rec["rest"]]
            eids = sorted({e for _, via in rest for e in via})
            adjacent: AbstractSet[str] = near if near is not None else frozenset()
            if eids and near is None:
                near_rec = tx.run(_NEAR_ENTITIES_1 % frags, {**params, "eids": eids}).single()
                adjacent = set(near_rec["near"]) if near_rec is not None else set()
            found.update(uuid.UUID(mid) for mid, via in rest if not adjacent.isdisjoint(via))
            return found

        return self.read("connected", one_hop if query.hops == 1 else general)

    def relationship_rows(self, ids: list[str]) -> Iterable[RelationshipRow]:
        def work(tx: neo4j.ManagedTransaction) -> list[dict[str, Any]]:
            return [rec.data() for rec in tx.run(_RELATIONSHIPS, ids=ids)]

        for row in self.read("relationships", work):
            other = node_ref(row["xid"])[0] if row["is_memory"] else row["key"]
            yield row["mid"], row["type"], row["direction"], other, row["is_memory"], row["etype"], row["name"]

    def page(self, agent_id: str | None, after: uuid.UUID | None, batch: int) -> list[GraphRecord]:
        params = {"agent": agent_id, "after": str(after) if after is not None else "", "batch": batch}

        def work(tx: neo4j.ManagedTransaction) -> list[dict[str, Any]]:
            return [
                rec.data()
                for rec in tx.run(
                    "MATCH (m:Memory) WHERE m.id > $after AND m.agent_id IS NOT NULL"
                    " AND ($agent IS NULL OR m.agent_id = $agent)"
                    " RETURN m.id AS id, m.agent_id AS agent_id, coalesce(m.deleted, false) AS deleted"
                    " ORDER BY m.id LIMIT $batch",
                    params,
                )
            ]

        return [
            GraphRecord(id=uuid.UUID(r["id"]), agent_id=r["agent_id"], deleted=r["deleted"])
            for r in self.read("scroll", work)
        ]

    def count(self, agent_id: str | None) -> int:
        def work(tx: neo4j.ManagedTransaction) -> int:
            rec = tx.run(
                "MATCH (m:Memory) WHERE m.agent_id IS NOT NULL AND ($agent IS NULL OR m.agent_id = $agent)"
                " RETURN count(m) AS c",
                agent=agent_id,
            ).single()
            return int(rec["c"]) if rec else 0

        return self.read("count", work)

    def ping(self) -> dict[str, Any]:
        def work(tx: neo4j.ManagedTransaction) -> dict[str, Any]:
            comp = tx.run(
                "CALL dbms.components() YIELD name, versions, edition RETURN name, versions, edition"
            ).single()
            mem = tx.run("MATCH (m:Memory) RETURN count(m) AS c").single()
            ent = tx.run("MATCH (e:Entity) RETURN count(e) AS c").single()
            return {
                "engine": self.engine,
                "uri": self.uri,
                "database": self.database,
                "name": comp["name"] if comp else None,
                "version": (comp["versions"] or [None])[0] if comp else None,
                "edition": comp["edition"] if comp else None,
                "memories": int(mem["c"]) if mem else 0,
                "entities": int(ent["c"]) if ent else 0,
            }

        with self._errors("ping"):
            self.driver.verify_connectivity()
        return self.read("ping", work)

    def close(self) -> None:
        self.driver.close()


class Neo4jGraphStore(GraphCore):
    """``GraphStore`` on Neo4j 5 (Bolt): ``GraphCore`` over a ``Neo4jBackend``."""

    backend: Neo4jBackend

    def __init__(
        self, uri: str, *, user: str = "neo4j", password: str | None, database: str = "neo4j", timeout_s: float = 5.0
    ) -> None:
        super().__init__(Neo4jBackend(uri, user=user, password=password, database=database, timeout_s=timeout_s))


def _fragments(q: GraphTraversal) -> dict[str, Any]:
    left, right = _ARROWS[q.direction]
    rleft, rright = _ARROWS[_REVERSED[q.direction]]  # the same pattern written from the far end
    return {
        "left": left,
        "right": right,
        "rleft": rleft,
        "rright": rright,
        "types": ":" + "|".join(_rel(t) for t in q.relation_types) if q.relation_types else "",
        "hops": q.hops,
        "node_ok": _NODE_OK,
    }


def _drop_declared(tx: neo4j.ManagedTransaction, ids: list[str], old_types: Sequence[str]) -> set[str]:
    """Delete every edge the memories ``ids`` declared; return the element ids of their ends.

    ``old_types``: the remote edge types those memories recorded when they declared them.
    """
    touched = {v for rec in tx.run(_DROP_NEAR, ids=ids) for v in (rec["a"], rec["b"])}
    for rel_type in sorted(set(old_types)):
        touched.update(v for rec in tx.run(_drop_remote_cypher(rel_type), ids=ids) for v in (rec["a"], rec["b"]))
    return touched


def _edge_row(e: PreparedEdge) -> dict[str, Any]:
    return {"src": e.src, "dst": e.dst, "origin": e.origin, "agent_id": e.agent_id}


def _create_edges_cypher(rel_type: str, src_is_memory: bool, dst_is_memory: bool) -> str:
    src_label, src_key = _NODE[src_is_memory]
    dst_label, dst_key = _NODE[dst_is_memory]
    return (
        f"UNWIND $rows AS e "
        f"MERGE (a:{src_label} {{{src_key}: e.src}}) "
        f"MERGE (b:{dst_label} {{{dst_key}: e.dst}}) "
        f"CREATE (a)-[:{_rel(rel_type)} {{origin: e.origin, agent_id: e.agent_id}}]->(b)"
    )


__all__ = ["Neo4jBackend", "Neo4jGraphStore"]
