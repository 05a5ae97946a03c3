"""``memory_events``: what was recalled for which query, and what the caller said about it.

The one owner of that table. Queries append ``recall`` events (rank, score and the query text),
``memoryctl feedback`` appends ``feedback`` events about a recall, and the nightly job reads the
pairs marked useful as the embedding adapter's training data.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from memoryctl.errors import NotFoundError
from memoryctl.stores.pg import Pool, fetch_all, pg_errors


class EventLog:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def record_recalls(
        self, query_id: uuid.UUID, text: str | None, hits: Sequence[tuple[str, uuid.UUID, float]]
    ) -> None:
        """One ``recall`` event per hit (agent, memory, score), ranks from 1 in the given order."""
        with pg_errors(), self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO memory_events (agent_id, memory_id, query_id, event, payload)"
                " VALUES (%s, %s, %s, 'recall', %s)",
                [
                    (agent, mid, query_id, Jsonb({"rank": rank, "score": score, "text": text}))
                    for rank, (agent, mid, score) in enumerate(hits, start=1)
                ],
            )

    def record_feedback(self, query_id: uuid.UUID, memory_id: uuid.UUID, *, useful: bool) -> None:
        """A ``feedback`` event about one recall; refused when that query did not recall that memory."""
        with pg_errors(), self.pool.connection() as conn, conn.transaction():
            recall = conn.execute(
                "SELECT agent_id FROM memory_events WHERE event = 'recall' AND query_id = %s AND memory_id = %s"
                " LIMIT 1",
                (query_id, memory_id),
            ).fetchone()
            if recall is None:
                raise NotFoundError(
                    f"memory {memory_id} was not recalled by query {query_id}",
                    hint="use the query_id and a hit id from `memoryctl query --json`",
                )
            conn.execute(
                "INSERT INTO memory_events (agent_id, memory_id, query_id, event, payload)"
                " VALUES (%s, %s, %s, 'feedback', %s)",
                (recall["agent_id"], memory_id, query_id, Jsonb({"useful": useful})),
            )

    def useful_pairs(self, since: datetime | None) -> list[dict[str, Any]]:
        """(query text, memory) pairs whose recall was marked useful after ``since``, one row per pair."""
        return fetch_all(
            self.pool,
            "SELECT DISTINCT ON (f.query_id, f.memory_id) f.query_id::text || ':' || f.memory_id::text AS id,"
            " r.payload ->> 'text' AS query, m.text AS positive, m.id::text AS positive_id,"
            " f.query_id::text AS query_id"
            " FROM memory_events f"
            " JOIN memory_events r ON r.event = 'recall' AND r.query_id = f.query_id"
            " AND r.memory_id = f.memory_id"
            " JOIN memories m ON m.id = f.memory_id AND m.deleted_at IS NULL"
            " WHERE f.event = 'feedback' AND (f.payload ->> 'useful')::boolean"
            " AND r.payload ->> 'text' IS NOT NULL AND (%s::timestamptz IS NULL OR f.time > %s)"
            " ORDER BY f.query_id, f.memory_id, f.time DESC",
            (since, since),
        )
