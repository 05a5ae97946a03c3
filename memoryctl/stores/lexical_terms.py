"""The lexical leg's word statistics (table ``lexical_terms``, schema 0007), kept by the writer,
and the names of the agent's entities (schema 0009: what ``query/dense_question.py`` looks up).

Every transaction that changes which live memories hold which words (insert, update of a live
memory, soft delete) changes the per-agent document frequencies by the difference, in the same
transaction, so a query reads them in a few index lookups instead of counting the memories that
share a word with it. Each agent also has the row of the empty word (which no tsvector holds): the
number of its live memories. Purging removes memories that are already soft-deleted: nothing to change.

One upsert per transaction, its rows in key order: two writers touching the same words (an agent's
row, a speaker's name) then wait for each other instead of deadlocking. The hot rows serialise an
agent's concurrent writers only for the rest of their (short) transactions.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from psycopg import Connection

# A memory's terms (schema 0009): its words, its entities' names ('entity ' + name) and ''.
_TERMS_OF = "SELECT agent_id, unnest(memoryctl_memory_terms(tsv, entities)) AS term FROM memories WHERE id = ANY(%s)"


def terms_of(conn: Connection[Any], ids: Sequence[uuid.UUID]) -> list[tuple[str, str]]:
    """(agent, term) for each word and entity name of these memories, and (agent, "") once per memory."""
    if not ids:
        return []
    return [(r["agent_id"], r["term"]) for r in conn.execute(_TERMS_OF, (list(ids),))]


def apply(
    conn: Connection[Any],
    *,
    added: Sequence[uuid.UUID] = (),
    removed: Sequence[uuid.UUID] = (),
    replaced: Sequence[tuple[str, str]] = (),
) -> None:
    """Count the words of the memories ``added``, uncount those of ``removed`` (as they are now)
    and the (agent, word) pairs ``replaced`` (read before an update changed them): one statement."""
    if not (added or removed or replaced):
        return
    conn.execute(
        "INSERT INTO lexical_terms (agent_id, term, df)"
        " SELECT agent_id, term, sum(d) FROM ("
        " SELECT agent_id, unnest(memoryctl_memory_terms(tsv, entities)) AS term,"
        " CASE WHEN id = ANY(%s) THEN 1 ELSE -1 END AS d FROM memories WHERE id = ANY(%s)"
        " UNION ALL SELECT a, t, -1 FROM unnest(%s::text[], %s::text[]) AS x(a, t)) AS delta"
        " GROUP BY agent_id, term HAVING sum(d) <> 0 ORDER BY agent_id, term"
        " ON CONFLICT (agent_id, term) DO UPDATE SET df = lexical_terms.df + EXCLUDED.df",
        (list(added), [*added, *removed], [a for a, _ in replaced], [t for _, t in replaced]),
    )
