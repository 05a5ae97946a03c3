"""``memoryctl rebuild graph``: the graph store rebuilt from PostgreSQL, the source of truth.

Every memory (soft-deleted ones with their flag, as delivery writes them) is read in id-ordered
pages and written with the graph store's bulk upsert: the same projection the outbox delivers, in
batches instead of one outbox entry at a time. Idempotent (a memory's node and edges are replaced
whole), so it can run on a graph that is empty, half-restored or intact; ``--prune`` then
removes what PostgreSQL no longer has (``reconcile --repair``'s orphan pass, limited to the
graph). Outbox entries written meanwhile are delivered as usual: writes may continue meanwhile.

Why this instead of a Neo4j backup (docs/backup.md): Community has no online backup, only offline
``neo4j-admin database dump`` (the store stopped for the dump's duration), and a dump is a second
copy of what PostgreSQL already holds, older than PostgreSQL's restorable point the moment it is
taken. A rebuild lands exactly at PostgreSQL's state, after a point-in-time restore too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memoryctl.maintenance.runs import recorded_run
from memoryctl.write.outbox import graph_memory

if TYPE_CHECKING:
    from memoryctl.stack import Stack


def rebuild_graph(
    stack: Stack, *, batch: int = 1000, prune: bool = True, progress: Callable[[int], None] | None = None
) -> dict[str, Any]:
    graph = stack.require_graph()
    with recorded_run(stack.runs, "rebuild-graph") as rec:
        started = time.perf_counter()
        graph.ensure_schema()
        written = 0
        for page in stack.records.scroll(batch=batch, include_deleted=True):
            memories = stack.records.get_many([row["id"] for row in page])
            graph.upsert_memories([graph_memory(m) for m in memories.values()])
            written += len(memories)
            if progress is not None:
                progress(len(page))
        write_s = time.perf_counter() - started
        orphans = _prune(stack) if prune else 0
        result = {
            "memories": written,
            "orphans_removed": orphans,
            "graph_count": graph.count(),
            "write_s": round(write_s, 2),
            "total_s": round(time.perf_counter() - started, 2),
            "memories_per_s": round(written / write_s, 1) if write_s else None,
        }
        rec.counts = {"memories": written, "orphans_removed": orphans}
        rec.details = {k: result[k] for k in ("write_s", "total_s", "memories_per_s")}
    return result


def _prune(stack: Stack) -> int:
    """Graph memories PostgreSQL does not have (nor a pending purge for): removed."""
    graph = stack.require_graph()
    removed = 0
    for page in graph.scroll(batch=2000):
        ids = [record.id for record in page]
        known = stack.records.get_many(ids)
        gone = [mid for mid in ids if mid not in known]
        if gone:
            graph.delete(gone)
            removed += len(gone)
    return removed
