"""In-memory fakes of memoryctl's own store protocols, for fast executor tests (named as such).

In the style of httpx's ``MockTransport``: each fake answers from a small in-memory world with the
semantics the protocol documents (brute force, no index), logs every call, and fails on demand
(``fail["search"] = StoreUnavailable(...)``), so a test states what the stores hold and checks
which calls the executor made, in what order, with what filter, and what it answered. The real
adapters are tested against the real engines in tests/integration; these fakes stand in for them
only where the question is the plan, not the store.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from memoryctl.embed.hashing import HashEmbedder
from memoryctl.model import Memory
from memoryctl.query import dense_question
from memoryctl.query.spec import MemoryQuery, Where
from memoryctl.stores import names
from memoryctl.stores.protocols import GraphTraversal, MetaCondition, VectorFilter, VectorHit

EMBEDDER = HashEmbedder(dim=64)


@dataclass
class Calls:
    """What a fake was asked, in order: (method, arguments)."""

    log: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    fail: dict[str, Exception] = field(default_factory=dict)

    def __call__(self, method: str, **args: Any) -> None:
        self.log.append((method, args))
        if method in self.fail:
            raise self.fail[method]

    def names(self) -> list[str]:
        return [m for m, _ in self.log]

    def args(self, method: str) -> list[dict[str, Any]]:
        return [a for m, a in self.log if m == method]


def _compare(value: Any, op: str, wanted: Any) -> bool:
    if value is None:
        return False  # SQL semantics: a missing key satisfies no comparison
    if op == "in":
        return value in wanted
    if op == "=":
        return bool(value == wanted)
    if op == "!=":
        return bool(value != wanted)
    if isinstance(value, bool) or not isinstance(value, int | float | datetime):
        return False
    return {"<": value < wanted, "<=": value <= wanted, ">": value > wanted, ">=": value >= wanted}[op]


def where_holds(m: Memory, w: Where) -> bool:
    value = m.metadata.get(w.meta_key) if w.meta_key else getattr(m, w.field)
    return _compare(value, w.op, w.value)


def in_scope(m: Memory, q: MemoryQuery, *, with_where: bool = True) -> bool:
    """``relational.scope_sql`` in Python: live, the agent, [since, until), every where clause."""
    if m.deleted_at is not None or (q.agent_id is not None and m.agent_id != q.agent_id):
        return False
    if (q.since and m.created_at < q.since) or (q.until and m.created_at >= q.until):
        return False
    return not with_where or all(where_holds(m, w) for w in q.where)


def newest_first(memories: Sequence[Memory]) -> list[Memory]:
    return sorted(memories, key=lambda m: (-m.created_at.timestamp(), str(m.id)))


@dataclass
class World:
    """The source of truth the fakes share: memories by id."""

    memories: dict[uuid.UUID, Memory] = field(default_factory=dict)

    def add(self, *memories: Memory) -> None:
        for m in memories:
            self.memories[m.id] = m


class FakeRows:
    """``MemoryRows``: PostgreSQL's hydration."""

    def __init__(self, world: World) -> None:
        self.world, self.calls = world, Calls()

    def get_many(self, ids: Sequence[uuid.UUID], *, include_deleted: bool = False) -> dict[uuid.UUID, Memory]:
        self.calls("get_many", ids=list(ids))
        found = (self.world.memories.get(i) for i in ids)
        return {m.id: m for m in found if m is not None and (include_deleted or m.deleted_at is None)}


class FakeRelational:
    """``RelationalReads``: filter, full-text (shared words) and mentions over the world."""

    def __init__(self, world: World) -> None:
        self.world, self.calls = world, Calls()

    def filter(
        self, q: MemoryQuery, *, ids: Sequence[uuid.UUID] | None = None, limit: int, with_where: bool = True
    ) -> list[tuple[uuid.UUID, datetime]]:
        self.calls("filter", ids=None if ids is None else list(ids), limit=limit, with_where=with_where)
        among = set(ids) if ids is not None else None
        rows = [
            m
            for m in self.world.memories.values()
            if in_scope(m, q, with_where=with_where) and (among is None or m.id in among)
        ]
        return [(m.id, m.created_at) for m in newest_first(rows)[:limit]]

    def lexical(
        self,
        q: MemoryQuery,
        text: str,
        *,
        limit: int,
        ids: Sequence[uuid.UUID] | None = None,
        with_where: bool = True,
    ) -> list[tuple[uuid.UUID, float]]:
        self.calls("lexical", text=text, limit=limit, where=list(q.where) if with_where else [], ids=ids)
        words = set(text.lower().split())
        among = set(ids) if ids is not None else None
        scored = [
            (m.id, float(len(words & set(m.text.lower().split()) | words & {e.name.lower() for e in m.entities})))
            for m in newest_first(
                [
                    m
                    for m in self.world.memories.values()
                    if in_scope(m, q, with_where=with_where) and (among is None or m.id in among)
                ]
            )
        ]
        return sorted([s for s in scored if s[1] > 0], key=lambda s: -s[1])[:limit]

    def following(
        self, q: MemoryQuery, ids: Sequence[uuid.UUID], *, turns: int, within: timedelta, with_where: bool = True
    ) -> dict[uuid.UUID, list[uuid.UUID]]:
        self.calls("following", ids=list(ids), turns=turns, within=within)
        # the write order (schema 0008's seq): the world's dict keeps insertion order
        seq = {mid: n for n, mid in enumerate(self.world.memories)}
        out: dict[uuid.UUID, list[uuid.UUID]] = {}
        for i in ids:
            c = self.world.memories[i]
            later = [
                m
                for m in self.world.memories.values()
                if in_scope(m, q, with_where=with_where)
                and m.agent_id == c.agent_id
                and (c.created_at, seq[c.id]) < (m.created_at, seq[m.id])
                and m.created_at <= c.created_at + within
            ]
            out[i] = [m.id for m in sorted(later, key=lambda m: (m.created_at, seq[m.id]))[:turns]]
        return out

    def names_said(self, q: MemoryQuery, text: str) -> list[str]:
        self.calls("names_said", text=text)
        said = set(dense_question.grams(text))
        known = {
            " ".join(dense_question.words(e.name))
            for m in self.world.memories.values()
            if m.deleted_at is None and (q.agent_id is None or m.agent_id == q.agent_id)
            for e in m.entities
        }
        return sorted(said & known)

    def mentions(self, q: MemoryQuery, entity_type: str, entity_name: str, *, limit: int) -> list[uuid.UUID]:
        self.calls("mentions", entity=(entity_type, entity_name), limit=limit)
        rows = [
            m
            for m in self.world.memories.values()
            if in_scope(m, q, with_where=False)
            and any(e.type == entity_type and e.name.lower() == entity_name.lower() for e in m.entities)
        ]
        return [m.id for m in newest_first(rows)[:limit]]


def _vector_holds(m: Memory, flt: VectorFilter, *, deleted: bool) -> bool:
    """``VectorFilter`` semantics over a memory (what the payload replicates of it)."""
    if deleted and not flt.include_deleted:
        return False
    if flt.agent_id is not None and m.agent_id != flt.agent_id:
        return False
    if flt.ids is not None and m.id not in set(flt.ids):
        return False
    if flt.kinds is not None and m.kind not in flt.kinds:
        return False
    if flt.exclude_kinds and m.kind in flt.exclude_kinds:
        return False
    if flt.created_from is not None and m.created_at < flt.created_from:
        return False
    if flt.created_to is not None and m.created_at >= flt.created_to:
        return False
    return all(_meta_holds(m, c) for c in flt.meta)


def _meta_holds(m: Memory, c: MetaCondition) -> bool:
    return _compare(m.metadata.get(c.key), c.op, c.value)


class FakeVectors:
    """``VectorStore`` (search and count): exact cosine over the world, embedded by ``EMBEDDER``.

    ``stale`` ids are still "in the store" although PostgreSQL deleted them: a lagging replica.
    """

    name = names.QDRANT

    def __init__(self, world: World, *, stale: Sequence[uuid.UUID] = ()) -> None:
        self.world, self.calls = world, Calls()
        self.stale = set(stale)

    def search(
        self,
        vector: Sequence[float],
        flt: VectorFilter,
        limit: int,
        *,
        model_id: str,
        score_threshold: float | None = None,
        inactive_ok: bool = False,
    ) -> list[VectorHit]:
        self.calls("search", vector=list(vector), filter=flt, limit=limit, model_id=model_id, threshold=score_threshold)
        query = np.asarray(vector, dtype=np.float32)
        hits = []
        for m in self.world.memories.values():
            deleted = m.deleted_at is not None and m.id not in self.stale
            if not _vector_holds(m, flt, deleted=deleted):
                continue
            score = float(np.dot(query, EMBEDDER.embed_query(m.text)))
            if score_threshold is None or score >= score_threshold:
                hits.append(VectorHit(m.id, score, m.agent_id, m.created_at, m.kind))
        return sorted(hits, key=lambda h: (-h.score, str(h.id)))[:limit]

    def count(self, *, agent_id: str | None = None, model_id: str | None = None) -> int:
        self.calls("count", agent_id=agent_id)
        return sum(1 for m in self.world.memories.values() if agent_id is None or m.agent_id == agent_id)


class FakeGraph:
    """``GraphStore`` reads at one hop: the memories that mention the start entity.

    ``fanout`` answers the configured degree (what Neo4j's count store would say) or the true
    count; ``cheap_membership`` says whether ``connected`` costs per candidate.
    """

    name = names.NEO4J
    engine = "fake"

    def __init__(self, world: World, *, cheap_membership: bool = True, fanout: int | None = None) -> None:
        self.world, self.calls = world, Calls()
        self.cheap_membership = cheap_membership
        self._fanout = fanout

    def _reached(self, query: GraphTraversal) -> list[Memory]:
        return [
            m
            for m in self.world.memories.values()
            if m.deleted_at is None
            and (query.agent_id is None or m.agent_id == query.agent_id)
            and any(e.key(m.agent_id) == query.start_key for e in m.entities)
        ]

    def traverse(self, query: GraphTraversal) -> list[uuid.UUID]:
        self.calls("traverse", traversal=query)
        reached = self._reached(query)
        if query.newest_first:
            reached = [
                m
                for m in newest_first(reached)
                if (query.created_from is None or m.created_at >= query.created_from)
                and (query.created_to is None or m.created_at < query.created_to)
            ]
        else:
            reached = sorted(reached, key=lambda m: str(m.id))
        return [m.id for m in reached[: query.limit]]

    def fanout(self, query: GraphTraversal) -> int:
        self.calls("fanout", traversal=query)
        return self._fanout if self._fanout is not None else len(self._reached(query))

    def near_entities(self, query: GraphTraversal) -> frozenset[str] | None:
        self.calls("near_entities", traversal=query)
        return frozenset({query.start_key})

    def connected(
        self, query: GraphTraversal, ids: Sequence[uuid.UUID], *, near: frozenset[str] | None = None
    ) -> set[uuid.UUID]:
        self.calls("connected", ids=list(ids), near=near)
        reached = {m.id for m in self._reached(query)}
        return {i for i in ids if i in reached}

    def relationships(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[dict[str, Any]]]:
        self.calls("relationships", ids=list(ids))
        return {i: [{"type": "MENTIONS", "direction": "out", "node": {"fake": True}}] for i in ids}


class FakeRecalls:
    """``RecallLog``: the recall events a query wrote."""

    def __init__(self) -> None:
        self.calls = Calls()
        self.events: list[tuple[uuid.UUID, str | None, list[tuple[str, uuid.UUID, float]]]] = []

    def record_recalls(
        self, query_id: uuid.UUID, text: str | None, hits: Sequence[tuple[str, uuid.UUID, float]]
    ) -> None:
        self.calls("record_recalls", query_id=query_id)
        self.events.append((query_id, text, list(hits)))


def cosine_rank(world: World, q: MemoryQuery) -> list[uuid.UUID]:
    """The brute-force answer to a text query in scope: what every plan must agree with."""
    assert q.text is not None
    query = EMBEDDER.embed_query(q.text)
    scored = [(m.id, float(np.dot(query, EMBEDDER.embed_query(m.text)))) for m in world.memories.values()]
    scored = [s for s in scored if in_scope(world.memories[s[0]], q) and not math.isnan(s[1])]
    return [i for i, _ in sorted(scored, key=lambda s: (-s[1], str(s[0])))]
