"""The graph in Neo4j (the cluster profile), through the official Python driver over Bolt.

Semantics (origin-tracked edges, traversal rules, ordering, purge of orphan entities) are defined
once in ``memoryctl.stores.graph_sql`` and shared with ``SqlGraphStore``; the integration tests run
the same cases against both. This module only turns them into Cypher.

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

import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from itertools import islice
from typing import Any, TypeVar

import neo4j
from neo4j import exceptions as nx

from memoryctl.config import Neo4jSettings
from memoryctl.errors import BadRecord, InputError, StoreError, StoreTimeout, StoreUnavailable, UsageError
from memoryctl.model import RELATION_TYPE_SHAPE, validate_agent_id
from memoryctl.stores import names
from memoryctl.stores.graph_semantics import (
    CheckedTraversal,
    PreparedEdge,
    check_ids,
    check_page,
    check_traversal,
    node_ref,
    prepare_batch,
    relationship,
    relationship_sort_key,
)
from memoryctl.stores.protocols import GraphMemory, GraphRecord, GraphTraversal

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
_LOAD_CSV = re.compile(r"\bLOAD\s+CSV\b", re.IGNORECASE)
# Procedures a read-only power-user query may call: those the server itself declares READ-mode
# (``SHOW PROCEDURES``), plus ``dbms.components`` (a version probe). Community Edition has no roles,
# and DBMS-mode procedures (``dbms.killConnections``, ``dbms.listConfig``, ``db.clearQueryCaches``,
# ...) run even in a READ transaction, so the plan is inspected before the query runs.
_EXTRA_PROCEDURES = frozenset({"dbms.components"})
_READ_ONLY = (
    "run_read runs in a read-only transaction, and this query writes "
    "(CREATE, MERGE, DELETE, SET, REMOVE, schema or write procedures are refused)"
)
_WRITE_HINT = "use memoryctl's write commands to change the graph"
_PROCEDURE_MODES = "SHOW PROCEDURES YIELD name, mode RETURN collect([name, mode]) AS modes"


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


def _native(value: Any) -> Any:
    """Driver values -> plain Python (neo4j.time -> datetime, graph objects -> dicts)."""
    if isinstance(value, neo4j.graph.Node):
        return {"labels": sorted(value.labels), **{k: _native(v) for k, v in value.items()}}
    if isinstance(value, neo4j.graph.Relationship):
        return {"type": value.type, **{k: _native(v) for k, v in value.items()}}
    if isinstance(value, neo4j.graph.Path):
        return {"nodes": [_native(n) for n in value.nodes], "relationships": [_native(r) for r in value.relationships]}
    if isinstance(value, list):
        return [_native(v) for v in value]
    if isinstance(value, dict):
        return {k: _native(v) for k, v in value.items()}
    to_native = getattr(value, "to_native", None)
    return to_native() if callable(to_native) else value


def _terminated(exc: Exception) -> bool:
    """Did the server end this transaction for running out of time (or an operator stop it)?"""
    code = getattr(exc, "code", None) or ""
    return code in _TERMINATED or code.endswith(("TimedOut", "Timeout"))


def _plan_operators(plan: Any) -> Iterator[tuple[str, str]]:
    """(operatorType, details) for every operator of an EXPLAIN plan (a dict tree from the driver)."""
    if not isinstance(plan, dict):
        return
    args = plan.get("args") or {}
    yield str(plan.get("operatorType", "")), str(args.get("Details", ""))
    for child in plan.get("children") or ():
        yield from _plan_operators(child)


class Neo4jGraphStore:
    """``GraphStore`` on Neo4j 5 (Bolt). Also offers ``run_read`` for read-only power-user Cypher."""

    name = names.NEO4J
    engine = "neo4j"
    cheap_membership = True  # connected() at one hop: per candidate plus one expansion of s

    def __init__(self, settings: Neo4jSettings) -> None:
        self._settings = settings
        self._timeout = float(settings.timeout_s)
        self._modes: dict[str, str] | None = None
        self._origin_indexes: set[str] = set()  # relationship types whose origin index exists
        password = settings.password.get_secret_value() if settings.password is not None else None
        try:
            self._driver = neo4j.GraphDatabase.driver(
                settings.uri,
                auth=(settings.user, password) if password is not None else None,
                connection_timeout=self._timeout,
                connection_acquisition_timeout=self._timeout,
                max_transaction_retry_time=self._timeout,
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
            f"check that Neo4j is running and reachable at {self._settings.uri} "
            "(memoryctl health; neo4j.uri / neo4j.timeout_s)"
        )
        try:
            yield
        except (nx.ServiceUnavailable, nx.SessionExpired, nx.ConnectionPoolError, nx.TransientError) as exc:
            if _terminated(exc):
                raise StoreTimeout(self.name, f"{what}: timed out after {self._timeout}s", hint=hint) from exc
            raise StoreUnavailable(self.name, f"{what}: Neo4j unavailable ({exc})", hint=hint) from exc
        except nx.AuthError as exc:
            raise StoreError(
                self.name,
                f"{what}: authentication failed ({exc.message})",
                hint="set neo4j.user / neo4j.password (MEMORYCTL_NEO4J__PASSWORD)",
            ) from exc
        except nx.Neo4jError as exc:
            if _terminated(exc):
                raise StoreTimeout(self.name, f"{what}: timed out after {self._timeout}s", hint=hint) from exc
            kind = BadRecord if exc.code in _DATA_ERRORS else StoreError
            raise kind(self.name, f"{what}: {exc.code}: {exc.message}") from exc
        except nx.DriverError as exc:
            raise StoreError(self.name, f"{what}: {exc}") from exc
        except (TimeoutError, OSError) as exc:
            raise StoreUnavailable(self.name, f"{what}: {exc}", hint=hint) from exc

    def _session(self, mode: str = neo4j.WRITE_ACCESS) -> neo4j.Session:
        return self._driver.session(database=self._settings.database, default_access_mode=mode)

    def _write(self, what: str, fn: Callable[[neo4j.ManagedTransaction], T]) -> T:
        with self._errors(what), self._session() as session:
            return session.execute_write(neo4j.unit_of_work(timeout=self._timeout)(fn))

    def _read(self, what: str, fn: Callable[[neo4j.ManagedTransaction], T]) -> T:
        with self._errors(what), self._session(neo4j.READ_ACCESS) as session:
            return session.execute_read(neo4j.unit_of_work(timeout=self._timeout)(fn))

    # -- GraphStore -------------------------------------------------------------------------

    def ensure_schema(self) -> None:
        """Constraints and indexes; schema commands need auto-commit transactions, one each."""
        with self._errors("ensure_schema"), self._session() as session:
            for stmt in _SCHEMA:
                session.run(neo4j.Query(stmt, timeout=max(self._timeout, 30.0))).consume()

    def upsert_memories(self, items: Sequence[GraphMemory]) -> None:
        """Bounded transactions: at most ``WRITE_ROWS`` rows each, split further if one times out.

        Every memory is written whole or not at all (its node and edges share a transaction); when
        a call fails part-way, the memories of the transactions that committed are complete and the
        caller's outbox still holds all of them, so delivering them again converges.
        """
        prepare_batch(items)  # refuse a batch with one bad item before anything is written
        latest = list({item.id: item for item in items}.values())  # later items win, as in prepare_batch
        for chunk in _chunks(latest, WRITE_ROWS, lambda m: 1 + len(m.mentions) + len(m.edges)):
            self._split_on_timeout("upsert_memories", chunk, self._upsert_chunk)

    def _upsert_chunk(self, items: Sequence[GraphMemory]) -> None:
        batch = prepare_batch(items)
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
                session.run(neo4j.Query(_origin_index_cypher(t), timeout=max(self._timeout, 30.0))).consume()
                session.run("CALL db.awaitIndex($name, 30)", name=f"rel_origin_{t.lower()}").consume()
        self._origin_indexes.update(new)

    def _split_on_timeout(self, what: str, items: Sequence[T], write: Callable[[Sequence[T]], None]) -> None:
        """Write ``items`` in one transaction; if it times out, in two halves, and so on down to one."""
        try:
            write(items)
        except StoreTimeout:
            if len(items) <= 1:
                raise
            half = len(items) // 2
            self._split_on_timeout(what, items[:half], write)
            self._split_on_timeout(what, items[half:], write)

    def set_deleted(self, ids: Sequence[uuid.UUID], deleted: bool = True) -> None:
        def write(keys: Sequence[str]) -> None:
            self._write(
                "set_deleted",
                lambda tx: tx.run(
                    "UNWIND $ids AS mid MATCH (m:Memory {id: mid}) SET m.deleted = $deleted",
                    ids=list(keys),
                    deleted=bool(deleted),
                ).consume(),
            )

        for chunk in _chunks(check_ids(ids), WRITE_ROWS, lambda _: 1):
            self._split_on_timeout("set_deleted", chunk, write)

    def delete(self, ids: Sequence[uuid.UUID]) -> None:
        def write(keys: Sequence[str]) -> None:
            def work(tx: neo4j.ManagedTransaction) -> None:
                old_types = [rec["t"] for rec in tx.run(_REMOTE_TYPES, ids=list(keys))]
                touched = _drop_declared(tx, list(keys), old_types)
                for rec in tx.run(_DELETE_MEMORIES, ids=list(keys)):
                    touched.update(rec["near"])
                if touched:
                    tx.run(_PURGE_ORPHANS, eids=sorted(touched)).consume()

            self._write("delete", work)

        # A memory's edges go with it: weigh each by a few edges, as written.
        for chunk in _chunks(check_ids(ids), WRITE_ROWS // 4, lambda _: 1):
            self._split_on_timeout("delete", chunk, write)

    def traverse(self, query: GraphTraversal) -> list[uuid.UUID]:
        q = check_traversal(query)
        assert type(q.hops) is int and 1 <= q.hops <= 3
        cypher = _TRAVERSE % {
            **self._fragments(q),
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

        return self._read("traverse", work)

    def _fragments(self, q: CheckedTraversal) -> dict[str, Any]:
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

    def fanout(self, query: GraphTraversal) -> int:
        q = check_traversal(query)
        cypher = _FANOUT % self._fragments(q)

        def work(tx: neo4j.ManagedTransaction) -> int:
            rec = tx.run(cypher, {"start": q.start_key, "agent": q.agent_id}).single()
            return int(rec["n"]) if rec is not None else 0

        return self._read("fanout", work)

    def near_entities(self, query: GraphTraversal) -> frozenset[str] | None:
        q = check_traversal(query)
        if q.hops != 1:
            return None
        cypher = _NEAR_ENTITIES_1 % self._fragments(q)

        def work(tx: neo4j.ManagedTransaction) -> frozenset[str]:
            rec = tx.run(cypher, {"start": q.start_key, "agent": q.agent_id, "eids": None}).single()
            return frozenset(rec["near"]) if rec is not None else frozenset()

        return self._read("near_entities", work)

    def connected(
        self, query: GraphTraversal, ids: Sequence[uuid.UUID], *, near: frozenset[str] | None = None
    ) -> set[uuid.UUID]:
        q = check_traversal(query)
        keys = check_ids(ids)
        if not keys:
            return set()
        frags = self._fragments(q)
        params: dict[str, Any] = {"start": q.start_key, "agent": q.agent_id, "ids": keys}

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

        return self._read("connected", one_hop if q.hops == 1 else general)

    def relationships(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[dict[str, Any]]]:
        keys = check_ids(ids)
        result: dict[uuid.UUID, list[dict[str, Any]]] = {uuid.UUID(k): [] for k in keys}
        if not keys:
            return result

        def work(tx: neo4j.ManagedTransaction) -> list[dict[str, Any]]:
            return [rec.data() for rec in tx.run(_RELATIONSHIPS, ids=keys)]

        for row in self._read("relationships", work):
            other = node_ref(row["xid"])[0] if row["is_memory"] else row["key"]
            rel = relationship(row["type"], row["direction"], other, row["is_memory"], row["etype"], row["name"])
            result[uuid.UUID(row["mid"])].append(rel)
        for rels in result.values():
            rels.sort(key=relationship_sort_key)
        return result

    def scroll(self, *, agent_id: str | None = None, batch: int = 1000) -> Iterator[list[GraphRecord]]:
        agent = check_page(agent_id, batch)
        after = ""
        while True:
            params = {"agent": agent, "after": after, "batch": batch}

            def work(tx: neo4j.ManagedTransaction, params: dict[str, Any] = params) -> list[dict[str, Any]]:
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

            rows = self._read("scroll", work)
            if not rows:
                return
            yield [GraphRecord(id=uuid.UUID(r["id"]), agent_id=r["agent_id"], deleted=r["deleted"]) for r in rows]
            if len(rows) < batch:
                return
            after = rows[-1]["id"]

    def count(self, *, agent_id: str | None = None) -> int:
        agent = validate_agent_id(agent_id) if agent_id is not None else None

        def work(tx: neo4j.ManagedTransaction) -> int:
            rec = tx.run(
                "MATCH (m:Memory) WHERE m.agent_id IS NOT NULL AND ($agent IS NULL OR m.agent_id = $agent)"
                " RETURN count(m) AS c",
                agent=agent,
            ).single()
            return int(rec["c"]) if rec else 0

        return self._read("count", work)

    def ping(self) -> dict[str, Any]:
        def work(tx: neo4j.ManagedTransaction) -> dict[str, Any]:
            comp = tx.run(
                "CALL dbms.components() YIELD name, versions, edition RETURN name, versions, edition"
            ).single()
            mem = tx.run("MATCH (m:Memory) RETURN count(m) AS c").single()
            ent = tx.run("MATCH (e:Entity) RETURN count(e) AS c").single()
            return {
                "engine": self.engine,
                "uri": self._settings.uri,
                "database": self._settings.database,
                "name": comp["name"] if comp else None,
                "version": (comp["versions"] or [None])[0] if comp else None,
                "edition": comp["edition"] if comp else None,
                "memories": int(mem["c"]) if mem else 0,
                "entities": int(ent["c"]) if ent else 0,
            }

        with self._errors("ping"):
            self._driver.verify_connectivity()
        return self._read("ping", work)

    def close(self) -> None:
        self._driver.close()

    # -- power users ------------------------------------------------------------------------

    def _procedure_modes(self) -> dict[str, str]:
        """Every procedure's mode as the server declares it, asked once (it changes with the server only)."""
        if self._modes is None:
            rec = self._read("procedures", lambda tx: tx.run(_PROCEDURE_MODES).single())
            self._modes = {str(name): str(mode) for name, mode in (rec["modes"] if rec is not None else [])}
        return self._modes

    def run_read(
        self,
        cypher: str,
        params: dict[str, Any] | None = None,
        agent_id: str | None = None,
        *,
        limit: int = 1000,
    ) -> list[dict[str, Any]]:
        """Run caller-written Cypher in a READ transaction and return at most ``limit`` rows.

        The server refuses every write (CREATE, MERGE, DELETE, SET, REMOVE, schema commands, write
        procedures) in a read transaction; that refusal is reported as a ``UsageError`` saying so.
        Because Community Edition has no roles, the plan is checked first (``EXPLAIN``) and
        ``LOAD CSV`` and DBMS procedures other than ``dbms.components`` are refused too.
        With ``agent_id`` the query gets ``$agent_id`` and must use it (scoping is the caller's
        Cypher, so at least make forgetting it an error).
        """
        if not isinstance(cypher, str) or not cypher.strip():
            raise UsageError("empty Cypher query")
        bound: dict[str, Any] = dict(params or {})
        if not all(isinstance(k, str) for k in bound):
            raise UsageError("Cypher parameter names must be strings")
        if agent_id is not None:
            agent = validate_agent_id(agent_id)
            if bound.get("agent_id", agent) != agent:
                raise UsageError("params['agent_id'] differs from the agent the query is scoped to")
            if "$agent_id" not in cypher:
                raise UsageError(
                    "this query is scoped to an agent but does not use $agent_id",
                    hint="filter with e.g. WHERE m.agent_id = $agent_id",
                )
            bound["agent_id"] = agent
        if type(limit) is not int or limit < 1:
            raise UsageError(f"limit must be a positive integer, not {limit!r}")
        if _LOAD_CSV.search(cypher):
            raise UsageError("LOAD CSV is not allowed in read-only queries")

        def work(tx: neo4j.ManagedTransaction) -> list[dict[str, Any]]:
            plan = tx.run("EXPLAIN " + cypher, bound).consume().plan
            for op, details in _plan_operators(plan):
                if "LoadCSV" in op:
                    raise UsageError("LOAD CSV is not allowed in read-only queries")
                if "ProcedureCall" not in op:
                    continue
                name = details.split("(")[0].strip().replace("`", "")
                mode = "READ" if name in _EXTRA_PROCEDURES else self._procedure_modes().get(name)
                if mode in ("WRITE", "SCHEMA"):
                    raise UsageError(f"write refused: {_READ_ONLY} ({name} is a {mode} procedure)", hint=_WRITE_HINT)
                if mode != "READ":
                    raise UsageError(
                        f"procedure call {name!r} is not allowed in read-only queries",
                        hint="READ-mode procedures (SHOW PROCEDURES) and dbms.components are allowed",
                    )
            result = tx.run(cypher, bound)
            return [{k: _native(rec[k]) for k in rec.keys()} for rec in islice(result, limit)]

        try:
            return self._read("run_read", work)
        except StoreError as exc:
            cause = exc.__cause__
            code = getattr(cause, "code", "") or ""
            if code == "Neo.ClientError.Statement.AccessMode":
                raise UsageError(
                    f"write refused: {_READ_ONLY}: {getattr(cause, 'message', '')}", hint=_WRITE_HINT
                ) from cause
            if code.startswith(("Neo.ClientError.Statement.", "Neo.ClientError.Procedure.", "Neo.ClientError.Schema.")):
                raise UsageError(f"Cypher rejected: {code}: {getattr(cause, 'message', '')}") from cause
            raise


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


def _chunks(items: Sequence[T], budget: int, weight: Callable[[T], int]) -> Iterator[Sequence[T]]:
    """Consecutive runs of ``items`` whose weights add up to at most ``budget`` (at least one item each)."""
    lo, used = 0, 0
    for i, item in enumerate(items):
        w = weight(item)
        if i > lo and used + w > budget:
            yield items[lo:i]
            lo, used = i, 0
        used += w
    if lo < len(items):
        yield items[lo:]


__all__ = ["Neo4jGraphStore"]
