"""Putting scores from different legs and models on one scale, and preferring recent memories
only among comparably relevant ones.

**Text queries (hybrid).** The dense leg scores by cosine similarity, whose range depends on the
model (multilingual-e5 puts unrelated pairs at 0.66-0.79, MiniLM near 0); the lexical leg by a
BM25-style sum of inverse document frequencies, unbounded. ``relevance`` standardises each leg
over the candidates of this query (the union of what the legs returned): a z-score says how far
above this query's typical candidate a memory is, in that leg's own spread, whatever the model or
the scoring function. A candidate one leg did not return gets that leg's floor, an upper bound of
what it would score: the lowest score the leg returned (lexical: 0, no shared word, when the leg
returned fewer hits than its depth, see ``text_scales``).
The legs are averaged with equal weights: standardised legs are exchangeable, and unequal weights
would be a constant tuned to one data set. Each leg is read ``plan.depth`` deep (30 for ten hits).
The weightings and depths measured against these: docs/retrieval.md, "Measured when each rule
was built".

Two corrections keep a standardised leg from claiming more than its scores say:

- **A spread too small to be evidence is not stretched to one.** The lexical leg's spread is
  taken as at least ``ln 2``, the weight of a word that half the candidates contain (one bit):
  a question whose only matching word is a name every candidate shares gives scores a few
  thousandths apart, which a plain z-score turned into ±1 standard deviation, the same vote as a
  rare word.
- **A soft clip**, ``Z_CLIP * tanh(z / Z_CLIP)``: bounded like the former hard clip to ±3, so no
  leg outvotes the other on one outlier, but strictly increasing, so two candidates that both
  stand out keep their order instead of tying at the clip (where the tie then went to whichever
  leg listed first, or to the newer memory).

Not min-max normalisation: it gives a leg's best hit 1.0 however weak it is; z-scores of a flat
leg stay near 0. Not reciprocal rank fusion for the text legs: it uses ranks only and throws away
how far apart the scores are (what it measured at: docs/retrieval.md).

**Entities the question names.** Over the candidates being ranked (hydrated, so their entities
are known), a third leg: whether the memory mentions an entity whose name the question says as
whole words ("When Hana raised the GPU hours issue" names ``Speaker:Hana``). Standardised like the
others (with a membership's spread, see ``MEMBERSHIP_SPREAD``) and averaged in as a third of the
vote, so it reorders only within what the text legs found. The lexical leg already matches names
as words, but a name shared by a third of the scope weighs about one nat there, against four to
eight for a rare content word: a reply by someone else that repeats the rare words outranked the
named person's own turn. Only when the
question names some but not all of the candidates' entities; otherwise the relevance is left as
the text legs made it.

**Recency (opt-in).** Without a half-life, the default, relevance alone ranks. With one
(``--half-life 30d``, ``[query] half_life``), ``rank_score`` adds a bounded preference for newer
memories to the relevance:
``relevance + RECENCY_WEIGHT * spread * 0.5 ** (age / half_life)``, where ``spread`` is the
standard deviation of relevance over the candidates being ranked and the age is counted from the
newest candidate (so the order does not depend on when the query runs). The recency term lies in
(0, 1], so a memory more relevant by more than ``RECENCY_WEIGHT`` of this query's spread always
ranks first, however old; among memories within that band, the newer wins. The band is in units of
the query's own spread because relevance (a mean of soft-clipped z-scores) has no fixed scale: its
spread shrinks when the legs disagree, and a fixed band was a larger share of it exactly there.
The term is added, not multiplied into the score: cosine scores differ by a few hundredths, so a
multiplier halving every month let an older answer lose to anything newer. It is not the default:
a preference for newer memories was no gain where the evidence is spread over months
(docs/retrieval.md, "Relevance ranks; recency is opt-in"). Exactly equal scores go to the newer
memory, then the lower id, with or without a half-life (``ranking.order``).

**``or`` queries: reciprocal rank fusion (RRF)** across legs (text, graph, where): their scores
are not on one scale (a hop count, a match) and RRF uses ranks only (k = 60, Cormack et al.
2009). The graph and where legs only say "member or not": their order (newest first) is not a
relevance, so every member gets the contribution of rank 1 and only the text leg ranks.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

RRF_K = 60
Z_CLIP = 3.0
# In standard deviations of relevance over the query's candidates: the largest gap recency may
# close. A tie-breaker among near-equal relevance (near-duplicates, a fact restated); wider bands
# measured: docs/retrieval.md.
RECENCY_WEIGHT = 0.05


@dataclass(frozen=True, slots=True)
class LegScale:
    """How one leg's raw scores are standardised: ``floor``, the score of a candidate the leg did
    not return (None: the lowest score it returned); ``min_spread``, the smallest standard
    deviation taken as evidence, in the leg's own units."""

    floor: float | None
    min_spread: float = 0.0


# The dense leg's floor is its lowest returned cosine (what it did not return scores at most that);
# its units depend on the model, so no spread is assumed. The lexical leg scores in nats of inverse
# document frequency: one bit (ln 2, a word half the candidates contain) is the least spread worth
# standardising, and a candidate it did not return shares no word (0) unless the leg was cut at
# its depth (see ``text_scales``).
TEXT_LEGS = {"vector": LegScale(None), "lexical": LegScale(0.0, math.log(2))}


def text_scales(legs: Mapping[str, Sequence[object]], depth: int) -> dict[str, LegScale]:
    """``TEXT_LEGS`` for these legs: a lexical leg that returned ``depth`` hits was cut there, so a
    candidate it did not return may share words too and scores at most its lowest hit, like the
    dense leg's floor. Taking 0 for those (a speaker's name, shared by half the scope, lifts every
    memory above 0) sank every candidate only the dense leg found (docs/retrieval.md)."""
    if len(legs.get("lexical", ())) < depth:
        return TEXT_LEGS
    return {**TEXT_LEGS, "lexical": LegScale(None, TEXT_LEGS["lexical"].min_spread)}


def rrf(
    legs: Mapping[str, Sequence[uuid.UUID]], k: int = RRF_K, *, membership: frozenset[str] = frozenset()
) -> dict[uuid.UUID, dict[str, float]]:
    """Per id: each leg's RRF contribution; the fused score is their sum. Legs named in
    ``membership`` are sets: every member gets the contribution of rank 1."""
    parts: dict[uuid.UUID, dict[str, float]] = {}
    for leg, ids in legs.items():
        for rank, mid in enumerate(ids, start=1):
            parts.setdefault(mid, {})[leg] = 1.0 / (k + (1 if leg in membership else rank))
    return parts


def _z(values: Sequence[float], min_spread: float = 0.0) -> list[float]:
    """Standard scores, soft-clipped to ±Z_CLIP; all 0 when the values do not spread at all. The
    spread is taken as at least ``min_spread``: differences below it are not evidence."""
    mean = sum(values) / len(values)
    sd = max(spread(values), min_spread)
    if sd <= 1e-9:
        return [0.0] * len(values)
    return [Z_CLIP * math.tanh((v - mean) / sd / Z_CLIP) for v in values]


def relevance(
    legs: Mapping[str, Sequence[tuple[uuid.UUID, float]]], scales: Mapping[str, LegScale]
) -> dict[uuid.UUID, dict[str, float]]:
    """Per candidate: each leg's raw score (where it returned one) and ``relevance``, the mean of
    the legs' soft-clipped z-scores over the union of candidates, each leg standardised as
    ``scales[leg]`` says."""
    scored = {leg: dict(hits) for leg, hits in legs.items() if hits}
    ids = list(dict.fromkeys(i for hits in legs.values() for i, _ in hits))
    parts: dict[uuid.UUID, dict[str, float]] = {i: {} for i in ids}
    if not ids:
        return parts
    for leg, got in scored.items():
        scale = scales.get(leg, LegScale(None))
        fill = min(got.values()) if scale.floor is None else scale.floor
        for i, z in zip(ids, _z([got.get(i, fill) for i in ids], scale.min_spread), strict=True):
            parts[i]["relevance"] = parts[i].get("relevance", 0.0) + z / len(scored)
            if i in got:
                parts[i][leg] = got[i]
    return parts


_WORD = re.compile(r"\w+")
# A membership (0 or 1) spreads by at most 0.5, a fair coin's deviation. Taken as its spread
# whatever the share, it puts a member 2 units above a non-member: the distance between a text
# leg's typical hit and typical miss (+1 and -1). Its plain z-score would make a membership rare
# among the candidates an outlier (one in thirty: +5.4), outvoting a text leg on a common name.
MEMBERSHIP_SPREAD = 0.5


def _words(text: str) -> str:
    return " " + " ".join(_WORD.findall(text.casefold())) + " "


def names_any(question: str, names: Iterable[str]) -> bool:
    """Whether ``question`` says one of ``names`` as whole words (case-folded, punctuation ignored)."""
    said = _words(question)
    return any(len(name) > 2 and name in said for name in map(_words, names))


def with_named(relevances: Sequence[float], named: Sequence[bool], legs: int = len(TEXT_LEGS)) -> list[float]:
    """The relevance of ``legs`` legs with the named-entity leg averaged in as one more
    (standardised over these candidates like the others); unchanged when it cannot tell them
    apart. It weighs one leg's share whichever text legs answered: a failed vector store must not
    double its say."""
    return with_preference(relevances, [1.0 if n else 0.0 for n in named], legs)


def with_preference(relevances: Sequence[float], values: Sequence[float], legs: int) -> list[float]:
    """The relevance of ``legs`` legs with one more leg averaged in: ``values`` in [0, 1] (a
    membership, or how close a memory is to what the question names), standardised with a
    membership's spread (``MEMBERSHIP_SPREAD``), so that the leg reorders among what the text legs
    found and never outvotes them on a rare value. Unchanged when every value is the same."""
    if max(values, default=0.0) - min(values, default=0.0) <= 1e-9:
        return list(relevances)
    z = _z(list(values), MEMBERSHIP_SPREAD)
    return [(legs * r + e) / (legs + 1) for r, e in zip(relevances, z, strict=True)]


def recency(created_at: datetime, newest: datetime, half_life: timedelta) -> float:
    """0.5 ** (age / half_life), the age counted from the newest candidate."""
    age = max(0.0, (newest - created_at).total_seconds())
    return math.pow(0.5, age / half_life.total_seconds())


def spread(values: Sequence[float]) -> float:
    """The standard deviation over this query's candidates (0 below two): a leg's, for its
    z-scores; the relevance's, as the unit of the recency band."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / n)


def rank_score(relevance_: float, recency_: float, spread_: float) -> float:
    """Relevance first; recency reorders only memories within RECENCY_WEIGHT * spread_ of each other."""
    return relevance_ + RECENCY_WEIGHT * spread_ * recency_
