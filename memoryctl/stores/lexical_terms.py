"""The lexical leg's word statistics (table ``lexical_terms``, schema 0007), kept by the writer.

Every transaction that changes which live memories hold which words (insert, update of a live
memory, soft delete) changes the per-agent document frequencies by the difference, in the same
transaction, so a query reads them in a few index lookups instead of counting the memories that
share a word with it. Purging removes memories that are already soft-deleted: nothing to change.

One upsert per transaction, its rows in key order: two writers touching the same words (an agent's
row, a speaker's name) then wait for each other instead of deadlocking. The hot rows serialise an
agent's concurrent writers only for the rest of their (short) transactions.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from psycopg import Connection

# The agent's own row: the number of its live memories (no tsvector holds the empty word).
SCOPE_TERM = ""

_TERMS = "SELECT agent_id, unnest(memoryctl_lexical_terms(tsv) || ''::text) AS term FROM memories WHERE id = ANY(%s)"


def terms_of(conn: Connection[Any], ids: Sequence[uuid.UUID]) -> list[tuple[str, str]]:
    """(agent, word) for each word of these memories, and (agent, "") once per memory."""
    if not ids:
        return []
    return [(r["agent_id"], r["term"]) for r in conn.execute(_TERMS, (list(ids),))]


def apply(conn: Connection[Any], *, added: Iterable[tuple[str, str]], removed: Iterable[tuple[str, str]]) -> None:
    """Add one to each (agent, word) of ``added``, take one from each of ``removed``."""
    delta: Counter[tuple[str, str]] = Counter(added)
    delta.subtract(removed)
    changed = [(key, d) for key, d in delta.items() if d]
    if not changed:
        return
    conn.execute(
        "INSERT INTO lexical_terms (agent_id, term, df)"
        " SELECT a, t, d FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS x(a, t, d) ORDER BY a, t"
        " ON CONFLICT (agent_id, term) DO UPDATE SET df = lexical_terms.df + EXCLUDED.df",
        ([k[0] for k, _ in changed], [k[1] for k, _ in changed], [d for _, d in changed]),
    )
