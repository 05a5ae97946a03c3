"""Ordered id streams from the three stores and the merge-join that compares them.

Why a merge-join: reconciliation must scale to millions of ids without holding any store's id set
in memory. Every store's ``scroll`` yields keyset pages in ascending UUID order (PostgreSQL's
``uuid`` order, which is byte order; Qdrant orders UUID point ids the same way, server, local mode
and Edge alike; Neo4j stores the canonical lowercase text form, whose string order is that same
byte order). Walking the sorted streams side by side costs O(n) time and O(page) memory.

The order is a contract the adapters document (``VectorStore.scroll``/``GraphStore.scroll``), and
it is *checked* here as pages stream past: a page out of order is sorted (cheap, and harmless when
it already is); an id that goes backwards across pages raises ``StoreError`` instead of silently
reporting half a store as drift.

The join is page-at-a-time, driven by PostgreSQL (the source of truth): for each PostgreSQL page
with ids up to ``hi``, every other stream is advanced through ``hi`` (``bisect`` on its page, no
per-id Python comparison loop) and its rows are split into *matched* (keyed by id, for O(1)
lookups) and *unmatched* (orphans: nothing in PostgreSQL has that id). Pages of every stream are
fetched in background threads, one page ahead, so the three stores' round trips overlap each other
and the comparison.
"""

from __future__ import annotations

import queue
import threading
import uuid
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from memoryctl.errors import StoreError
from memoryctl.stores import names
from memoryctl.stores.protocols import GraphRecord, VectorRecord

T = TypeVar("T")
Key = Callable[[Any], uuid.UUID]


def row_key(row: dict[str, Any]) -> uuid.UUID:
    """The join key of a PostgreSQL row."""
    key: uuid.UUID = row["id"]
    return key


def record_key(record: VectorRecord | GraphRecord) -> uuid.UUID:
    """The join key of a vector or graph record."""
    return record.id


def ordered_pages(
    pages: Iterable[list[T]], key: Callable[[T], uuid.UUID], store: str
) -> Iterator[tuple[list[T], list[uuid.UUID]]]:
    """Each page with its keys, strictly ascending within and across pages (verified)."""
    last: uuid.UUID | None = None
    for page in pages:
        if not page:
            continue
        keys = [key(r) for r in page]
        if any(keys[i] >= keys[i + 1] for i in range(len(keys) - 1)):
            page = sorted(page, key=key)
            keys = [key(r) for r in page]
            if any(keys[i] == keys[i + 1] for i in range(len(keys) - 1)):
                raise StoreError(store, f"scroll returned id {keys[0]} twice in one page")
        if last is not None and keys[0] <= last:
            raise StoreError(
                store,
                f"scroll is not in ascending id order ({keys[0]} after {last})",
                hint="reconciliation merge-joins id-ordered pages; this adapter breaks that contract",
            )
        last = keys[-1]
        yield page, keys


_DONE = object()


def prefetch(source: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Iterate ``source`` in a daemon thread, ``depth`` items ahead; errors re-raised in order."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def run() -> None:
        try:
            for item in source:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(_DONE)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            q.put(exc)

    t = threading.Thread(target=run, daemon=True, name="memoryctl-prefetch")
    t.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


class _Cursor:
    """A position in an ordered page stream; hands out the rows up to a given id."""

    def __init__(self, pages: Iterator[tuple[list[Any], list[uuid.UUID]]]) -> None:
        self.pages = pages
        self.page: list[Any] = []
        self.keys: list[uuid.UUID] = []
        self.pos = 0
        self.done = False

    def through(self, hi: uuid.UUID | None) -> Iterator[tuple[list[Any], list[uuid.UUID]]]:
        """Slices of rows with id <= ``hi`` (everything left when ``hi`` is None)."""
        while not self.done:
            if self.pos >= len(self.page):
                nxt = next(self.pages, None)
                if nxt is None:
                    self.done = True
                    return
                self.page, self.keys = nxt
                self.pos = 0
            end = len(self.keys) if hi is None else bisect_right(self.keys, hi, self.pos)
            if end > self.pos:
                yield self.page[self.pos : end], self.keys[self.pos : end]
            more = end >= len(self.keys)  # the page is used up: the next one may still be <= hi
            self.pos = end
            if not more:
                return


@dataclass(slots=True)
class JoinChunk:
    """One PostgreSQL page (may be empty for orphan-only chunks) and what the others hold for it."""

    rows: list[Any]
    matched: list[dict[uuid.UUID, Any]] = field(default_factory=list)  # per other stream, by id
    unmatched: list[list[Any]] = field(default_factory=list)  # per other stream: ids PostgreSQL lacks


def paged_join(
    driver: Iterable[list[Any]],
    driver_key: Key,
    others: Sequence[tuple[Iterable[list[Any]], Key, str]],
    *,
    max_unmatched: int = 5000,
    prefetch_pages: bool = True,
) -> Iterator[JoinChunk]:
    """Full outer join by id, a PostgreSQL page at a time (see the module docstring).

    Memory is bounded by one page per stream plus ``max_unmatched`` orphans: a long run of ids
    that only another store has is handed out in orphan-only chunks of that size.
    """

    def source(pages: Iterable[list[Any]], key: Key, name: str) -> Iterator[tuple[list[Any], list[uuid.UUID]]]:
        it = ordered_pages(pages, key, name)
        return prefetch(it) if prefetch_pages else it

    cursors = [_Cursor(source(p, k, n)) for p, k, n in others]
    n = len(cursors)

    def collect(hi: uuid.UUID | None, ids: set[uuid.UUID], page: list[Any]) -> Iterator[JoinChunk]:
        matched: list[dict[uuid.UUID, Any]] = [{} for _ in range(n)]
        unmatched: list[list[Any]] = [[] for _ in range(n)]
        for i, cur in enumerate(cursors):
            m, u = matched[i], unmatched[i]
            for rows, keys in cur.through(hi):
                for row, k in zip(rows, keys, strict=True):
                    if k in ids:
                        m[k] = row
                    else:
                        u.append(row)
                if len(u) >= max_unmatched:
                    flush: list[list[Any]] = [[] for _ in range(n)]
                    flush[i] = u
                    yield JoinChunk([], [{} for _ in range(n)], flush)
                    u = unmatched[i] = []
        yield JoinChunk(page, matched, unmatched)

    for page, keys in source(driver, driver_key, names.POSTGRES):
        yield from collect(keys[-1], set(keys), page)
    yield from collect(None, set(), [])
