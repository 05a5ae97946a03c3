"""Session-level context: a candidate whose conversation session also holds other relevant
candidates is more likely on the question's topic than one that stands alone.

A conversation is stored as sessions, runs of turns a few seconds or minutes apart with hours or
days between them, and a session is about a few topics: the turns that answer a question tend to
sit in a session where other turns match the question too. This is the passage/document
combination of passage retrieval (J. P. Callan, "Passage-level evidence in document retrieval",
SIGIR 1994: a passage is ranked with the evidence of the document around it), with a session as
the document and a turn as the passage. It needs no store call: the session of a candidate is
read from the candidates themselves, those of the same agent written within ``CONTEXT_WITHIN``
of each other (chained: one session is the candidates each at most that far from the previous
one), the same bound the conversational context uses for "the next turn of a conversation"
(``query/turns.py``).

Per candidate, its session's **support**: the sum of the positive relevance of the candidates of
its session (the relevance the text legs gave them; a candidate below this query's mean adds
nothing). Every turn of a session gets the same support, like every passage of a document gets
the document's score, so it never reorders turns of one session among themselves; the
candidate's own relevance counts in its session's support. Scaled to [0, 1] over the query's candidates (0 for the
least supported, 1 for the most), it is averaged into the relevance as one more leg with a
membership's spread (``fusion.with_preference``): it reorders among what the text legs found and
never outvotes them on one session. Memories that share no session with another candidate (notes
hours apart) have their own positive relevance as support, which orders them as the relevance
does: the leg reorders nothing there. The support is read from the relevance of the text legs,
before the named-entity and date legs: it says how much of the question the session's text
matches. The alternatives measured and what the leg was worth: docs/retrieval.md, "Session-level
context".
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from memoryctl.query.turns import CONTEXT_WITHIN


def session_of(stamps: Sequence[tuple[str, datetime]]) -> list[int]:
    """Per candidate (its agent and ``created_at``): the number of its session among these
    candidates. Candidates of one agent whose times are within ``CONTEXT_WITHIN`` of the previous
    one (in time order) share a session."""
    order = sorted(range(len(stamps)), key=lambda k: stamps[k])
    session = [0] * len(stamps)
    current = -1
    previous: tuple[str, datetime] | None = None
    for k in order:
        agent, at = stamps[k]
        if previous is None or previous[0] != agent or at - previous[1] > CONTEXT_WITHIN:
            current += 1
        session[k] = current
        previous = (agent, at)
    return session


def support(relevance: Sequence[float], stamps: Sequence[tuple[str, datetime]]) -> list[float]:
    """Per candidate, in [0, 1]: the positive relevance of the candidates of its session
    (``session_of``), scaled over these candidates; all 0 when every session's is the same."""
    session = session_of(stamps)
    total: dict[int, float] = {}
    for s, r in zip(session, relevance, strict=True):
        total[s] = total.get(s, 0.0) + max(0.0, r)
    raw = [total[s] for s in session]
    low, high = min(raw, default=0.0), max(raw, default=0.0)
    if high - low <= 1e-9:
        return [0.0] * len(raw)
    return [(v - low) / (high - low) for v in raw]
