"""Reconcile and migrate throughput on engines with real indexes. Not a test: prints a table.

Engines: real PostgreSQL (the DSN given, a scratch database is created and dropped), Qdrant Edge
for vectors (``EdgeVectorStore``: the Rust engine, payload indexes in use), and for the graph
either the SQL graph in that PostgreSQL (default: the embedded profile's graph) or a real Neo4j
(``--graph neo4j``, with ``--neo4j-uri``/``--neo4j-password``); for vectors a real Qdrant server
instead of Edge with ``--qdrant-url`` (``--qdrant-api-key``; ``--qdrant-shards``/``--qdrant-replicas``
for a cluster's collection layout; collections named ``bench_ops_*``, dropped afterwards). The embedder is the ``hash``
stand-in so model time is near zero and is reported separately anyway.

Measured:
- reconcile: one dry-run pass over N memories in all three stores (merge-join of three keyset
  scrolls + outbox checks), ids/s counted across the three stores and per memory; extrapolated to
  500,000 memories (target <= 60 s).
- migrate: the full ``Migrator.migrate`` (copy with checkpoints, catch-up, merge-join verification,
  recall sample, swap) into a new 384-dim model; pipeline time = total - embed time, extrapolated
  to 500,000 (target <= 180 s excluding model time).

    python benchmarks/ops.py --dsn postgresql://postgres@127.0.0.1:55432/postgres [--n 100000]

The loaded rows are dated an hour back (``updated_at``): a store that existed before the migration.
Rows written within CATCHUP_MARGIN of the copy's start are re-embedded by the catch-up, which for
a freshly loaded set would be all of them, twice. Writes during a migration are tested in
tests/integration/test_ops.py.

Measured 2026-11-30 (n=100,000, quiet 2-core machine, load average 1.0): reconcile 6.3 s = 15.8k
memories/s (47k ids/s over three stores) -> 500k in 31.6 s (target <= 60 s); migrate 43.1 s, of
which model 7.6 s; pipeline excl. model 35.4 s (copy 37.4 s incl. model, catch-up 3.8 s, verify
1.5 s) -> 500k in 177.2 s (target <= 180 s); peak RSS 863 MB. The previous figure, 524 s, spent
its time re-embedding everything twice in the catch-up (the loaded rows were younger than the
margin), converting vectors element by element before Edge's upsert, decoding jsonb with
json.loads and re-validating every row read back. What is left is mostly Qdrant Edge itself:
~70 us per point to convert the payload in its Python binding and ~55 us to write it.

Against the Qdrant 1.19.0 server (the release artefact, one server on loopback, REST) next to
Edge, 2026-11-30, n=20,000, same machine at load average 3.8-4.2: migrate pipeline excl. model
2,695 memories/s on the server (upsert 5.1 s, copy 6.3 s) vs 4,432/s on Edge (upsert 3.0 s, copy
4.0 s) -> 500k in 186 s vs 113 s; reconcile 14.8k vs 36.3k memories/s (the server's scroll is a
REST round trip per page). On the deployed 3-peer cluster (replication 2, over WireGuard) the
end-to-end migrate of 3,000 memories spent 1.9 s upserting and ~188 s embedding on the CPU.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memoryctl.config import load_settings
from memoryctl.maintenance.model_migration import Migrator
from memoryctl.maintenance.models import parse_model_spec
from memoryctl.maintenance.reconcile import Reconciler
from memoryctl.model import EntityRef, Memory, parse_duration
from memoryctl.stack import Stack
from memoryctl.stores.protocols import GraphStore
from memoryctl.stores.vector_edge import EdgeVectorStore
from memoryctl.stores.vector_qdrant import QdrantVectorStore
from memoryctl.write.outbox import graph_memory, vector_point

WORDS = "alpha beta gamma delta project meeting customer invoice deploy server cluster memory graph vector".split()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_memories(start: int, n: int) -> list[Memory]:
    out = []
    for i in range(start, start + n):
        words = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(12))
        out.append(
            Memory(
                text=f"memory {i} {words} number {i % 977}",
                agent_id=f"agent{i % 10}",
                id=uuid.uuid4(),
                kind="note",
                entities=[EntityRef("Project", f"p{i % 50}")],
                metadata={"i": i},
            )
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--dsn", default=os.environ.get("MEMORYCTL_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:55432/postgres")
    )
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--graph", choices=["sql", "neo4j"], default="sql")
    ap.add_argument("--neo4j-uri", default=os.environ.get("MEMORYCTL_TEST_NEO4J_URI"))
    ap.add_argument("--neo4j-password", default=os.environ.get("MEMORYCTL_TEST_NEO4J_PASSWORD"))
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--qdrant-url", default=None, help="a Qdrant server instead of Qdrant Edge")
    ap.add_argument("--qdrant-api-key", default=os.environ.get("MEMORYCTL_QDRANT_API_KEY"))
    ap.add_argument("--qdrant-shards", type=int, default=None)
    ap.add_argument("--qdrant-replicas", type=int, default=None)
    args = ap.parse_args()

    db = f"bench_ops_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    dsn = f"{args.dsn.rpartition('/')[0]}/{db}"
    tmp = Path(tempfile.mkdtemp(prefix="bench-ops-"))
    data: dict[str, Any] = {
        "profile": "cluster",
        "data_dir": tmp,
        "postgres": {"dsn": dsn, "pool_max": 8},
        "embedder": {"kind": "hash"},
    }
    if args.graph == "neo4j":
        data["neo4j"] = {"uri": args.neo4j_uri, "password": args.neo4j_password}
    settings = load_settings(Path(os.devnull), **data)
    stack = Stack(settings)
    rows: list[tuple[str, str, str]] = []
    server: QdrantVectorStore | None = None  # its scratch collections are dropped at the end
    try:
        vectors: EdgeVectorStore | QdrantVectorStore
        if args.qdrant_url:
            layout = {"shard_number": args.qdrant_shards, "replication_factor": args.qdrant_replicas}
            vectors = server = QdrantVectorStore(
                url=args.qdrant_url,
                api_key=args.qdrant_api_key,
                timeout_s=60,
                alias=db,
                collection_prefix=db,
                layout={k: v for k, v in layout.items() if v is not None},
            )
        else:
            vectors = EdgeVectorStore(tmp / "vectors")
        graph: GraphStore
        if args.graph == "sql":
            from memoryctl.stores.graph_sql import SqlGraphStore

            graph = SqlGraphStore(stack.pool)
        else:
            from memoryctl.stack import neo4j_graph

            graph = neo4j_graph(settings.neo4j)
            if graph.count() > 0:
                sys.exit("refusing to run against a Neo4j that already holds memories (use a scratch server)")
        graph.ensure_schema()
        stack._vectors, stack._graph = vectors, graph
        stack._tried.update({"vector", "graph"})
        embedder = stack.embedder
        vectors.ensure_collection(embedder.info)

        # ---- load N memories into all three stores (not timed as an ops figure) ----
        t0 = time.perf_counter()
        for start in range(0, args.n, args.batch):
            batch = make_memories(start, min(args.batch, args.n - start))
            stack.records.upsert(batch)
            vecs = embedder.embed_documents([m.text for m in batch]).tolist()
            vectors.upsert([vector_point(m, v) for m, v in zip(batch, vecs, strict=True)])
            graph.upsert_memories([graph_memory(m) for m in batch])
        with stack.pool.connection() as conn, conn.transaction():
            conn.execute("DELETE FROM outbox")  # delivered above, directly
            # A store that existed before the migration: rows written in the minute before it starts
            # are re-embedded by the catch-up (CATCHUP_MARGIN), which here would be all of them and
            # would measure the catch-up twice instead of the copy. Writes *during* a migration are
            # measured by tests/integration/test_ops.py, not here.
            conn.execute("UPDATE memories SET updated_at = updated_at - interval '1 hour'")
        load_s = time.perf_counter() - t0
        rows.append(("load (PG + vectors + graph, hash embedder)", f"{load_s:.1f} s", f"{args.n / load_s:,.0f} mem/s"))

        # ---- reconcile ----
        rec = Reconciler(stack.records, vectors, graph, embedder, delete_grace=parse_duration("7d"))
        report = rec.run()
        assert report.drift == 0, report.as_dict()
        ids = report.postgres_scanned + sum(s.scanned for s in report.stores.values())
        per_mem = report.postgres_scanned / report.seconds
        rows.append(
            (
                "reconcile (dry run, 3 stores)",
                f"{report.seconds:.1f} s",
                f"{ids / report.seconds:,.0f} ids/s ({per_mem:,.0f} memories/s)",
            )
        )
        rows.append(("  -> 500k memories, extrapolated", f"{500_000 / per_mem:.1f} s", "target <= 60 s"))

        # ---- migrate ----
        target = parse_model_spec("kind=hash,model=hash/bench-v2")
        mig = Migrator(stack, batch=512, sample=50).migrate(target)
        assert mig.status == "swapped", mig.as_dict()
        embed_s = mig.pipeline.embed_s
        pipe_s = mig.seconds - embed_s
        rows.append(
            (
                "migrate (copy+catch-up+verify+swap)",
                f"{mig.seconds:.1f} s",
                f"{args.n / mig.seconds:,.0f} mem/s incl. model",
            )
        )
        rows.append(
            (
                "  model time (hash embedder)",
                f"{embed_s:.1f} s",
                f"upsert {mig.pipeline.upsert_s:.1f} s, waiting for PG {mig.pipeline.wait_s:.1f} s",
            )
        )
        rows.append(
            (
                "  pipeline excl. model",
                f"{pipe_s:.1f} s",
                f"{args.n / pipe_s:,.0f} mem/s (copied {mig.copied:,}, caught up {mig.caught_up:,})",
            )
        )
        rows.append(("  phases", "", ", ".join(f"{k} {v:.1f} s" for k, v in mig.phases.items())))
        rows.append(("  -> 500k, extrapolated excl. model", f"{500_000 * pipe_s / args.n:.1f} s", "target <= 180 s"))
        rows.append(("  verify", "", str(mig.verify)))
        rows.append(("peak RSS", f"{peak_rss_mb():,.0f} MB", ""))
    finally:
        if server is not None:
            for collection in server.client.get_collections().collections:
                if collection.name.startswith(db):
                    server.client.delete_collection(collection.name)
        stack.close()
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    graph_name = "SQL graph (PostgreSQL)" if args.graph == "sql" else "Neo4j"
    vector_name = f"Qdrant server {args.qdrant_url}" if args.qdrant_url else "Qdrant Edge"
    print(
        f"\nops benchmark: N={args.n:,}, vectors={vector_name}, graph={graph_name}, embedder=hash, "
        f"{os.cpu_count()} cores, load avg {os.getloadavg()[0]:.1f}"
    )
    width = max(len(r[0]) for r in rows)
    for name, t, note in rows:
        print(f"{name:<{width}}  {t:>10}  {note}")


if __name__ == "__main__":
    main()
