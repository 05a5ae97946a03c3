"""A secondary store that could not be opened is tried again after a while (memoryctl.stack).

The resident service starts at boot, often before Neo4j on the index node answers: it must not
answer degraded until someone restarts it (found by the deploy test that reboots every node).
"""

from __future__ import annotations

import threading
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


class SlowGraph(Graph):
    """A graph whose opening takes a while: its schema check says it started, then waits."""

    def __init__(self, started: threading.Event, go_on: threading.Event) -> None:
        super().__init__()
        self.started, self.go_on = started, go_on

    def ensure_schema(self) -> None:
        self.started.set()
        assert self.go_on.wait(10)


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


def test_one_thread_opens_a_store_and_a_failing_attempt_never_undoes_a_successful_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``memoryctl serve``'s requests all found the store due after an outage; one attempt succeeded
    while another failed, the failure put None back (closing the new store) and the success then
    cleared the failure's time: the store was never tried again ("unavailable" until a restart).
    Now one thread opens it; the others answer with what there is meanwhile."""
    stack = Stack(load_settings(Path("/dev/null"), profile="cluster"))
    now = [1000.0]
    monkeypatch.setattr(memoryctl.stack.time, "monotonic", lambda: now[0])
    attempts: list[str] = []
    in_schema, go_on = threading.Event(), threading.Event()

    def open_graph() -> Graph:
        attempts.append(threading.current_thread().name)
        if len(attempts) == 1:
            raise StoreUnavailable("neo4j", "Couldn't connect to 10.77.0.2:7687")  # down at the start
        if len(attempts) == 2:
            return SlowGraph(in_schema, go_on)  # up again: this attempt is slow but succeeds
        raise StoreUnavailable("neo4j", "a second opener failing meanwhile")

    monkeypatch.setattr(stack, "_open_graph", open_graph)
    assert stack.graph() is None
    now[0] += REOPEN_AFTER_S
    opened: list[Any] = []
    first = threading.Thread(target=lambda: opened.append(stack.graph()), name="first")
    first.start()
    assert in_schema.wait(10)
    assert stack.graph() is None  # another request meanwhile: degraded, no attempt of its own
    assert attempts == ["MainThread", "first"]
    go_on.set()
    first.join(10)
    graph = opened[0]
    assert isinstance(graph, SlowGraph) and not graph.closed
    assert stack.graph() is graph and names.NEO4J not in stack.unavailable
    now[0] += 10 * REOPEN_AFTER_S
    assert stack.graph() is graph and len(attempts) == 2


def test_the_first_opening_is_waited_for_by_a_second_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parallel query legs of a process that just started: the second caller waits for the first
    opening instead of calling a store that was never down unavailable."""
    stack = Stack(load_settings(Path("/dev/null"), profile="cluster"))
    attempts: list[str] = []
    in_schema, go_on = threading.Event(), threading.Event()

    def open_graph() -> Graph:
        attempts.append(threading.current_thread().name)
        return SlowGraph(in_schema, go_on)

    monkeypatch.setattr(stack, "_open_graph", open_graph)
    got: dict[str, Any] = {}
    first = threading.Thread(target=lambda: got.setdefault("first", stack.graph()), name="first")
    first.start()
    assert in_schema.wait(10)
    second = threading.Thread(target=lambda: got.setdefault("second", stack.graph()), name="second")
    second.start()
    second.join(0.3)
    assert second.is_alive()  # waiting for the first opening, not answering None
    go_on.set()
    first.join(10)
    second.join(10)
    assert isinstance(got["first"], SlowGraph) and got["second"] is got["first"] and attempts == ["first"]
