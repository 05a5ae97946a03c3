"""What the executor needs from PostgreSQL, besides the vector and graph store protocols.

Small protocols instead of the record store and the pool: the executor only hydrates rows, runs
the relational reads of ``memoryctl.query.relational`` and records recalls, and the planner's
unit tests run it against in-memory implementations of exactly these.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol

from memoryctl.model import Memory
from memoryctl.query.spec import MemoryQuery


class MemoryRows(Protocol):
    def get_many(self, ids: Sequence[uuid.UUID], *, include_deleted: bool = False) -> dict[uuid.UUID, Memory]:
        """The memories as stored (the source of truth), by id; unknown ids are absent."""
        ...


class RelationalReads(Protocol):
    def filter(
        self, q: MemoryQuery, *, ids: Sequence[uuid.UUID] | None = None, limit: int, with_where: bool = True
    ) -> list[tuple[uuid.UUID, datetime]]:
        """Live memories in the query's scope (and where clauses), newest first, optionally among ``ids``."""
        ...

    def lexical(
        self,
        q: MemoryQuery,
        text: str,
        *,
        limit: int,
        ids: Sequence[uuid.UUID] | None = None,
        with_where: bool = True,
    ) -> list[tuple[uuid.UUID, float]]:
        """Memories in scope (optionally among ``ids``) sharing words with ``text``, best first:
        the lexical leg of hybrid retrieval, and the vector search's fallback."""
        ...

    def following(
        self, q: MemoryQuery, ids: Sequence[uuid.UUID], *, turns: int, within: timedelta, with_where: bool = True
    ) -> dict[uuid.UUID, list[uuid.UUID]]:
        """Per memory of ``ids``: the ``turns`` live memories in scope of its agent written next
        after it, at most ``within`` later (the turns it is the conversational context of)."""
        ...

    def names_said(self, q: MemoryQuery, text: str) -> list[str]:
        """Names of the scope's entities that ``text`` says as whole words, lower-cased
        (``query/dense_question.py``): what the dense leg leaves out of the question."""
        ...

    def mentions(self, q: MemoryQuery, entity_type: str, entity_name: str, *, limit: int) -> list[uuid.UUID]:
        """Memories in scope that mention the entity, newest first: the traversal's fallback."""
        ...


class RecallLog(Protocol):
    def record_recalls(
        self, query_id: uuid.UUID, text: str | None, hits: Sequence[tuple[str, uuid.UUID, float]]
    ) -> None:
        """One recall event per (agent, memory, score) hit, in rank order (the nightly job's input)."""
        ...
