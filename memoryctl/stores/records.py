"""Memories, outbox and run records in PostgreSQL — the source of truth.

A write is one transaction: the memory rows and one outbox row per secondary store. Delivery
later reads the memory's *current* row, so the outbox needs no payload and delivering twice, late,
or out of order converges. Ids are unique per memory across both schema paths: the writer takes
the stored ``created_at`` of an existing id (``created_at`` is immutable) so the upsert always hits
the same (id, created_at) key, whether or not the table is a hypertable.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import Connection, sql
from psycopg.types.json import Jsonb

from memoryctl.errors import ConflictError, StoreError
from memoryctl.model import EntityRef, Memory, node_from_json
from memoryctl.stores import lexical_terms, names
from memoryctl.stores.pg import Pool, fetch_all, fetch_one, pg_errors, retry_on_failover, set_local_timeout

TARGETS = ("vector", "graph")

_COLUMNS = "id, agent_id, text, kind, created_at, updated_at, content_hash, metadata, entities, relations, deleted_at"


@dataclass(slots=True)
class UpsertResult:
    inserted: list[uuid.UUID] = field(default_factory=list)
    updated: list[uuid.UUID] = field(default_factory=list)
    unchanged: list[uuid.UUID] = field(default_factory=list)
    conflicts: list[int] = field(default_factory=list)  # positions of memories of another agent's ids: not written

    @property
    def changed(self) -> list[uuid.UUID]:
        return self.inserted + self.updated


@dataclass(frozen=True, slots=True)
class OutboxItem:
    id: int
    memory_id: uuid.UUID
    op: str
    attempts: int


def keyset_after(last: uuid.UUID | None, column: str = "id") -> tuple[str, tuple[uuid.UUID, ...]]:
    """The lower bound of a keyset page: ``"id > %s AND "`` after the first page, nothing before.

    Not ``(%s IS NULL OR id > %s)``: psycopg prepares a statement after five runs, PostgreSQL may
    then pick a generic plan, and in a generic plan that OR cannot become an index condition, so
    every page scans the index from the start (measured: 1.3 s for a page at 50k of 100k rows,
    quadratic over a scan). ``column`` is a constant at every call site, never user text.
    """
    assert column in ("id", "m.id")
    return ("", ()) if last is None else (f"{column} > %s AND", (last,))


def row_to_memory(row: dict[str, Any]) -> Memory:
    """A stored row as a ``Memory``; validated when written, so not again (``Memory.stored``)."""
    mid = row["id"]
    entities = [EntityRef.stored(e["type"], e["name"]) for e in row["entities"]]
    from memoryctl.model import Relation

    relations = [
        Relation(node_from_json(r["from"], mid), r["type"], node_from_json(r["to"], mid)) for r in row["relations"]
    ]
    return Memory.stored(
        id=mid,
        agent_id=row["agent_id"],
        text=row["text"],
        kind=row["kind"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        metadata=row["metadata"],
        entities=entities,
        relations=relations,
        deleted_at=row["deleted_at"],
        hash=row["content_hash"],
    )


def conflict_error(ids: Sequence[uuid.UUID]) -> ConflictError:
    shown = ", ".join(map(str, ids[:3])) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
    return ConflictError(
        f"memory id {shown} already belongs to another agent",
        ids=list(ids),
        hint='an id names one memory of one agent: leave --id / "id" out to get a new one',
    )


def _same(existing: dict[str, Any], m: Memory) -> bool:
    return bool(
        existing["content_hash"] == m.hash
        and existing["agent_id"] == m.agent_id
        and existing["kind"] == m.kind
        and same_json(existing["metadata"], m.metadata)
        and same_json(existing["entities"], [e.as_dict() for e in m.entities])
        and same_json(existing["relations"], json.loads(json.dumps([r.as_dict() for r in m.relations])))
    )


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values, which Python's ``==`` is not: ``False == 0`` and ``True == 1.0`` in
    Python, so an update of ``{"x": false}`` to ``{"x": 0}`` was taken for "unchanged" and dropped
    (found by the hostile-client harness). Numbers compare by value (jsonb does: ``1`` is ``1.0``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return Decimal(repr(a)) == Decimal(repr(b))  # jsonb gives 3.4e+38 back as its 39 digits
    return type(a) is type(b) and bool(a == b)


class RecordStore:
    name = names.POSTGRES

    def __init__(self, pool: Pool, *, failover_wait_s: float = 0.0) -> None:
        self.pool = pool
        self.failover_wait_s = failover_wait_s  # [postgres] failover_wait_s: upsert's retry window

    # ---- writes -------------------------------------------------------------------------------
    def upsert(self, memories: Sequence[Memory], *, skip_conflicts: bool = False) -> UpsertResult:
        """Insert new memories, update changed ones, and enqueue delivery — one transaction.

        An id that exists under another agent (or comes twice in the batch with two agents) is a
        conflict, never a move: the memory stays its owner's. By default the whole batch is
        refused (``ConflictError``, nothing written); with ``skip_conflicts`` the others are
        written and the positions of the refused ones listed in the result (an import reports their
        lines).

        A connection that breaks (a failover) runs the transaction again on the new primary within
        ``failover_wait_s`` (``pg.retry_on_failover``). That is safe because the write is idempotent
        by id: if the first COMMIT did land, the retry finds every memory as written and reports it
        "unchanged", with no second outbox entry.
        """
        if not memories:
            return UpsertResult()
        first = memories[0].id
        what = f"writing {len(memories)} memories (ids {first}…)" if len(memories) > 1 else f"writing memory {first}"
        with pg_errors():
            return retry_on_failover(
                self.pool,
                lambda conn: self._upsert(conn, memories, skip_conflicts),
                wait_s=self.failover_wait_s,
                what=what,
            )

    def _upsert(self, conn: Connection[Any], memories: Sequence[Memory], skip_conflicts: bool) -> UpsertResult:
        result = UpsertResult()
        with conn.transaction():
            existing = {
                r["id"]: r
                for r in conn.execute(
                    f"SELECT {_COLUMNS} FROM memories WHERE id = ANY(%s) FOR UPDATE",  # noqa: S608 - constant
                    (list({m.id for m in memories}),),
                )
            }
            owner = {mid: r["agent_id"] for mid, r in existing.items()}
            by_id: dict[uuid.UUID, Memory] = {}
            for i, m in enumerate(memories):  # the last one wins within a batch, within its owner
                if owner.setdefault(m.id, m.agent_id) == m.agent_id:
                    by_id[m.id] = m
                else:
                    result.conflicts.append(i)
            if result.conflicts and not skip_conflicts:
                raise conflict_error([memories[i].id for i in result.conflicts])
            rows = []
            for mid, m in by_id.items():
                old = existing.get(mid)
                if old is None:
                    result.inserted.append(mid)
                elif old["deleted_at"] is not None or _same(old, m):
                    # A forgotten memory stays forgotten: re-importing it must not resurrect it.
                    result.unchanged.append(mid)
                    continue
                else:
                    m.created_at = old["created_at"]  # immutable: keeps the (id, created_at) key
                    result.updated.append(mid)
                rows.append(self._row(m))
            if rows:
                before = lexical_terms.terms_of(conn, result.updated)
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO memories (id, agent_id, text, kind, created_at, updated_at, content_hash,"
                        " metadata, entities, relations, deleted_at)"
                        " VALUES (%s, %s, %s, %s, %s, now(), %s, %s, %s, %s, NULL)"
                        " ON CONFLICT (id, created_at) DO UPDATE SET"
                        " text = EXCLUDED.text, kind = EXCLUDED.kind, updated_at = now(),"
                        " content_hash = EXCLUDED.content_hash, metadata = EXCLUDED.metadata,"
                        " entities = EXCLUDED.entities, relations = EXCLUDED.relations",
                        rows,
                    )
                lexical_terms.apply(conn, added=result.changed, replaced=before)
                self._enqueue(conn, result.changed, "upsert")
        return result

    @staticmethod
    def _row(m: Memory) -> tuple[Any, ...]:
        """``updated_at`` is not taken from the caller: it is the store's write time (``now()``) on
        insert and on update, so "changed since T" (``migrate``'s catch-up) sees every write, an
        import of last year's memories included. ``created_at`` carries the memory's own time.
        """
        return (
            m.id,
            m.agent_id,
            m.text,
            m.kind,
            m.created_at,
            m.hash,
            Jsonb(m.metadata),
            Jsonb([e.as_dict() for e in m.entities]),
            Jsonb([r.as_dict() for r in m.relations]),
        )

    @staticmethod
    def _enqueue(conn: Connection[Any], ids: Sequence[uuid.UUID], op: str) -> None:
        if not ids:
            return
        conn.execute(
            "INSERT INTO outbox (memory_id, target, op) SELECT m, t, %s FROM unnest(%s::uuid[]) AS m,"
            " unnest(%s::text[]) AS t",
            (op, list(ids), list(TARGETS)),
        )

    def soft_delete(self, ids: Sequence[uuid.UUID], *, agent_id: str | None) -> list[uuid.UUID]:
        """Mark deleted (hidden from every query path at once) and enqueue the stores' update."""
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            rows = conn.execute(
                "UPDATE memories SET deleted_at = now(), updated_at = now()"
                " WHERE id = ANY(%s) AND deleted_at IS NULL AND (%s::text IS NULL OR agent_id = %s) RETURNING id",
                (list(ids), agent_id, agent_id),
            ).fetchall()
            done = [r["id"] for r in rows]
            lexical_terms.apply(conn, removed=done)
            self._enqueue(conn, done, "upsert")
        return done

    def purge(self, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
        """Remove soft-deleted rows for good; the stores are told by a 'purge' outbox entry."""
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            rows = conn.execute(
                "DELETE FROM memories WHERE id = ANY(%s) AND deleted_at IS NOT NULL RETURNING id", (list(ids),)
            ).fetchall()
            done = [r["id"] for r in rows]
            self._enqueue(conn, done, "purge")
        return done

    # ---- reads --------------------------------------------------------------------------------
    def get_many(self, ids: Sequence[uuid.UUID], *, include_deleted: bool = True) -> dict[uuid.UUID, Memory]:
        if not ids:
            return {}
        rows = fetch_all(
            self.pool,
            f"SELECT {_COLUMNS} FROM memories WHERE id = ANY(%s)"  # noqa: S608 - constant
            " AND (%s OR deleted_at IS NULL)",
            (list(ids), include_deleted),
        )
        return {r["id"]: row_to_memory(r) for r in rows}

    def owners(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
        """The agent of each id that exists (forgotten ones too)."""
        if not ids:
            return {}
        rows = fetch_all(self.pool, "SELECT id, agent_id FROM memories WHERE id = ANY(%s)", (list(set(ids)),))
        return {r["id"]: r["agent_id"] for r in rows}

    def get(self, mid: uuid.UUID) -> Memory | None:
        return self.get_many([mid]).get(mid)

    def count(self, *, agent_id: str | None = None, include_deleted: bool = False) -> int:
        with pg_errors(), self.pool.connection() as conn:
            row = conn.execute(
                "SELECT count(*) AS n FROM memories WHERE (%s::text IS NULL OR agent_id = %s)"
                " AND (%s OR deleted_at IS NULL)",
                (agent_id, agent_id, include_deleted),
            ).fetchone()
        return int(row["n"]) if row else 0

    def scroll(
        self, *, agent_id: str | None = None, batch: int = 1000, include_deleted: bool = True
    ) -> Iterator[list[dict[str, Any]]]:
        """Keyset pages of (id, agent_id, content_hash, deleted_at, created_at) in id order."""
        last: uuid.UUID | None = None
        while True:
            after, after_params = keyset_after(last)
            rows = fetch_all(
                self.pool,
                "SELECT id, agent_id, content_hash, deleted_at, created_at FROM memories"  # noqa: S608 - constant
                f" WHERE {after} (%s::text IS NULL OR agent_id = %s)"
                " AND (%s OR deleted_at IS NULL) ORDER BY id LIMIT %s",
                (*after_params, agent_id, agent_id, include_deleted, batch),
            )
            if not rows:
                return
            yield rows
            last = rows[-1]["id"]

    # ---- outbox -------------------------------------------------------------------------------
    @contextmanager
    def claim(
        self,
        target: str,
        *,
        limit: int,
        memory_ids: Sequence[uuid.UUID] | None = None,
        wait_s: float | None = None,
    ) -> Iterator[list[OutboxItem]]:
        """Lock a batch of due outbox rows; they are deleted if the block finishes without error.

        ``SKIP LOCKED`` lets several ``sync`` processes drain in parallel without double work. With
        ``wait_s`` the claim waits (up to that long for each row) for rows another delivery holds instead: when
        that delivery commits, the rows it delivered are gone and the ones it deferred are no longer
        due (PostgreSQL re-checks the condition on the new row version), so what is claimed is
        exactly what is still to do — a caller that must know whether *its* ids landed asks this.
        """
        lock = sql.SQL("FOR UPDATE SKIP LOCKED" if wait_s is None else "FOR UPDATE")
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            if wait_s is not None:
                set_local_timeout(conn, "lock_timeout", wait_s)
            try:
                rows = conn.execute(
                    sql.SQL(
                        "SELECT id, memory_id, op, attempts FROM outbox WHERE target = %s AND next_attempt_at <= now()"
                        " AND (%s::uuid[] IS NULL OR memory_id = ANY(%s)) ORDER BY id LIMIT %s {lock}"
                    ).format(lock=lock),
                    (
                        target,
                        list(memory_ids) if memory_ids is not None else None,
                        list(memory_ids) if memory_ids is not None else None,
                        limit,
                    ),
                ).fetchall()
            except psycopg.errors.LockNotAvailable:
                raise StoreError(
                    names.POSTGRES,
                    f"{target} outbox rows held by another delivery for more than {wait_s:g} s",
                    hint="a long `sync`, import or `memoryctl serve` is delivering them; nothing is lost — "
                    "run the command again when it has finished",
                ) from None
            items = [OutboxItem(r["id"], r["memory_id"], r["op"], r["attempts"]) for r in rows]
            yield items
            if items:
                conn.execute("DELETE FROM outbox WHERE id = ANY(%s)", ([i.id for i in items],))

    def defer(self, items: Sequence[OutboxItem], error: str) -> None:
        """Record a failed delivery and back off (capped exponential) before the next attempt."""
        if not items:
            return
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            conn.execute(
                "UPDATE outbox SET attempts = attempts + 1, last_error = %s,"
                " next_attempt_at = now() + least(interval '5 minutes', interval '1 second' * power(2, attempts))"
                " WHERE id = ANY(%s)",
                (error[:2000], [i.id for i in items]),
            )

    def set_aside(self, failed: Sequence[tuple[OutboxItem, str]]) -> None:
        """Take rows out of the queue, each with the error it failed with alone (``memoryctl.write.outbox``).

        A row set aside is an outbox row due at ``infinity``: never claimed, not counted as
        pending, listed by ``set_aside_rows`` and put back (``retry_set_aside``) or dropped
        (``drop_set_aside``) by the operator -- kept, never lost, and holding nothing back.
        """
        if not failed:
            return
        with pg_errors(), self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.executemany(
                "UPDATE outbox SET attempts = attempts + 1, last_error = %s, next_attempt_at = 'infinity'"
                " WHERE id = %s",
                [(error[:2000], item.id) for item, error in failed],
            )

    def outbox_stats(self) -> dict[str, dict[str, Any]]:
        rows = fetch_all(
            self.pool,
            "SELECT target, count(*) FILTER (WHERE NOT aside) AS pending, min(created_at) FILTER (WHERE NOT aside)"
            " AS oldest, max(attempts) FILTER (WHERE NOT aside) AS max_attempts,"
            " (array_agg(last_error ORDER BY id DESC) FILTER (WHERE last_error IS NOT NULL AND NOT aside))[1]"
            " AS last_error, count(*) FILTER (WHERE aside) AS set_aside,"
            " (array_agg(last_error ORDER BY id DESC) FILTER (WHERE aside))[1] AS set_aside_error"
            " FROM (SELECT *, next_attempt_at = 'infinity' AS aside FROM outbox) AS o GROUP BY target",
        )
        keys = ("pending", "oldest", "max_attempts", "last_error", "set_aside", "set_aside_error")
        stats = {t: dict.fromkeys(keys) | {"pending": 0, "max_attempts": 0, "set_aside": 0} for t in TARGETS}
        for r in rows:
            stats[r["target"]] = {k: r[k] if r[k] is not None else stats[r["target"]][k] for k in keys}
        return stats

    def pending_count(self, memory_ids: Sequence[uuid.UUID] | None = None) -> dict[str, int]:
        """Memories awaiting delivery per target (rows set aside are not awaiting anything)."""
        rows = fetch_all(
            self.pool,
            "SELECT target, count(DISTINCT memory_id) AS n FROM outbox WHERE next_attempt_at <> 'infinity'"
            " AND (%s::uuid[] IS NULL OR memory_id = ANY(%s)) GROUP BY target",
            (
                list(memory_ids) if memory_ids is not None else None,
                list(memory_ids) if memory_ids is not None else None,
            ),
        )
        return {r["target"]: int(r["n"]) for r in rows}

    def retry_now(self, targets: Sequence[str] = TARGETS) -> None:
        """Make deferred rows due immediately (``sync`` run by an operator should not wait); rows
        set aside stay aside (``retry_set_aside`` puts them back)."""
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            conn.execute(
                "UPDATE outbox SET next_attempt_at = now() WHERE next_attempt_at > now()"
                " AND next_attempt_at <> 'infinity' AND target = ANY(%s)",
                (list(targets),),
            )

    def set_aside_rows(self, *, limit: int = 1000) -> list[dict[str, Any]]:
        """The rows set aside, oldest first: what failed to be delivered where, and why."""
        return fetch_all(
            self.pool,
            "SELECT o.id, o.memory_id, m.agent_id, o.target, o.op, o.attempts, o.last_error, o.created_at"
            " FROM outbox AS o LEFT JOIN memories AS m ON m.id = o.memory_id"
            " WHERE o.next_attempt_at = 'infinity' ORDER BY o.id LIMIT %s",
            (limit,),
        )

    def retry_set_aside(self, ids: Sequence[int] | None = None) -> int:
        """Put rows set aside (all, or these outbox ids) back in the queue, due now."""
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            cur = conn.execute(
                "UPDATE outbox SET next_attempt_at = now(), attempts = 0 WHERE next_attempt_at = 'infinity'"
                " AND (%s::bigint[] IS NULL OR id = ANY(%s))",
                (_ids(ids), _ids(ids)),
            )
            return cur.rowcount

    def drop_set_aside(self, ids: Sequence[int] | None = None) -> int:
        """Delete rows set aside (all, or these outbox ids): that store will not get them (reconcile
        then reports the memory as missing there)."""
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            cur = conn.execute(
                "DELETE FROM outbox WHERE next_attempt_at = 'infinity' AND (%s::bigint[] IS NULL OR id = ANY(%s))",
                (_ids(ids), _ids(ids)),
            )
            return cur.rowcount

    def enqueue(self, ids: Sequence[uuid.UUID], op: str = "upsert") -> None:
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            self._enqueue(conn, ids, op)


def _storable(value: Any) -> Any:
    """A run record's value as PostgreSQL holds it. A refused call is recorded with the parameters
    it was sent, whatever they hold: text without NUL or lone surrogates (replaced), numbers JSON
    can carry (a non-finite one as its text)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_storable(str(k)): _storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_storable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class RunLog:
    """Maintenance run records (`maintenance_runs`): shown by `health` and `memoryctl runs`."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def start(self, command: str, *, trigger: str, actor: str | None) -> int:
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            row = conn.execute(
                "INSERT INTO maintenance_runs (command, trigger, actor) VALUES (%s, %s, %s) RETURNING id",
                (command, trigger, actor),
            ).fetchone()
        assert row is not None
        return int(row["id"])

    def finish(
        self,
        run_id: int,
        status: str,
        *,
        counts: dict[str, Any] | None = None,
        error: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            conn.execute(
                "UPDATE maintenance_runs SET finished_at = now(), status = %s, counts = %s, error = %s,"
                " details = %s WHERE id = %s",
                (
                    status,
                    Jsonb(_storable(counts or {})),
                    _storable(error),
                    Jsonb(_storable(details or {})),
                    run_id,
                ),
            )

    def recent(self, *, command: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        return fetch_all(
            self.pool,
            "SELECT id, command, started_at, finished_at, status, trigger, actor, counts, error, details"
            " FROM maintenance_runs WHERE (%s::text IS NULL OR command = %s)"
            " ORDER BY started_at DESC LIMIT %s",
            (command, command, limit),
        )

    def last_success(self, command: str) -> datetime | None:
        """When the last run of ``command`` that ended ``ok`` started (a data window's lower bound)."""
        with pg_errors(), self.pool.connection() as conn:
            row = conn.execute(
                "SELECT max(started_at) AS t FROM maintenance_runs WHERE command = %s AND status = 'ok'", (command,)
            ).fetchone()
        return as_datetime(row["t"]) if row else None

    def last_with_details(self, command: str) -> dict[str, Any] | None:
        """The newest run of ``command`` with its details (``health``'s nightly component)."""
        return fetch_one(
            self.pool,
            "SELECT started_at, finished_at, status, error, details FROM maintenance_runs"
            " WHERE command = %s ORDER BY started_at DESC LIMIT 1",
            (command,),
        )

    def last_per_command(self) -> dict[str, dict[str, Any]]:
        rows = fetch_all(
            self.pool,
            "SELECT DISTINCT ON (command) command, started_at, finished_at, status, error, counts"
            " FROM maintenance_runs ORDER BY command, started_at DESC",
        )
        return {r["command"]: r for r in rows}


def _ids(ids: Sequence[int] | None) -> list[int] | None:
    return None if ids is None else list(ids)


def as_datetime(value: Any) -> datetime | None:
    return value if isinstance(value, datetime) else None
