"""The lexical leg's statements: the question's words, their weights, and the ranked memories.

The ranking (unchanged by this module's plan): a memory in scope scores the sum of the inverse
document frequencies, ``ln(1 + (N - df + 0.5) / (df + 0.5))`` over the scope's N live memories, of
the question's words it holds; ties newest first, then by id. The question's words lose the stop
words of English and keep at most their first five letters as a prefix (``volunteering`` matches
``volunteer``), a language-neutral stand-in for stemming. Chinese, Japanese and Korean text, which
puts no spaces between words, is matched by its character bigrams (schema 0010's
``memoryctl_cjk_grams``: a memory is indexed with its bigrams and single characters, a question
asks with its bigrams).

What it costs is bounded by what it returns, not by how many memories share a common word:

- **Weights** come from ``lexical_terms`` (per-agent document frequencies kept by the writer,
  ``stores/lexical_terms.py``) when the scope is an agent's (or every agent's) live memories: a
  few index lookups. A scope narrowed by time or ``where`` clauses has its own frequencies: when
  it holds fewer memories than the agent, they are counted over it (one pass over its memories
  that hold a word); when it holds as many, it is the same set and the statistics serve.
- **Candidates**: the memories holding a *rare* word (the words, rarest first, while their
  document frequencies add up to at most ``RARE_BUDGET``) are all scored. A memory holding only
  *common* words scores what its set of common words is worth, the same for every memory with that
  set: so for each of the (at most ``2**MAX_COMMON - 1``) sets, only its newest ``limit`` memories
  can be among the best ``limit``, read newest first from the (agent, created_at) index until
  found (skipping the holders of a rare word: they are scored already). Exact: every memory the
  whole-scope scoring put in the top ``limit`` is a candidate here, with the same score.

Below the budget, or when the graph's candidate ``ids`` bound the memories, or for every agent
(no index orders them by time), all words are scored as rare words: as before, in the memories
that hold any of them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from itertools import combinations
from typing import Any

from psycopg import sql

# Memories scored in full before the most frequent words are handled by word sets instead: a
# check per word each, a few milliseconds for this many (docs/serve.md has the measurements).
RARE_BUDGET = 5000
# At most 2**3 - 1 = 7 newest-first reads; more common words than that are scored as rare ones.
MAX_COMMON = 3

# The question's words: each a tsquery lexeme (quote_literal doubles quotes; a word holding a
# backslash, which quote_literal would turn into an E'' string, is dropped) and its key in
# lexical_terms (memoryctl_lexical_terms, schema 0007).
_WORDS = (
    "SELECT DISTINCT CASE WHEN length(w) >= 5 THEN left(w, 5) ELSE w END AS key,"
    " CASE WHEN length(w) >= 5 THEN quote_literal(left(w, 5)) || ':*' ELSE quote_literal(w) END AS tq"
    " FROM unnest(tsvector_to_array("
    "to_tsvector('simple', %s) || to_tsvector('simple', memoryctl_cjk_grams(%s, false)))) AS w"
    " WHERE position(chr(92) in w) = 0 AND to_tsvector('english', w) <> ''::tsvector"
)


@dataclass(frozen=True, slots=True)
class Word:
    tsquery: str  # 'rollb':* or 'bob'
    df: int  # memories in scope holding it
    # ln(1 + (N - df + 0.5) / (df + 0.5)) in NUMERIC: sums of them are exact, so a memory scores
    # the same whichever statement adds up its words, in whatever order.
    weight: Decimal


def words_sql(
    text: str, scope: sql.Composable, scope_params: list[Any], *, agent_id: str | None, scoped: bool
) -> tuple[sql.Composed, list[Any]]:
    """Each word of ``text`` with its weight from the statistics (``lexical_terms``): its document
    frequency ``df`` among the agent's (or every agent's) ``n`` live memories; and ``scope_n``, the
    size of the query's scope when it is ``scoped`` (time, where clauses): when that is less than
    ``n``, the weights are the scope's own (``recount_sql``)."""
    agent, agent_params = (sql.SQL("agent_id = %s"), [agent_id]) if agent_id is not None else (sql.SQL("TRUE"), [])
    scope_n = sql.SQL("(SELECT count(*) FROM memories WHERE {})").format(scope) if scoped else sql.SQL("n")
    query = sql.SQL(
        "WITH words AS MATERIALIZED ({}) SELECT tq, df, n, {} AS scope_n,"
        " ln(1.0 + ((n - df + 0.5) / (df + 0.5))) AS weight FROM (SELECT tq,"
        " (SELECT coalesce(sum(df), 0) FROM lexical_terms WHERE term = words.key AND {})::bigint AS df,"
        " (SELECT coalesce(sum(df), 0) FROM lexical_terms WHERE term = '' AND {})::bigint AS n FROM words) AS counted"
    ).format(sql.SQL(_WORDS), scope_n, agent, agent)
    return query, [text, text, *(scope_params if scoped else []), *agent_params, *agent_params]


def weigh(rows: Sequence[dict[str, Any]]) -> list[Word]:
    """The words in a fixed order (the statement's parameters are then the same for the same words)."""
    return sorted((Word(r["tq"], int(r["df"]), r["weight"]) for r in rows), key=lambda w: w.tsquery)


def recount_sql(
    words: Sequence[Word], scope: sql.Composable, scope_params: list[Any], *, n: int
) -> tuple[sql.Composed, list[Any]]:
    """The words' document frequencies and weights among the ``n`` memories of a narrower scope, in
    ``words``' order: one pass over the memories in it that hold any of them."""
    counts = sql.SQL(", ").join(sql.SQL("count(*) FILTER (WHERE tsv @@ %s::tsquery)") for _ in words)
    query = sql.SQL(
        "SELECT x.df, ln(1.0 + ((%s::bigint - x.df + 0.5) / (x.df + 0.5))) AS weight"
        " FROM (SELECT ARRAY[{}] AS df FROM memories WHERE tsv @@ %s::tsquery AND {}) AS c,"
        " unnest(c.df) WITH ORDINALITY AS x(df, i) ORDER BY x.i"
    ).format(counts, scope)
    any_word = " | ".join(w.tsquery for w in words)
    return query, [n, *(w.tsquery for w in words), any_word, *scope_params]


def reweigh(words: Sequence[Word], rows: Sequence[dict[str, Any]]) -> list[Word]:
    return [Word(w.tsquery, int(r["df"]), r["weight"]) for w, r in zip(words, rows, strict=True)]


def split(words: Sequence[Word], *, bounded: bool) -> tuple[list[Word], list[Word]]:
    """(rare, common): the rarest words while their frequencies fit the budget; at most MAX_COMMON
    common ones. ``bounded``: the candidates are bounded otherwise (ids), or cannot be read newest
    first: every word is rare."""
    if bounded:
        return list(words), []
    rare: list[Word] = []
    total = 0
    by_df = sorted(words, key=lambda w: (w.df, w.tsquery))
    for i, w in enumerate(by_df):
        total += w.df
        if total > RARE_BUDGET and len(by_df) - i <= MAX_COMMON:
            return rare, by_df[i:]
        rare.append(w)
    return rare, []


def ranked_sql(
    words: Sequence[Word],
    common: Sequence[Word],
    scope: sql.Composable,
    scope_params: list[Any],
    *,
    limit: int,
    ids: Sequence[uuid.UUID] | None,
) -> tuple[sql.Composed, list[Any]]:
    """The best ``limit`` memories: every holder of a rare word scored in full, plus the newest
    ``limit`` holders of each set of common words (and of no rare one) at that set's score."""
    parts: list[sql.Composable] = []
    params: list[Any] = []
    rare = [w for w in words if w not in common]
    if rare:
        chosen, chosen_params = (sql.SQL("id = ANY(%s)"), [list(ids)]) if ids is not None else (sql.SQL("TRUE"), [])
        score = sql.SQL(" + ").join(sql.SQL("CASE WHEN tsv @@ %s::tsquery THEN %s::numeric ELSE 0 END") for _ in words)
        parts.append(
            sql.SQL("SELECT id, created_at, {} AS score FROM memories WHERE tsv @@ %s::tsquery AND {} AND {}").format(
                score, scope, chosen
            )
        )
        params += [p for w in words for p in (w.tsquery, w.weight)]
        params += [" | ".join(w.tsquery for w in rare), *scope_params, *chosen_params]
    for size in range(1, len(common) + 1):
        for held in combinations(common, size):
            # ts_match_vq is the @@ operator's function: the GIN index is not offered, so the scan
            # reads the scope newest first and stops at ``limit`` (every such set is frequent).
            parts.append(
                sql.SQL(
                    "(SELECT id, created_at, %s::numeric AS score FROM memories WHERE ts_match_vq(tsv, %s::tsquery)"
                    " AND {} ORDER BY created_at DESC, id LIMIT %s)"
                ).format(scope)
            )
            query = " & ".join(w.tsquery if w in held else f"!{w.tsquery}" for w in words)
            params += [sum((w.weight for w in held), Decimal(0)), query, *scope_params, limit]
    # The parts are disjoint: a memory holds a rare word or exactly one set of common words.
    statement = sql.SQL("SELECT id, score FROM ({}) AS c ORDER BY score DESC, created_at DESC, id LIMIT %s").format(
        sql.SQL(" UNION ALL ").join(parts)
    )
    return statement, [*params, limit]
