"""The PostgreSQL reads and writes the maintenance operations need beyond ``RecordStore``.

Kept apart from the record store because they change with the ops commands (checkpoints, model
registry, drift lookups), not with the write path. Every statement is parameterised.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from memoryctl.model import Memory
from memoryctl.stores.pg import fetch_all, fetch_one, pg_errors
from memoryctl.stores.records import keyset_after, row_to_memory

_FULL = "id, agent_id, text, kind, created_at, updated_at, content_hash, metadata, entities, relations, deleted_at"


class OpsState:
    def __init__(self, pool: ConnectionPool[Any]) -> None:
        self.pool = pool

    # ---- lookups used by reconciliation ------------------------------------------------------
    def pending_targets(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, set[str]]:
        """Which outbox targets still hold an entry for each id (delivery pending, not drift)."""
        if not ids:
            return {}
        rows = fetch_all(
            self.pool, "SELECT DISTINCT memory_id, target FROM outbox WHERE memory_id = ANY(%s)", (list(ids),)
        )
        out: dict[uuid.UUID, set[str]] = {}
        for r in rows:
            out.setdefault(r["memory_id"], set()).add(r["target"])
        return out

    def existing(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, dict[str, Any]]:
        """Current (id, content_hash, deleted_at) of ids: re-checked before a repair acts on a race."""
        if not ids:
            return {}
        rows = fetch_all(
            self.pool, "SELECT id, agent_id, content_hash, deleted_at FROM memories WHERE id = ANY(%s)", (list(ids),)
        )
        return {r["id"]: r for r in rows}

    def now(self) -> datetime:
        with pg_errors(), self.pool.connection() as conn:
            row = conn.execute("SELECT now() AS t").fetchone()
        assert row is not None
        t: datetime = row["t"]
        return t

    def safe_watermark(self) -> datetime:
        """A time T such that every row committed from now on has ``updated_at >= T``.

        ``updated_at = now()`` is the *transaction start* time, so a transaction open right now may
        commit a row stamped earlier than the clock. The oldest open transaction's start bounds it.
        (Sessions of other roles show no ``xact_start`` without pg_read_all_stats; memoryctl uses
        one role, and the caller subtracts a margin anyway.)
        """
        with pg_errors(), self.pool.connection() as conn:
            row = conn.execute(
                "SELECT least(now(), coalesce(min(xact_start), now())) AS t FROM pg_stat_activity"
                " WHERE datname = current_database() AND xact_start IS NOT NULL AND pid <> pg_backend_pid()"
            ).fetchone()
        assert row is not None
        t: datetime = row["t"]
        return t

    # ---- row streams used by re-embedding -----------------------------------------------------
    def live_after(self, last: uuid.UUID | None, limit: int, *, agent_id: str | None = None) -> list[Memory]:
        """One keyset page of live memories (full rows) in id order after ``last``."""
        after, after_params = keyset_after(last)
        rows = fetch_all(
            self.pool,
            f"SELECT {_FULL} FROM memories WHERE {after}"  # noqa: S608 - constants
            " deleted_at IS NULL AND (%s::text IS NULL OR agent_id = %s) ORDER BY id LIMIT %s",
            (*after_params, agent_id, agent_id, limit),
        )
        return [row_to_memory(r) for r in rows]

    def changed_since(self, since: datetime, *, batch: int = 1000) -> Iterator[list[Memory]]:
        """Memories (deleted ones too) with ``updated_at >= since``, keyset pages in id order."""
        last: uuid.UUID | None = None
        while True:
            after, after_params = keyset_after(last)
            rows = fetch_all(
                self.pool,
                f"SELECT {_FULL} FROM memories WHERE {after} updated_at >= %s"  # noqa: S608 - constants
                " ORDER BY id LIMIT %s",
                (*after_params, since, batch),
            )
            if not rows:
                return
            yield [row_to_memory(r) for r in rows]
            last = rows[-1]["id"]

    def dialogue_turns(self, kind: str, since: datetime | None) -> list[dict[str, Any]]:
        """Memories of ``kind`` written after ``since`` as conversation turns (role from metadata), in
        conversation order: the generation adapter's training data."""
        return fetch_all(
            self.pool,
            "SELECT id::text AS id, text, metadata ->> 'role' AS role,"
            " coalesce(metadata ->> 'conversation_id', agent_id) AS conversation_id"
            " FROM memories WHERE kind = %s AND deleted_at IS NULL"
            " AND (%s::timestamptz IS NULL OR created_at > %s)"
            " ORDER BY agent_id, coalesce(metadata ->> 'conversation_id', ''), created_at, seq, id",
            (kind, since, since),
        )

    def count_live(self) -> int:
        with pg_errors(), self.pool.connection() as conn:
            row = conn.execute("SELECT count(*) AS n FROM memories WHERE deleted_at IS NULL").fetchone()
        return int(row["n"]) if row else 0

    def sample_live(self, n: int, *, seed: float = 0.42) -> list[Memory]:
        """A reproducible pseudo-random sample of live memories (verification queries)."""
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            conn.execute("SELECT setseed(%s)", (seed,))
            rows = conn.execute(
                f"SELECT {_FULL} FROM memories WHERE deleted_at IS NULL ORDER BY random() LIMIT %s",  # noqa: S608
                (n,),
            ).fetchall()
        return [row_to_memory(r) for r in rows]

    # ---- migration checkpoints ----------------------------------------------------------------
    def open_migration(self, target_model: str) -> dict[str, Any] | None:
        return fetch_one(
            self.pool,
            "SELECT * FROM embedding_migrations WHERE target_model = %s AND status IN ('copying', 'verifying')",
            (target_model,),
        )

    def any_open_migration(self) -> dict[str, Any] | None:
        return fetch_one(
            self.pool, "SELECT * FROM embedding_migrations WHERE status IN ('copying', 'verifying') ORDER BY id LIMIT 1"
        )

    def start_migration(self, source_model: str | None, target_model: str, spec: dict[str, Any]) -> dict[str, Any]:
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            row = conn.execute(
                "INSERT INTO embedding_migrations (source_model, target_model, target_spec) VALUES (%s, %s, %s)"
                " RETURNING *",
                (source_model, target_model, Jsonb(spec)),
            ).fetchone()
        assert row is not None
        return dict(row)

    def checkpoint(self, mig_id: int, last_id: uuid.UUID | None, copied: int) -> None:
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            conn.execute(
                "UPDATE embedding_migrations SET last_id = %s, copied = %s, updated_at = now() WHERE id = %s",
                (last_id, copied, mig_id),
            )

    def set_migration(self, mig_id: int, status: str, *, details: dict[str, Any] | None = None) -> None:
        finished = status in ("swapped", "rolled_back", "abandoned")
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            conn.execute(
                "UPDATE embedding_migrations SET status = %s, updated_at = now(),"
                " finished_at = CASE WHEN %s THEN now() ELSE finished_at END,"
                " details = details || %s WHERE id = %s",
                (status, finished, Jsonb(details or {}), mig_id),
            )

    def last_migration(self) -> dict[str, Any] | None:
        return fetch_one(self.pool, "SELECT * FROM embedding_migrations ORDER BY id DESC LIMIT 1")

    # ---- model registry (model_versions, kind 'embedding') ------------------------------------
    def embedding_models(self) -> list[dict[str, Any]]:
        return fetch_all(
            self.pool,
            "SELECT model_id, dim, status, manifest, created_at, activated_at FROM model_versions"
            " WHERE kind = 'embedding' ORDER BY id",
        )

    def active_embedding(self) -> dict[str, Any] | None:
        return fetch_one(
            self.pool,
            "SELECT model_id, dim, manifest, activated_at FROM model_versions"
            " WHERE kind = 'embedding' AND status = 'active' ORDER BY activated_at DESC NULLS LAST LIMIT 1",
        )

    def register_embedding(self, model_id: str, dim: int, spec: dict[str, Any] | None) -> None:
        """Known model (status 'registered' unless it already has one); its spec kept for rollback."""
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            conn.execute(
                "INSERT INTO model_versions (kind, model_id, dim, manifest) VALUES ('embedding', %s, %s, %s)"
                " ON CONFLICT (model_id) DO UPDATE SET manifest = model_versions.manifest || EXCLUDED.manifest",
                (model_id, dim, Jsonb({"embedder": spec} if spec else {})),
            )

    @contextmanager
    def exclusive(self, name: str) -> Iterator[bool]:
        """A session advisory lock held for the block; yields False if another process holds it."""
        key = int.from_bytes(name.encode()[:8].ljust(8, b"\0"), "big", signed=True)
        with pg_errors(), self.pool.connection() as conn:
            conn.autocommit = True
            row = conn.execute("SELECT pg_try_advisory_lock(%s) AS ok", (key,)).fetchone()
            got = bool(row and row["ok"])
            try:
                yield got
            finally:
                if got:
                    conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
                conn.autocommit = False

    def activate_embedding(self, model_id: str) -> None:
        """One transaction: ``model_id`` becomes the only active embedding model, others retire."""
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            conn.execute(
                "UPDATE model_versions SET status = 'retired',"
                " manifest = manifest || jsonb_build_object('retired_at', now())"
                " WHERE kind = 'embedding' AND status = 'active' AND model_id <> %s",
                (model_id,),
            )
            conn.execute(
                "UPDATE model_versions SET status = 'active', activated_at = now(), manifest = manifest - 'retired_at'"
                " WHERE kind = 'embedding' AND model_id = %s",
                (model_id,),
            )
