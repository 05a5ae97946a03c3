"""How big may an id filter be? Qdrant Edge, 100k points, filtered top-10 search.

Not a test: prints a table. It decides ``id_chunk_size`` for the vector stores (graph -> candidate
ids -> vector search with the ids as a filter) and whether to express the ids as ``HasIdCondition``
(point ids) or ``MatchAny`` on the keyword-indexed ``id`` payload field. It also measures exact
search against HNSW (after ``optimize()``) because recall on random vectors is poor and the store
must choose its search params deliberately.

    python benchmarks/vector_chunks.py [--points 100000] [--dim 384] [--no-hnsw] [--store]

``--store`` instead runs the ids through ``EdgeVectorStore.search`` with several ``id_chunk_size``
values (chunks sent as one ``query_batch``), i.e. what the query engine actually pays.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import qdrant_edge as qe


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median wall time in ms over ``repeat`` runs (after one warm-up) and the last result."""
    out = fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), out


def store_table(n: int, dim: int, repeat: int) -> None:
    """Candidate-id search through the store itself, per chunk size."""
    from memoryctl.stores.protocols import EmbeddingModelInfo, VectorFilter, VectorPoint
    from memoryctl.stores.vector_edge import EdgeVectorStore

    rng = np.random.default_rng(1)
    model = EmbeddingModelInfo("bench/random", dim)
    with tempfile.TemporaryDirectory() as tmp:
        store = EdgeVectorStore(tmp)
        store.ensure_collection(model)
        ids = [uuid.UUID(bytes=rng.bytes(16)) for _ in range(n)]
        vecs = rng.standard_normal((n, dim), dtype=np.float32)
        t0 = datetime(2024, 1, 1, tzinfo=UTC)
        start = time.perf_counter()
        for lo in range(0, n, 2000):
            store.upsert(
                [
                    VectorPoint(ids[i], vecs[i].tolist(), f"agent{i % 10}", "note", t0 + timedelta(minutes=i), "h")
                    for i in range(lo, min(n, lo + 2000))
                ]
            )
        print(f"store upsert {n} x {dim}: {time.perf_counter() - start:.1f} s")
        q = rng.standard_normal(dim).tolist()
        print(f"\n{'ids':>6} | {'chunk':>6} | median ms")
        for k in (k for k in (1000, 5000, 10000) if k <= n):
            cand = [ids[int(j)] for j in rng.choice(n, size=k, replace=False)]
            for chunk in sorted({500, 1000, 2000, k}):
                store.id_chunk_size = chunk
                ms, _ = timed(lambda c=cand: store.search(q, VectorFilter(ids=c), 10, model_id=model.model_id), repeat)  # type: ignore[misc]
                print(f"{k:>6} | {chunk:>6} | {ms:9.1f}")
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--no-hnsw", action="store_true", help="skip optimize() and the HNSW rows")
    ap.add_argument("--store", action="store_true", help="measure through EdgeVectorStore per chunk size")
    args = ap.parse_args()
    if args.store:
        store_table(args.points, args.dim, args.repeat)
        return

    rng = np.random.default_rng(42)
    n, dim = args.points, args.dim
    vecs = rng.standard_normal((n, dim), dtype=np.float32)
    ids = [uuid.UUID(bytes=rng.bytes(16)) for _ in range(n)]
    t0 = datetime(2024, 1, 1, tzinfo=UTC)

    with tempfile.TemporaryDirectory() as tmp:
        shard = qe.EdgeShard.create(
            f"{tmp}/shard", qe.EdgeConfig(vectors=qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine))
        )
        for field, schema in (
            ("agent_id", qe.KeywordIndexParams(is_tenant=True)),
            ("id", qe.KeywordIndexParams(enable_hnsw=False)),
            ("created_at", qe.PayloadSchemaType.Datetime),
            ("deleted", qe.BoolIndexParams(enable_hnsw=False)),
        ):
            shard.update(qe.UpdateOperation.create_field_index(field, schema))
        start = time.perf_counter()
        for lo in range(0, n, 2000):
            pts = [
                qe.Point(
                    ids[i],
                    vecs[i].tolist(),
                    {
                        "id": str(ids[i]),
                        "agent_id": f"agent{i % 10}",
                        "created_at": (t0 + timedelta(minutes=i)).isoformat(),
                        "deleted": False,
                    },
                )
                for i in range(lo, min(n, lo + 2000))
            ]
            shard.update(qe.UpdateOperation.upsert_points(pts))
        print(f"upsert {n} x {dim}: {time.perf_counter() - start:.1f} s")

        queries = [rng.standard_normal(dim).astype(np.float32).tolist() for _ in range(20)]

        def search(flt: qe.Filter | None, params: qe.SearchParams | None = None, q: int = 0) -> list[Any]:
            return shard.query(qe.QueryRequest(limit=10, query=qe.Query.Nearest(queries[q]), filter=flt, params=params))

        def id_filters(k: int) -> dict[str, qe.Filter]:
            sub = [ids[int(j)] for j in rng.choice(n, size=k, replace=False)]
            base = qe.FieldCondition("deleted", match=qe.MatchValue(False))
            return {
                "HasIdCondition": qe.Filter(must=[qe.HasIdCondition(set(sub)), base]),
                "MatchAny(id)": qe.Filter(
                    must=[qe.FieldCondition("id", match=qe.MatchAny([str(s) for s in sub])), base]
                ),
            }

        def table(stage: str) -> None:
            print(f"\n[{stage}] filtered top-10, median of {args.repeat} (ms)")
            print(f"{'ids':>6} | {'HasIdCondition':>14} | {'MatchAny(id)':>12} | {'per 1k ids (HasId)':>18}")
            for k in (100, 1000, 2000, 5000, 10000):
                flts = id_filters(k)
                t_has, _ = timed(lambda f=flts["HasIdCondition"]: search(f), args.repeat)  # type: ignore[misc]
                t_any, _ = timed(lambda f=flts["MatchAny(id)"]: search(f), args.repeat)  # type: ignore[misc]
                print(f"{k:>6} | {t_has:>14.2f} | {t_any:>12.2f} | {t_has / k * 1000:>18.2f}")
            t_none, _ = timed(lambda: search(None), args.repeat)
            t_agent, _ = timed(
                lambda: search(qe.Filter(must=[qe.FieldCondition("agent_id", match=qe.MatchValue("agent3"))])),
                args.repeat,
            )
            print(f"no filter: {t_none:.2f} ms; agent filter (10 %): {t_agent:.2f} ms")

        table("plain segments (no optimize)")
        if args.no_hnsw:
            return
        start = time.perf_counter()
        shard.optimize()
        print(f"\noptimize (HNSW build): {time.perf_counter() - start:.1f} s")
        table("after optimize (HNSW)")

        # Recall@10 against exact search, unfiltered, for the search params the store may choose.
        exact = qe.SearchParams(exact=True)
        truth = [{p.id for p in search(None, exact, q)} for q in range(len(queries))]
        print(f"\nunfiltered top-10 after optimize: params | median ms | recall@10 ({len(queries)} queries)")
        for label, params in (
            ("exact", exact),
            ("default ef", None),
            ("hnsw_ef=128", qe.SearchParams(hnsw_ef=128)),
            ("hnsw_ef=512", qe.SearchParams(hnsw_ef=512)),
            ("hnsw_ef=1024", qe.SearchParams(hnsw_ef=1024)),
        ):
            ms = statistics.median(timed(lambda q=q, p=params: search(None, p, q), 3)[0] for q in range(5))  # type: ignore[misc]
            rec = statistics.mean(
                len({p.id for p in search(None, params, q)} & truth[q]) / 10 for q in range(len(queries))
            )
            print(f"{label:>12} | {ms:>8.2f} | {rec:.2f}")
        shard.close()


if __name__ == "__main__":
    main()
