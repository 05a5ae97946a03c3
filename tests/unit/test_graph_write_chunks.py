"""How the graph core cuts a write into transactions (on Neo4j: tests/integration/test_graph_writes.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from memoryctl.errors import StoreTimeout
from memoryctl.stores.graph_core import chunks, split_on_timeout


def test_chunks_respect_the_budget_and_keep_order() -> None:
    weights = [3, 3, 3, 30, 1, 1, 5]
    cut = [list(c) for c in chunks(weights, 10, lambda w: w)]
    assert cut == [[3, 3, 3], [30], [1, 1, 5]]  # an item heavier than the budget goes alone
    assert [w for c in cut for w in c] == weights
    assert list(chunks([], 10, lambda w: w)) == []


def test_a_timeout_is_retried_in_halves_down_to_one_item() -> None:
    written: list[list[int]] = []

    def write(items: Sequence[int]) -> None:
        if len(items) > 3 or 13 in items:  # too big, or the one item that always times out
            raise StoreTimeout("neo4j", "timed out")
        written.append(list(items))

    split_on_timeout(list(range(10)), write)
    assert written == [[0, 1], [2, 3, 4], [5, 6], [7, 8, 9]]
    written.clear()
    with pytest.raises(StoreTimeout):
        split_on_timeout([11, 12, 13, 14], write)
    assert written == [[11, 12]]  # written before the item that cannot be written alone
