"""The PostgreSQL side of the query engine: relational/time filters, full-text fallback,
and the graph fallback over the ``entities`` column (stats buckets: ``query/stats.py``).

SQL is composed from fixed fragments; every user value is a bound parameter — metadata keys
too (``metadata -> %s``), so no identifier ever comes from the caller.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg import sql

from memoryctl.query.spec import MemoryQuery, Where
from memoryctl.stores.pg import Pool, pg_errors

_CMP = {"=": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def where_sql(w: Where) -> tuple[sql.Composable, list[Any]]:
    if w.field in ("kind", "agent_id", "created_at"):
        col: sql.Composable = sql.Identifier(w.field)  # whitelisted in Where.build
        if w.op == "in":
            return sql.SQL("{} = ANY(%s)").format(col), [list(w.value)]
        return sql.SQL("{} " + _CMP[w.op] + " %s").format(col), [w.value]
    key = w.field[5:]
    if w.op == "in":
        return sql.SQL("metadata -> %s = ANY(%s::jsonb[])"), [key, [json.dumps(v) for v in w.value]]
    return sql.SQL("metadata -> %s " + _CMP[w.op] + " %s::jsonb"), [key, json.dumps(w.value)]


def scope_sql(q: MemoryQuery, *, with_where: bool = True) -> tuple[sql.Composable, list[Any]]:
    parts: list[sql.Composable] = [sql.SQL("deleted_at IS NULL")]
    params: list[Any] = []
    if q.agent_id is not None:
        parts.append(sql.SQL("agent_id = %s"))
        params.append(q.agent_id)
    if q.since is not None:
        parts.append(sql.SQL("created_at >= %s"))
        params.append(q.since)
    if q.until is not None:
        parts.append(sql.SQL("created_at < %s"))  # half-open [since, until), as in the vector filter
        params.append(q.until)
    if with_where:
        for w in q.where:
            frag, p = where_sql(w)
            parts.append(frag)
            params.extend(p)
    return sql.SQL(" AND ").join(parts), params


class RelationalQueries:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def _rows(self, query: sql.Composed, params: Sequence[Any]) -> list[dict[str, Any]]:
        with pg_errors(), self.pool.connection() as conn:
            return list(conn.execute(query, params))

    def filter(
        self, q: MemoryQuery, *, ids: Sequence[uuid.UUID] | None = None, limit: int, with_where: bool = True
    ) -> list[tuple[uuid.UUID, datetime]]:
        """Live memories in scope, newest first (optionally only among ``ids``)."""
        cond, params = scope_sql(q, with_where=with_where)
        if ids is not None:
            cond = sql.SQL("{} AND id = ANY(%s)").format(cond)
            params.append(list(ids))
        query = sql.SQL("SELECT id, created_at FROM memories WHERE {} ORDER BY created_at DESC, id LIMIT %s").format(
            cond
        )
        return [(r["id"], r["created_at"]) for r in self._rows(query, [*params, limit])]

    def fulltext(self, q: MemoryQuery, text: str, *, limit: int) -> list[tuple[uuid.UUID, float]]:
        """Fallback when Qdrant is unavailable: full-text search ranked by ts_rank.

        The question's words are OR-ed: a natural-language question rarely has every word in the
        answer, and ts_rank still puts memories matching more of them first.
        """
        cond, params = scope_sql(q)
        query = sql.SQL(
            "SELECT id, ts_rank(tsv, query) AS rank FROM memories,"
            " (SELECT to_tsquery('simple', coalesce(nullif(array_to_string(tsvector_to_array("
            "to_tsvector('simple', %s)), ' | '), ''), '')) AS query) AS tq"
            " WHERE tsv @@ query AND {} ORDER BY rank DESC, created_at DESC LIMIT %s"
        ).format(cond)
        return [(r["id"], float(r["rank"])) for r in self._rows(query, [text, *params, limit])]

    def mentions(self, q: MemoryQuery, entity_type: str, entity_name: str, *, limit: int) -> list[uuid.UUID]:
        """Graph fallback (Neo4j down): memories that mention the entity — one hop, MENTIONS only."""
        from memoryctl.model import normalise_name

        cond, params = scope_sql(q, with_where=False)
        query = sql.SQL(
            "SELECT id FROM memories WHERE {} AND EXISTS (SELECT 1 FROM jsonb_array_elements(entities) e"
            " WHERE e ->> 'type' = %s AND lower(e ->> 'name') = %s) ORDER BY created_at DESC LIMIT %s"
        ).format(cond)
        return [r["id"] for r in self._rows(query, [*params, entity_type, normalise_name(entity_name), limit])]
