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
    def __init__(self, pool: Pool, *, lexical_timeout_s: float | None = None) -> None:
        self.pool = pool
        self.lexical_timeout_s = lexical_timeout_s

    def _rows(
        self, query: sql.Composed, params: Sequence[Any], *, timeout_s: float | None = None
    ) -> list[dict[str, Any]]:
        """``query``'s rows; with ``timeout_s``, PostgreSQL cancels it after that long (this
        transaction's statement timeout), instead of the connection's own."""
        with pg_errors(), self.pool.connection() as conn:
            if timeout_s is not None:
                ms = max(1, round(timeout_s * 1000))  # 0 would mean no timeout at all
                conn.execute("SELECT set_config('statement_timeout', %s, true)", [f"{ms}ms"])
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

    def lexical(
        self,
        q: MemoryQuery,
        text: str,
        *,
        limit: int,
        ids: Sequence[uuid.UUID] | None = None,
        with_where: bool = True,
    ) -> list[tuple[uuid.UUID, float]]:
        """The lexical leg: memories in scope whose text or entity names share words with ``text``.

        Scoped exactly like the vector search (agent, time, where, soft deletes, and the graph's
        candidate ids), in the same SQL. The question's words lose the stop words of English and
        keep at most their first five letters as a prefix (``volunteering`` matches
        ``volunteer``), a language-neutral stand-in for stemming. Ranked BM25-style with term
        presence: the sum of each matched word's inverse document frequency over the memories in
        scope; ties newest first. A speaker's name, a word of every turn that person said, so
        weighs what it tells: about ln 2 when two people talk, more among three. Counted among the
        memories that match any word instead (most of which match on the name), it weighed next to
        nothing, and the same words said by two people tied whoever the question named
        (benchmarks/recall.py, general family: recall@10 0.507 -> 0.536). The scope's size is one
        count over the same condition, an index scan beside the words' own.

        The graph's candidate ``ids`` choose which memories are returned, not the word statistics:
        a memory scores the same whether the graph's candidates were known first (graph-first) or
        checked after a search of the whole scope (vector-first), so both plans rank alike.
        """
        query, params = self.lexical_sql(q, text, limit=limit, ids=ids, with_where=with_where)
        rows = self._rows(query, params, timeout_s=self.lexical_timeout_s)
        return [(r["id"], float(r["score"])) for r in rows]

    def lexical_sql(
        self, q: MemoryQuery, text: str, *, limit: int, ids: Sequence[uuid.UUID] | None, with_where: bool
    ) -> tuple[sql.Composed, list[Any]]:
        """The lexical leg's statement and its parameters."""
        cond, params = scope_sql(q, with_where=with_where)
        chosen, chosen_params = (sql.SQL("h.id = ANY(%s)"), [list(ids)]) if ids is not None else (sql.SQL("TRUE"), [])
        # Each word becomes a quoted tsquery lexeme (quote_literal doubles quotes; a word holding a
        # backslash, which quote_literal would turn into an E'' string, is dropped).
        # Every intermediate result is computed exactly once, whatever the planner estimates: the
        # candidates by one scan for any of the words (the GIN index on each chunk), each
        # (candidate, word) match once (``hits``), one weight per word from those matches (the
        # scope's size is an uncorrelated scalar subquery: an InitPlan, run once). Left to
        # inline them, the planner put an aggregate on the inner side of a nested loop and re-ran it
        # per candidate whenever it expected one row (a freshly loaded table, or the generic plan
        # psycopg's prepared statement gets after five runs): quadratic, up to seconds.
        query = sql.SQL(
            "WITH terms AS MATERIALIZED (SELECT t, to_tsquery('simple', t) AS tq FROM (SELECT DISTINCT"
            " CASE WHEN length(w) >= 5 THEN quote_literal(left(w, 5)) || ':*' ELSE quote_literal(w) END AS t"
            " FROM unnest(tsvector_to_array(to_tsvector('simple', %s))) AS w"
            " WHERE position(chr(92) in w) = 0 AND to_tsvector('english', w) <> ''::tsvector) AS words),"
            " cand AS MATERIALIZED (SELECT id, tsv, created_at FROM memories"
            " WHERE tsv @@ (SELECT to_tsquery('simple', string_agg(t, ' | ')) FROM terms) AND {}),"
            " hits AS MATERIALIZED (SELECT c.id, c.created_at, t.t FROM cand c JOIN terms t ON c.tsv @@ t.tq),"
            " idf AS MATERIALIZED (SELECT t, ln(1.0 + ((SELECT count(*) FROM memories WHERE {}) - count(*) + 0.5)"
            " / (count(*) + 0.5)) AS w FROM hits GROUP BY t)"
            " SELECT h.id, sum(idf.w) AS score, max(h.created_at) AS at FROM hits h JOIN idf ON idf.t = h.t"
            " WHERE {} GROUP BY h.id ORDER BY score DESC, at DESC, h.id LIMIT %s"
        ).format(cond, cond, chosen)
        return query, [text, *params, *params, *chosen_params, limit]

    def mentions(self, q: MemoryQuery, entity_type: str, entity_name: str, *, limit: int) -> list[uuid.UUID]:
        """Graph fallback (Neo4j down): memories that mention the entity — one hop, MENTIONS only."""
        from memoryctl.model import normalise_name

        cond, params = scope_sql(q, with_where=False)
        query = sql.SQL(
            "SELECT id FROM memories WHERE {} AND EXISTS (SELECT 1 FROM jsonb_array_elements(entities) e"
            " WHERE e ->> 'type' = %s AND lower(e ->> 'name') = %s) ORDER BY created_at DESC LIMIT %s"
        ).format(cond)
        return [r["id"] for r in self._rows(query, [*params, entity_type, normalise_name(entity_name), limit])]
