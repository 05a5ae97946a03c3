"""A secondary store that could not be opened is tried again after a while (memoryctl.stack).

The resident service starts at boot, often before Neo4j on the index node answers: it must not
answer degraded until someone restarts it (found by the deploy test that reboots every node).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import memoryctl.stack
from memoryctl.config import load_settings
from memoryctl.errors import StoreUnavailable
from memoryctl.stack import REOPEN_AFTER_S, Stack
from memoryctl.stores import names


class Graph:
    def __init__(self) -> None:
        self.closed = False

    def ensure_schema(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_a_graph_store_that_was_down_is_opened_again_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = Stack(load_settings(Path("/dev/null"), profile="cluster"))
    now = [1000.0]
    monkeypatch.setattr(memoryctl.stack.time, "monotonic", lambda: now[0])
    attempts: list[Any] = []
    down = [True]

    def open_graph() -> Graph:
        attempts.append(now[0])
        if down[0]:
            raise StoreUnavailable("neo4j", "Couldn't connect to 10.77.0.2:7687")
        return Graph()

    monkeypatch.setattr(stack, "_open_graph", open_graph)
    assert stack.graph() is None and names.NEO4J in stack.unavailable
    now[0] += REOPEN_AFTER_S / 2
    assert stack.graph() is None and len(attempts) == 1  # not hammered on every query
    down[0] = False
    now[0] += REOPEN_AFTER_S / 2
    graph = stack.graph()
    assert isinstance(graph, Graph) and len(attempts) == 2
    assert names.NEO4J not in stack.unavailable  # the answer is no longer degraded
    now[0] += 10 * REOPEN_AFTER_S
    assert stack.graph() is graph and len(attempts) == 2  # an open store is kept
