"""Graph writes against hub entities of growing degree: a batch of N memories must cost O(N).

Not a test: prints a table (issue 16). Memories are written straight through the graph store
(``GraphStore.upsert_memories``, what delivery calls), one batch at a time, into a graph where a
few entities are hubs that every memory touches:

- ``User:hub-author`` AUTHORED every memory and is mentioned by it (entity → memory edges);
- ``Project:hub-project`` is mentioned by every memory, and each memory declares
  ``Ticket:T-i -BELONGS_TO-> Project:hub-project`` (an entity → entity edge it owns);
- each memory declares ``this -OCCURRED_AFTER-> the previous memory`` (memory → memory).

The graph is filled until the hubs reach each degree of ``--degrees``; there, ``--samples`` batches
of new memories are timed, then one batch that re-upserts existing memories (the update path:
their declared edges are dropped and written again). Flat per-batch times across degrees mean the
write path does not depend on the degree of what it touches.

Usage (test servers from ``scripts/services up``; ``eval "$(scripts/services env)"``)::

    python benchmarks/graph_write.py                          # Neo4j, degrees 1k, 10k, 100k
    python benchmarks/graph_write.py --engine sql             # the embedded profile's SQL graph
    python benchmarks/graph_write.py --degrees 1000,10000 --batch 500

Only this run's agent is written and deleted afterwards, so a shared test server is safe to use.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memoryctl.model import entity_key  # noqa: E402
from memoryctl.stores.protocols import GraphEdge, GraphEntity, GraphMemory, GraphStore  # noqa: E402

if TYPE_CHECKING:
    from memoryctl.stores.graph_neo4j import Neo4jGraphStore

START = datetime(2026, 1, 1, tzinfo=UTC)


class Writer:
    """Memory i of the run, always the same, so a batch can be written again (the update path)."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.author = self._entity("User", "hub-author")
        self.project = self._entity("Project", "hub-project")
        self.namespace = uuid.uuid4()

    def _entity(self, etype: str, name: str) -> GraphEntity:
        return GraphEntity(entity_key(self.agent, etype, name), etype, name)

    def memory_id(self, i: int) -> uuid.UUID:
        return uuid.uuid5(self.namespace, str(i))

    def memory(self, i: int) -> GraphMemory:
        ticket = self._entity("Ticket", f"T-{i}")
        mid = self.memory_id(i)
        edges = [
            GraphEdge(self.author.key, "AUTHORED", mid),
            GraphEdge(ticket.key, "BELONGS_TO", self.project.key),
        ]
        if i > 0:
            edges.append(GraphEdge(mid, "OCCURRED_AFTER", self.memory_id(i - 1)))
        return GraphMemory(
            id=mid,
            agent_id=self.agent,
            created_at=START + timedelta(seconds=i),
            deleted=False,
            entities=[self.author, self.project, ticket],
            mentions=[self.author.key, self.project.key, ticket.key],
            edges=edges,
        )

    def batch(self, lo: int, n: int) -> list[GraphMemory]:
        return [self.memory(i) for i in range(lo, lo + n)]


@contextmanager
def open_store(engine: str, timeout_s: float) -> Iterator[tuple[GraphStore, str]]:
    if engine == "neo4j":
        from memoryctl.stores.graph_neo4j import Neo4jGraphStore

        uri = os.environ["MEMORYCTL_TEST_NEO4J_URI"]
        password = os.environ.get("MEMORYCTL_TEST_NEO4J_PASSWORD") or None
        store = Neo4jGraphStore(uri, password=password, timeout_s=timeout_s)
        try:
            yield store, uri
        finally:
            store.close()
        return
    import psycopg

    from memoryctl.stores.graph_sql import SqlGraphStore
    from memoryctl.stores.pg import open_pool
    from memoryctl.stores.schema import apply_schema

    admin = os.environ["MEMORYCTL_TEST_PG_DSN"]
    name = f"bench_graph_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = admin.rpartition("/")[0] + "/" + name
    pool = open_pool(dsn)
    try:
        apply_schema(pool)
        yield SqlGraphStore(pool), dsn
    finally:
        pool.close()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def seed_used_database(store: GraphStore, agent: str) -> None:
    """Start from a graph that has been used, as a test suite or an earlier import leaves it.

    One memory of another agent with an edge of each type the run writes, then Neo4j's query caches
    cleared: the run's statements are planned against a graph where those types exist but are rare,
    which is what a server that served tests or a small import looks like. Write plans must not
    depend on it (issue 16: they did).
    """
    seed = Writer(agent + "-seed")
    store.upsert_memories(seed.batch(0, 2))
    clear_plans(store)


def clear_plans(store: GraphStore) -> None:
    """Forget Neo4j's cached plans: the next statements are planned with the statistics of now."""
    neo4j = _neo4j(store)
    if neo4j is not None:
        with neo4j.backend.driver.session(database=neo4j.backend.database) as session:
            session.run("CALL db.clearQueryCaches()").consume()


def _neo4j(store: GraphStore) -> Neo4jGraphStore | None:
    from memoryctl.stores.graph_neo4j import Neo4jGraphStore

    return store if isinstance(store, Neo4jGraphStore) else None


def drop_agent(store: GraphStore, agent: str) -> None:
    """Edges first, in small transactions: a hub's 100k edges in one would not fit a small heap."""
    neo4j = _neo4j(store)
    if neo4j is None:
        return
    with neo4j.backend.driver.session(database=neo4j.backend.database) as session:
        for statement in (
            "MATCH (n:Entity {agent_id: $agent})-[r]-() CALL (r) { DELETE r } IN TRANSACTIONS OF 5000 ROWS",
            "MATCH (n:Memory {agent_id: $agent})-[r]-() CALL (r) { DELETE r } IN TRANSACTIONS OF 5000 ROWS",
            "MATCH (n:Entity|Memory {agent_id: $agent}) CALL (n) { DELETE n } IN TRANSACTIONS OF 5000 ROWS",
        ):
            session.run(statement, agent=agent).consume()


def timed(store: GraphStore, items: Sequence[GraphMemory]) -> float:
    t0 = time.perf_counter()
    store.upsert_memories(items)
    return time.perf_counter() - t0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=["neo4j", "sql"], default="neo4j")
    ap.add_argument("--first", default="500,1000,2000,5000", help="sizes of the first batch into a used graph")
    ap.add_argument("--degrees", default="1000,10000,100000", help="hub degrees to measure at")
    ap.add_argument("--batch", type=int, default=1000, help="memories per batch (default 1000)")
    ap.add_argument("--fill-batch", type=int, default=5000, help="memories per batch while filling")
    ap.add_argument("--samples", type=int, default=3, help="timed batches per degree")
    ap.add_argument("--timeout", type=float, default=600.0, help="the store's per-call timeout, seconds")
    ap.add_argument("--give-up", type=float, default=300.0, help="stop when one timed batch takes longer")
    args = ap.parse_args(argv)
    degrees = sorted(int(d) for d in args.degrees.split(","))
    agent = f"hubbench-{uuid.uuid4().hex[:8]}"
    writer = Writer(agent)
    print(f"# benchmarks/graph_write.py engine={args.engine} batch={args.batch} samples={args.samples}")
    print(f"# load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; cores: {os.cpu_count()}")
    rows: list[tuple[int, list[float], float]] = []
    with open_store(args.engine, args.timeout) as (store, where):
        print(f"# {where}")
        store.ensure_schema()
        seed_used_database(store, agent)
        first: list[tuple[int, float]] = []
        for n in sorted(int(x) for x in args.first.split(",") if x):
            probe = Writer(f"{agent}-first{n}")
            try:
                first.append((n, timed(store, probe.batch(0, n))))
            finally:
                drop_agent(store, probe.agent)
                clear_plans(store)
            print(f"  first batch of {n}: {first[-1][1] * 1000:.0f} ms", flush=True)
            if first[-1][1] > args.give_up:
                print(f"  a batch took more than {args.give_up:.0f} s: stopping here")
                break
        written, fill_s = 0, 0.0
        try:
            for degree in degrees:
                while written < degree:
                    n = min(args.fill_batch, degree - written)
                    fill_s += timed(store, writer.batch(written, n))
                    written += n
                samples = []
                for _ in range(args.samples):
                    samples.append(timed(store, writer.batch(written, args.batch)))
                    written += args.batch
                    if samples[-1] > args.give_up:
                        break
                again = timed(store, writer.batch(written - args.batch, args.batch))
                rows.append((degree, samples, again))
                print(
                    f"  degree {degree:>7}: new {', '.join(f'{s * 1000:.0f}' for s in samples)} ms;"
                    f" re-upsert {again * 1000:.0f} ms",
                    flush=True,
                )
                if max(samples) > args.give_up:
                    print(f"  a batch took more than {args.give_up:.0f} s: stopping here")
                    break
        finally:
            drop_agent(store, agent)
            drop_agent(store, agent + "-seed")
    print()
    print("first batch into a used graph (the types it writes exist, but rarely, when it is planned)")
    print(f"{'memories':>10}  {'ms':>10}  {'µs/memory':>9}")
    for n, seconds in first:
        print(f"{n:>10}  {seconds * 1000:>10.0f}  {seconds / n * 1e6:>9.0f}")
    print()
    print("hubs of growing degree (every memory touches them)")
    print(f"{'hub degree':>10}  {'new batch p50 ms':>16}  {'µs/memory':>9}  {'re-upsert ms':>12}")
    for degree, samples, again in rows:
        p50 = statistics.median(samples)
        print(f"{degree:>10}  {p50 * 1000:>16.0f}  {p50 / args.batch * 1e6:>9.0f}  {again * 1000:>12.0f}")
    if written:
        print(f"fill: {written} memories in {fill_s:.1f} s")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
