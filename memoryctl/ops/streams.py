"""Ordered id streams from the three stores and the merge-join that compares them.

Why a merge-join: reconciliation must scale to millions of ids without holding any store's id set
in memory. Every store's ``scroll`` yields keyset pages in ascending UUID order (PostgreSQL's
``uuid`` order, which is byte order; Qdrant orders UUID point ids the same way, server, local mode
and Edge alike; Neo4j stores the canonical lowercase text form, whose string order is that same
byte order). Walking the three sorted streams side by side costs O(n) time and O(page) memory.

The order is a contract the adapters document, and it is *checked* here as the rows stream past:
within a page, rows are sorted (cheap, and harmless when they already are); across pages, an id
that goes backwards raises ``StoreError`` instead of silently reporting half the store as drift.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from memoryctl.errors import StoreError

T = TypeVar("T")


def ordered(pages: Iterable[list[T]], key: Callable[[T], uuid.UUID], store: str) -> Iterator[T]:
    """Flatten keyset pages into one strictly ascending stream, verifying the order."""
    last: uuid.UUID | None = None
    for page in pages:
        for row in sorted(page, key=key):
            k = key(row)
            if last is not None and k <= last:
                raise StoreError(
                    store,
                    f"scroll is not in ascending id order ({k} after {last})",
                    hint="reconciliation merge-joins id-ordered pages; this adapter breaks that contract",
                )
            last = k
            yield row


@dataclass(slots=True)
class Joined(Generic[T]):
    id: uuid.UUID
    rows: list[Any | None]  # one slot per input stream, None where that stream lacks the id


class _Head:
    __slots__ = ("it", "key", "row")

    def __init__(self, it: Iterator[Any], key: Callable[[Any], uuid.UUID]) -> None:
        self.it = it
        self.key = key
        self.row: Any | None = next(it, None)


def merge_join(streams: list[tuple[Iterator[Any], Callable[[Any], uuid.UUID]]]) -> Iterator[Joined[Any]]:
    """Full outer join by id of ascending streams: one ``Joined`` per id present anywhere."""
    heads = [_Head(it, key) for it, key in streams]
    while True:
        current = [h.key(h.row) for h in heads if h.row is not None]
        if not current:
            return
        low = min(current)
        rows: list[Any | None] = []
        for h in heads:
            if h.row is not None and h.key(h.row) == low:
                rows.append(h.row)
                h.row = next(h.it, None)
            else:
                rows.append(None)
        yield Joined(low, rows)
