"""Ingest throughput: batched import versus per-record writes through the same stores.

Both paths do the full write: PostgreSQL transaction with outbox rows, then delivery to the vector
store and the graph. "Batched" is ``MemoryClient.import_jsonl`` (500 rows per transaction, one
embedding batch and one graph UNWIND per delivery batch); "per-record" calls ``add([m])`` once per
memory, as a naive client would. ``--embedder hash`` (the default) is a fast stand-in that isolates
the pipeline's own cost from model time; ``--embedder onnx`` uses the default model.

Usage (test servers from ``scripts/services up``; ``eval "$(scripts/services env)"``)::

    python benchmarks/ingest.py                        # 10,000 batched; 1,000 per-record (rate compared)
    python benchmarks/ingest.py --n 10000 --per-record 10000 --embedder onnx
    python benchmarks/ingest.py --profile embedded     # embedded PostgreSQL + Qdrant Edge + SQL graph

Prints memories/s for both paths and the ratio (target: batched >= 10x per-record).

Embedded profile, the default model (``--profile embedded --embedder onnx --n 3000``), batched:
225 memories/s at load 1.0 (210 with the runtime's own spinning threads, before the embedder ran
one thread per core; the whole run 25.8 CPU-s against 30.8); under the shared host's load 4.7-5.4
81-126/s (33-147 before: two spinning threads collapse when a core is taken). The model is ~85 %
of the time; the PostgreSQL transaction, the outbox and the SQL graph the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memoryctl.client import MemoryClient
from memoryctl.config import load_settings
from memoryctl.write.importer import memory_from_json

USERS = [f"user{i}" for i in range(200)]
PROJECTS = [f"project-{i}" for i in range(30)]


def synth(n: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        user = USERS[min(int(rng.paretovariate(1.2)) - 1, len(USERS) - 1)]
        project = rng.choice(PROJECTS)
        ticket = f"OPS-{rng.randrange(5000)}"
        day = f"2026-{rng.randrange(9, 12):02d}-{rng.randrange(1, 29):02d}"
        rows.append(
            {
                "id": str(uuid.UUID(int=(seed << 64) + i + 1)),
                "agent_id": "bench",
                "text": f"{user} wrote about {ticket} in {project}: deploy {rng.randrange(100)} latency was "
                f"{rng.choice(['fine', 'bad', 'worse', 'better'])} after the {rng.choice(['rollback', 'hotfix'])}",
                "kind": rng.choice(["dialogue", "note", "event"]),
                "created_at": f"{day}T{rng.randrange(24):02d}:00:00Z",
                "entities": [
                    {"type": "User", "name": user},
                    {"type": "Ticket", "name": ticket},
                    {"type": "Project", "name": project},
                ],
                "relations": [
                    {"from": {"type": "User", "name": user}, "type": "AUTHORED", "to": "this"},
                    {
                        "from": {"type": "Ticket", "name": ticket},
                        "type": "BELONGS_TO",
                        "to": {"type": "Project", "name": project},
                    },
                ],
                "metadata": {"sentiment": round(rng.uniform(-1, 1), 2)},
            }
        )
    return rows


def settings_for(args: argparse.Namespace, workdir: Path, dsn: str | None) -> object:
    extractor = {"kind": "none"}  # entities are explicit: measure the write path, not regexes
    if args.profile == "embedded":
        return load_settings(
            Path(os.devnull),
            profile="embedded",
            data_dir=workdir / "data",
            embedder={"kind": args.embedder},
            extractor=extractor,
        )
    neo4j = {
        "uri": os.environ["MEMORYCTL_TEST_NEO4J_URI"],
        "timeout_s": 60.0,
        "password": os.environ.get("MEMORYCTL_TEST_NEO4J_PASSWORD") or None,
    }
    # qdrant-client's local mode in memory: on disk it commits sqlite once per point, which would
    # measure that, not the pipeline. Set QDRANT_URL for a real server.
    qdrant: dict[str, object] = {"path": ":memory:"}
    if os.environ.get("QDRANT_URL"):
        qdrant = {"url": os.environ["QDRANT_URL"], "api_key": os.environ.get("QDRANT_API_KEY")}
    return load_settings(
        Path(os.devnull),
        profile="cluster",
        data_dir=workdir,
        postgres={"dsn": dsn},
        neo4j=neo4j,
        qdrant=qdrant,
        embedder={"kind": args.embedder},
        extractor=extractor,
    )


def fresh_db(admin: str) -> str:
    name = f"bench_ingest_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin.rpartition("/")[0] + "/" + name


def wipe_graph() -> None:
    from neo4j import GraphDatabase

    pw = os.environ.get("MEMORYCTL_TEST_NEO4J_PASSWORD")
    with (
        GraphDatabase.driver(os.environ["MEMORYCTL_TEST_NEO4J_URI"], auth=("neo4j", pw) if pw else None) as d,
        d.session() as s,
    ):
        s.run("MATCH (n) CALL (n) { DETACH DELETE n } IN TRANSACTIONS OF 10000 ROWS").consume()


def run(args: argparse.Namespace, mode: str, rows: list[dict[str, object]]) -> tuple[float, dict[str, int]]:
    with tempfile.TemporaryDirectory(prefix="ingest-") as tmp:
        dsn = None
        if args.profile == "cluster":
            dsn = fresh_db(os.environ["MEMORYCTL_TEST_PG_DSN"])
            wipe_graph()
        client = MemoryClient(settings_for(args, Path(tmp), dsn))  # type: ignore[arg-type]
        client.init()
        client.stack.embedder.embed_documents(["warm up the model"])
        t0 = time.perf_counter()
        if mode == "batched":
            path = Path(tmp) / "in.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            t0 = time.perf_counter()
            out = client.import_jsonl(path)
            assert out.inserted == len(rows), out.as_dict()
        else:
            for r in rows:
                client.add([memory_from_json(r, default_agent="bench")], extract=False)
        seconds = time.perf_counter() - t0
        counts = {
            "postgres": client.stack.records.count(),
            "qdrant": client.stack.require_vectors().count(),
            "graph": client.stack.require_graph().count(),
        }
        client.close()
        if dsn:
            with psycopg.connect(os.environ["MEMORYCTL_TEST_PG_DSN"], autocommit=True) as conn:
                conn.execute(f'DROP DATABASE "{dsn.rpartition("/")[2]}" WITH (FORCE)')
        return seconds, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="memories for the batched import")
    parser.add_argument("--per-record", type=int, default=1_000, help="memories written one by one (rate compared)")
    parser.add_argument("--embedder", choices=["hash", "onnx", "local"], default="hash")
    parser.add_argument("--profile", choices=["cluster", "embedded"], default="cluster")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rows = synth(args.n, args.seed)
    batched_s, batched_counts = run(args, "batched", rows)
    single_s, single_counts = run(args, "per-record", rows[: args.per_record])
    b_rate, s_rate = args.n / batched_s, args.per_record / single_s
    print(f"profile={args.profile} embedder={args.embedder} load={os.getloadavg()[0]:.1f}")
    print(f"{'path':<12}{'memories':>10}{'seconds':>10}{'memories/s':>12}  counts (pg/qdrant/graph)")
    for name, n, s, c in (
        ("batched", args.n, batched_s, batched_counts),
        ("per-record", args.per_record, single_s, single_counts),
    ):
        print(f"{name:<12}{n:>10}{s:>10.2f}{n / s:>12.0f}  {c['postgres']}/{c['qdrant']}/{c['graph']}")
    print(f"ratio batched/per-record: {b_rate / s_rate:.1f}x (target >= 10x)")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
