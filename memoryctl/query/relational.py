"""The PostgreSQL side of the query engine: relational/time filters, full-text fallback,
and the graph fallback over the ``entities`` column (stats buckets: ``query/stats.py``).

SQL is composed from fixed fragments; every user value is a bound parameter — metadata keys
too (``metadata -> %s``), so no identifier ever comes from the caller.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from psycopg import Connection, sql

from memoryctl.query import dense_question, lexical
from memoryctl.query.spec import MemoryQuery, Where
from memoryctl.stores.pg import Pool, pg_errors, set_local_timeout

_CMP = {"=": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def where_sql(w: Where) -> tuple[sql.Composable, list[Any]]:
    if w.field in ("kind", "agent_id", "created_at"):
        col: sql.Composable = sql.Identifier(w.field)  # whitelisted in Where.build
        if w.op == "in":
            return sql.SQL("{} = ANY(%s)").format(col), [list(w.value)]
        return sql.SQL("{} " + _CMP[w.op] + " %s").format(col), [w.value]
    key = w.field[5:]
    if w.op == "in":
        values = [json.dumps(v) for v in w.value if _storable(v)]
        if not values:
            return sql.SQL("FALSE"), []
        return sql.SQL("metadata -> %s = ANY(%s::jsonb[])"), [key, values]
    if not _storable(w.value):
        # No stored value holds it, so none equals it (every row with the key differs); an order
        # against it has no answer either. PostgreSQL refused the value itself ("unsupported
        # Unicode escape sequence") and the whole lexical leg failed: found by the hostile-client
        # harness (a `note = '...\x00...'` filter).
        if w.op == "!=":
            return sql.SQL("metadata -> %s IS NOT NULL"), [key]
        return sql.SQL("FALSE"), []
    return sql.SQL("metadata -> %s " + _CMP[w.op] + " %s::jsonb"), [key, json.dumps(w.value)]


def _storable(value: Any) -> bool:
    """Whether jsonb can hold the value: no NUL character in any of its strings (keys too)."""
    if isinstance(value, str):
        return "\x00" not in value
    if isinstance(value, dict):
        return all(_storable(k) and _storable(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_storable(v) for v in value)
    return True


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

    @contextlib.contextmanager
    def _connection(self, timeout_s: float | None = None) -> Iterator[Connection[Any]]:
        """A pooled connection in a transaction; with ``timeout_s``, PostgreSQL cancels each of its
        statements after that long (the transaction's statement timeout), not the connection's own."""
        with pg_errors(), self.pool.connection() as conn:
            if timeout_s is not None:
                set_local_timeout(conn, "statement_timeout", timeout_s)
            yield conn

    def _rows(self, query: sql.Composed, params: Sequence[Any]) -> list[dict[str, Any]]:
        with self._connection() as conn:
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
        candidate ids), in the same SQL; ranked and planned as ``query/lexical.py`` says. BM25-style
        with term presence: the sum of each matched word's inverse document frequency over the
        memories in scope. A speaker's name, a word of every turn that person said, so weighs what
        it tells: about ln 2 when two people talk, more among three (counted among the memories
        that match any word instead, it weighed next to nothing: docs/retrieval.md).

        The graph's candidate ``ids`` choose which memories are returned, not the word statistics:
        a memory scores the same whether the graph's candidates were known first (graph-first) or
        checked after a search of the whole scope (vector-first), so both plans rank alike.
        """
        cond, params = scope_sql(q, with_where=with_where)
        scoped = q.since is not None or q.until is not None or (with_where and bool(q.where))
        # Its statements share one connection, and the timeout is set once for all of them.
        with self._connection(self.lexical_timeout_s) as conn:
            query, words_params = lexical.words_sql(text, cond, params, agent_id=q.agent_id, scoped=scoped)
            rows = list(conn.execute(query, words_params))
            words = lexical.weigh(rows)
            if not words:
                return []
            if rows[0]["scope_n"] != rows[0]["n"]:  # a narrower scope: its own weights
                query, recount_params = lexical.recount_sql(words, cond, params, n=rows[0]["scope_n"])
                words = lexical.reweigh(words, list(conn.execute(query, recount_params)))
            _, common = lexical.split(words, bounded=ids is not None or q.agent_id is None)
            query, ranked_params = lexical.ranked_sql(words, common, cond, params, limit=limit, ids=ids)
            return [(r["id"], float(r["score"])) for r in conn.execute(query, ranked_params)]

    def following(
        self, q: MemoryQuery, ids: Sequence[uuid.UUID], *, turns: int, within: timedelta, with_where: bool = True
    ) -> dict[uuid.UUID, list[uuid.UUID]]:
        """Per memory of ``ids``: the ``turns`` memories of its agent written next after it, in
        ``(created_at, seq)`` order (time, then the order of writing: schema 0008) and at most
        ``within`` later, among the live memories in the query's scope: the turns that a
        candidate is the conversational context of (``query/turns.py``). Memories written at the
        same instant follow one another in write order; two of them without a write order
        (written before schema 0008) follow neither way. One index range read per memory
        (``memories_live_scope``: agent, created_at)."""
        cond, params = scope_sql(q, with_where=with_where)
        query = sql.SQL(
            "SELECT c.id AS id, x.id AS near FROM memories c CROSS JOIN LATERAL"
            " (SELECT id FROM memories WHERE {} AND agent_id = c.agent_id"
            " AND created_at >= c.created_at AND created_at <= c.created_at + %s"
            " AND (created_at, seq) > (c.created_at, c.seq)"
            " ORDER BY created_at, seq, id LIMIT %s) x WHERE c.id = ANY(%s)"
        ).format(cond)
        found: dict[uuid.UUID, list[uuid.UUID]] = {i: [] for i in ids}
        for r in self._rows(query, [*params, within, turns, list(ids)]):
            found[r["id"]].append(r["near"])
        return found

    def names_said(self, q: MemoryQuery, text: str) -> list[str]:
        """The names of entities the agent's live memories carry (every agent's without one) that
        ``text`` says as whole words, lower-cased (``query/dense_question.py``): primary-key lookups in
        ``lexical_terms`` (schema 0009), whatever the number of memories."""
        said = dense_question.grams(text)
        if not said:
            return []
        agent, params = (sql.SQL("agent_id = %s"), [q.agent_id]) if q.agent_id is not None else (sql.SQL("TRUE"), [])
        query = sql.SQL(
            "SELECT DISTINCT substr(term, %s) AS name FROM lexical_terms WHERE term = ANY(%s) AND df > 0 AND {}"
            " ORDER BY 1"
        ).format(agent)
        terms = [dense_question.TERM_PREFIX + g for g in said]
        return [r["name"] for r in self._rows(query, [len(dense_question.TERM_PREFIX) + 1, terms, *params])]

    def mentions(self, q: MemoryQuery, entity_type: str, entity_name: str, *, limit: int) -> list[uuid.UUID]:
        """Graph fallback (Neo4j down): memories that mention the entity — one hop, MENTIONS only."""
        from memoryctl.model import normalise_name

        cond, params = scope_sql(q, with_where=False)
        query = sql.SQL(
            "SELECT id FROM memories WHERE {} AND EXISTS (SELECT 1 FROM jsonb_array_elements(entities) e"
            " WHERE e ->> 'type' = %s AND lower(e ->> 'name') = %s) ORDER BY created_at DESC LIMIT %s"
        ).format(cond)
        return [r["id"] for r in self._rows(query, [*params, entity_type, normalise_name(entity_name), limit])]
