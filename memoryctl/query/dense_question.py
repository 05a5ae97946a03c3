"""The question the dense leg embeds: the user's question without the names of entities it says.

A small bi-encoder weighs a name as heavily as the rest of a short question together. Asked "All
the risks Bob raised", MiniLM put "thanks Bob" (someone else's reply, cosine 0.46) far above Bob's
own "Honestly the pipeline having no automated rollback scares me" (0.25), and a speaker's name in
every turn of a "Name: text" transcript made all of that speaker's turns look alike. Who or what a
question names is judged exactly elsewhere: the entity leg (``fusion.with_named``: the memories
that carry the named entity) and the lexical leg (which matches entity names as words, schema
0005). So the dense leg judges what is asked about that the names do not say: it embeds the
question with the names removed, when something of the question is left (a question that is only
a name keeps it).

The names are those of entities the agent's live memories carry (``lexical_terms``, schema 0009),
said by the question as whole words: a name is removed only where the stack knows it as one, never
a capitalised word on a guess. What it was measured at (``benchmarks/recall.py``, the
``with-names`` method): docs/retrieval.md, "Names out of the dense leg".
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# The prefix of an entity name's term in lexical_terms (schema 0009's memoryctl_entity_terms).
TERM_PREFIX = "entity "
# Names of up to this many words are looked up ("Acme Corp", "the new Kubernetes cluster").
MAX_NAME_WORDS = 5

_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """Lower-cased words, as schema 0009 splits a name (PostgreSQL's ``\\W+`` on ``lower``)."""
    return _WORD.findall(text.lower())


def grams(text: str) -> list[str]:
    """Every run of 1..MAX_NAME_WORDS consecutive words of ``text``, as the name terms the question
    could say (without the prefix), each once, in order."""
    ws = words(text)
    out = {" ".join(ws[i : i + n]): None for n in range(1, MAX_NAME_WORDS + 1) for i in range(len(ws) - n + 1)}
    return list(out)


def without(text: str, names: Iterable[str]) -> str | None:
    """``text`` with every whole-word occurrence of ``names`` (and a possessive 's after one)
    removed, longest names first; None when no name was removed or nothing but names is left."""
    ordered = sorted({n for n in names if n}, key=lambda n: (-len(n), n))
    if not ordered:
        return None
    pattern = re.compile(
        r"(?<!\w)(?:" + "|".join(r"\W+".join(map(re.escape, n.split())) for n in ordered) + r")(?:['\u2019]s)?(?!\w)",
        re.IGNORECASE,
    )
    left, removed = pattern.subn(" ", text)
    left = " ".join(left.split())
    if not removed or not _WORD.search(left):
        return None
    return left
