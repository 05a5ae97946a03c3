"""Conversational context: a memory read together with the memories written just before it.

One memory per dialogue turn is how an agent stores a conversation, and a turn often means
nothing alone: "it's about how we cut build times in half" answers "subject of Ravi's KubeCon
talk" only after "my talk got accepted at KubeCon" and "amazing, what's the topic?". Neither text
leg can see that: the words and the meaning are in the turns before it. So a text ranking reads
each candidate with its context, the ``CONTEXT_TURNS`` memories of the same agent written just
before it (in scope, live, in ``created_at`` order and then write order: a conversation is
written in order), and
gives it the relevance of the passage when that is higher than its own:

    score = max(own, (own + best of the context) / 2)

The mean weighs the turn and its context equally (a passage of the two), and the ``max`` keeps
the context from ever lowering a turn: a memory that answers alone keeps its score, and the one
that gave the context stays ahead of the turn it lifted (the mean lies between the two). The
memories written just after a candidate join the candidates (their own relevance is the floor of
what the legs returned, an upper bound of what the legs would give them), so the turn that
completes a hit can be found although neither leg returned it.

Two turns of context: the turn before (often the other party's reply or question) and the
speaker's own turn before that. Why two, and the alternatives measured: docs/retrieval.md,
"Conversational context" and "Measured when each rule was built".
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta

# How many memories written just before a candidate are read as its context (and how many just
# after it join the candidates); ``[query] context_turns``, 0 turns the context off.
CONTEXT_TURNS = 2
# How much earlier a context turn may have been written: the next turn of a conversation, not the
# first turn of the next one days later. Memories written at the same instant are ordered by the
# order they were written in (schema 0008's ``seq``): a loader that stamps every turn of a session
# with the session's time writes them in the conversation's order. Memories written before 0008
# have no write order and, at one instant, give each other no context (docs/retrieval.md).
CONTEXT_WITHIN = timedelta(hours=1)


def in_context(
    relevance: Mapping[uuid.UUID, float], before: Mapping[uuid.UUID, Sequence[uuid.UUID]]
) -> dict[uuid.UUID, float]:
    """Per candidate whose context lifts it: the passage's relevance, the mean of its own and the
    best of its context's (``before[id]``; a context memory that is not a candidate scores the
    floor, the lowest candidate's). Candidates the context does not lift are absent."""
    if not relevance:
        return {}
    floor = min(relevance.values())
    lifted: dict[uuid.UUID, float] = {}
    for mid, own in relevance.items():
        context = max((relevance.get(b, floor) for b in before.get(mid, ())), default=floor)
        passage = (own + context) / 2
        if passage > own:
            lifted[mid] = passage
    return lifted
