"""The unified query engine against the pattern it replaces, on 100,000 memories and real engines.

Not a test: prints a table (issue 3, item 8). One process, real PostgreSQL, real Neo4j and Qdrant
Edge (the Rust engine in-process; qdrant-client's local mode filters in Python and would measure
nothing). Vectors come from the ``hash`` embedder: model time is not what is measured here, and the
hashing trick still gives a realistic spread of scores over bag-of-words texts.

The data set (seeded, deterministic): two agents (95 % / 5 %), ~200 users, ~30 projects, ~5,000
tickets, ~2,000 documents. Each memory is AUTHORED by a user drawn from a Zipf law (the top author
writes ~20 % of everything: the high graph fan-out case), mentions its author, 1-3 tickets and
sometimes a project or a document; the first memory that mentions a ticket declares
``Ticket -BELONGS_TO-> Project``, the first that mentions a document ``Document -REFERENCES-> Ticket``.
Metadata: ``sentiment`` (float), ``severity`` (int); five kinds; ``created_at`` over 90 days.

Methods compared per query shape (every method returns the same thing: hydrated hits plus their
relationships, except (d), which is a floor):

(a) ``unified``: ``QueryEngine`` exactly as ``MemoryClient.engine`` builds it (recall events off);
(b) ``naive``: the three clients one after another, merged in Python: Qdrant top-K by text scoped
    to the agent only (K doubles until enough survive), the Neo4j traversal's full id list, all
    candidate rows from PostgreSQL with the time/where filter, intersect and sort in Python;
(c) ``ids-1-filter``: traverse, then ONE vector search whose filter carries every id (unchunked);
(d) ``floor``: each single-store sub-query of the plan the engine chose, run alone; the slowest of
    them per query. A plan that calls stores one after another cannot beat it.
(d') where that plan skipped a sub-query a parallel fan-out over the stores needs (vector-first
    skips the full traversal), the slowest of those sub-queries: the limit a fan-out cannot beat.

Usage::

    scripts/services up && eval "$(scripts/services env)"
    python benchmarks/query.py [--n 100000] [--queries 50] [--seed 7] [--small] [--keep | --reuse]

The shared test Neo4j is wiped by every integration test run; for the 100k run point the
benchmark at a private server (``MEMORYCTL_BENCH_NEO4J_URI`` / ``_PASSWORD``), e.g.
``NEO4J_PORT=57931 NEO4J_STATE=.services/neo4j-bench NEO4J_HEAP=1500m NEO4J_PAGECACHE_MB=512
NEO4J_JIT=full scripts/neo4j-server start``. The benchmark only ever deletes the nodes of its own
agents.

Measured 2026-11-30 (n=100,000, 20 queries per shape, --reuse, quiet 2-core machine, load average
~1.1; Neo4j 5.26 with the default JIT, 1.5 GB heap), p50 ms:

    shape                      (a) unified  (b) naive  (c) 1 filter  (d) floor  a/d   b/a   c/a
    graph+vector+time (hi)           119       1623         929          39    3.10  13.6  7.79
    graph+vector (lo)                 48        892          37          13    3.71  18.6  0.77
    relational+vector                 36         95           -          16    2.21  2.61   -
    or (text | entity)                53         47           -          16    3.29  0.88   -
    graph only                        79       1040           -          62    1.27  13.3   -
    time only                         19        108           -          13    1.43  5.82   -

    hi fan-out (d'): the full traversal of the top author's 20,172 memories, 704 ms; a/d' 0.17.

The high fan-out plan is vector-first (search top K ~ 420, Neo4j checks those candidates; the
start's one-hop entities fetched meanwhile): fan-out 6 ms, near entities 48 ms in parallel with the
vector search 32 ms, verify 37 ms, relationships 17 ms in parallel with hydration 8 ms. Every
method returned the same ranking in 20/20 queries per shape. The relational+vector queries filter
on metadata keys indexed as an operator would (``INDEXED_METADATA``). Peak RSS of this process
0.74 GB. Before this session's plans (2026-11-29, load 2.6-4.5, C1 JIT): hi fan-out 1664 ms,
graph only 477, relational+vector 300. Load of the data set (--create-db): PostgreSQL COPY 35 s,
Neo4j 923 s (batches of 5,000), Edge upsert 87 s + optimize 573 s; peak RSS 1.4 GB while loading.
The Neo4j figure predates issue 16's fix (edges CREATEd instead of MERGEd, bounded transactions):
on a server that had served the test suite one 5,000-memory batch took 90 s to > 600 s, now ~7 s
(``--small``, load 9-10: the whole run 39 s wall); see benchmarks/graph_write.py for the write path.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memoryctl.client import MemoryClient  # noqa: E402
from memoryctl.config import load_settings  # noqa: E402
from memoryctl.model import EntityRef, Memory, MemoryRef, Relation  # noqa: E402
from memoryctl.query.engine import QueryEngine  # noqa: E402
from memoryctl.query.fusion import rrf  # noqa: E402
from memoryctl.query.pushdown import OVERFETCH, pushdown, traversal  # noqa: E402
from memoryctl.query.relational import scope_sql  # noqa: E402
from memoryctl.query.results import QueryResult  # noqa: E402
from memoryctl.query.spec import GraphFilter, MemoryQuery, Where  # noqa: E402
from memoryctl.query_terms import Retrieval  # noqa: E402
from memoryctl.stack import Stack, neo4j_graph  # noqa: E402
from memoryctl.stores.graph_neo4j import Neo4jGraphStore  # noqa: E402
from memoryctl.stores.protocols import VectorFilter  # noqa: E402
from memoryctl.stores.records import RecordStore, row_to_memory  # noqa: E402
from memoryctl.stores.schema import apply_schema  # noqa: E402
from memoryctl.stores.vector_edge import EdgeVectorStore  # noqa: E402
from memoryctl.write.outbox import graph_memory, vector_point  # noqa: E402

KINDS = ("dialogue", "note", "event", "decision", "task")
KIND_WEIGHTS = (0.45, 0.25, 0.15, 0.1, 0.05)
DAYS = 90
LIMIT = 10
NAIVE_K = 1000
INDEXED_METADATA = {"sentiment": "number", "severity": "number"}
_SYLLABLES = "ka lo mi nu re sa ti vo be da fe gi ho ju ku la me ni po ru si to va we xi yo zu".split()
AND_SHAPES = ("graph+vector+time (hi fan-out)", "graph+vector (lo fan-out)", "relational+vector")
SHAPES = (*AND_SHAPES, "or (text | entity)", "graph only", "time only")

# --------------------------------------------------------------------------------------------------
# The data set


@dataclass(slots=True)
class Dataset:
    """Memories plus what query generation needs to know about them (who authored how much)."""

    tag: str
    seed: int
    anchor: datetime
    agents: list[str]
    memories: list[Memory]
    topics: list[list[str]]
    users: list[str]  # by authored count (main agent), most prolific first
    authored: dict[str, int]
    projects: list[str]
    tickets: list[str]
    documents: list[str]

    @property
    def agent(self) -> str:
        return self.agents[0]


def summary(ds: Dataset) -> dict[str, Any]:
    """Everything but the memories and the anchor: enough to make the same queries on ``--reuse``."""
    return {
        "tag": ds.tag,
        "seed": ds.seed,
        "agents": ds.agents,
        "topics": [[str(w) for w in t] for t in ds.topics],
        "users": ds.users,
        "authored": ds.authored,
        "projects": ds.projects,
        "tickets": ds.tickets,
        "documents": ds.documents,
    }


def _words(rng: np.random.Generator, count: int) -> list[str]:
    out: set[str] = set()
    while len(out) < count:
        out.add("".join(rng.choice(_SYLLABLES, size=int(rng.integers(2, 4)))))
    return sorted(out)


def _zipf_weights(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def _pick(rng: np.random.Generator, cdf: np.ndarray, k: int) -> np.ndarray:
    """``rng.choice(len(cdf), size=k, p=...)`` without re-validating ``p`` on every call.

    Same draws as ``Generator.choice`` (one uniform per pick, searched in the cumulative sum), so
    the data set of a seed does not change; ``choice`` re-checks all 5,000 weights per call, which
    made generating 100,000 memories take minutes.
    """
    idx: np.ndarray = cdf.searchsorted(rng.random(k), side="right")
    return idx


def generate(n: int, seed: int, *, anchor: datetime | None = None, tag: str | None = None) -> Dataset:
    """Deterministic for (n, seed, anchor, tag): ``--reuse`` regenerates instead of reading back."""
    rng = np.random.default_rng(seed)
    anchor = anchor or datetime.now(UTC).replace(microsecond=0)
    tag = tag or uuid.uuid4().hex[:8]
    agents = [f"bench-{tag}", f"bench-{tag}-b"]
    scale = max(n / 100_000, 0.02)
    n_users, n_projects = max(20, round(200 * scale**0.5)), max(5, round(30 * scale**0.5))
    n_tickets, n_docs = max(50, round(5000 * scale)), max(20, round(2000 * scale))
    users = [f"user{i:03d}" for i in range(n_users)]
    projects = [f"PRJ{i:02d}" for i in range(n_projects)]
    tickets = [f"TCK{i:05d}" for i in range(n_tickets)]
    documents = [f"DOC{i:04d}" for i in range(n_docs)]
    ticket_project = rng.integers(0, n_projects, size=n_tickets)
    doc_ticket = rng.integers(0, n_tickets, size=n_docs)
    vocab = _words(rng, 1600)
    topics = [list(rng.choice(vocab, size=30, replace=False)) for _ in range(60)]
    common = np.array(vocab[:200])
    topic_arrays = [np.array(t) for t in topics]  # choice() would convert a list on every call

    user_w = _zipf_weights(n_users, 1.1)
    user_perm = rng.permutation(n_users)  # the top author is not user000
    topic_w = _zipf_weights(len(topics), 0.8)
    ticket_w = _zipf_weights(n_tickets, 0.6)
    ticket_perm = rng.permutation(n_tickets)
    ticket_cdf = np.cumsum(ticket_w)
    ticket_cdf /= ticket_cdf[-1]

    author_idx = user_perm[rng.choice(n_users, size=n, p=user_w)]
    topic_idx = rng.choice(len(topics), size=n, p=topic_w)
    agent_idx = (rng.random(n) < 0.05).astype(int)
    ages = rng.random(n) * DAYS * 86400
    kinds = rng.choice(len(KINDS), size=n, p=KIND_WEIGHTS)
    sentiment = np.clip(rng.normal(0.05, 0.45, size=n), -1, 1).round(3)
    severity = rng.integers(1, 6, size=n)
    seen_tickets: set[tuple[int, int]] = set()
    seen_docs: set[tuple[int, int]] = set()
    authored: dict[str, int] = {}
    memories: list[Memory] = []
    for i in range(n):
        agent = agents[agent_idx[i]]
        mid = uuid.UUID(bytes=rng.bytes(16), version=4)
        author = users[author_idx[i]]
        if agent_idx[i] == 0:
            authored[author] = authored.get(author, 0) + 1
        my_tickets = sorted({int(ticket_perm[t]) for t in _pick(rng, ticket_cdf, int(rng.integers(1, 4)))})
        user = EntityRef("User", author)
        entities = [user] + [EntityRef("Ticket", tickets[t]) for t in my_tickets]
        relations = [Relation(user, "AUTHORED", MemoryRef(mid))]
        for t in my_tickets:
            if (agent_idx[i], t) not in seen_tickets:
                seen_tickets.add((agent_idx[i], t))
                relations.append(
                    Relation(
                        EntityRef("Ticket", tickets[t]), "BELONGS_TO", EntityRef("Project", projects[ticket_project[t]])
                    )
                )
        if rng.random() < 0.3:
            entities.append(EntityRef("Project", projects[int(rng.integers(n_projects))]))
        if rng.random() < 0.2:
            d = int(rng.integers(n_docs))
            entities.append(EntityRef("Document", documents[d]))
            if (agent_idx[i], d) not in seen_docs:
                seen_docs.add((agent_idx[i], d))
                relations.append(
                    Relation(
                        EntityRef("Document", documents[d]), "REFERENCES", EntityRef("Ticket", tickets[doc_ticket[d]])
                    )
                )
        topic = topic_arrays[topic_idx[i]]
        words = list(rng.choice(topic, size=int(rng.integers(5, 11)))) + list(
            rng.choice(common, size=int(rng.integers(2, 5)))
        )
        text = f"{author} on {tickets[my_tickets[0]]}: " + " ".join(words)
        created = anchor - timedelta(seconds=float(ages[i]))
        memories.append(
            Memory(
                id=mid,
                agent_id=agent,
                text=text,
                kind=KINDS[kinds[i]],
                created_at=created,
                metadata={"sentiment": float(sentiment[i]), "severity": int(severity[i])},
                entities=entities,
                relations=relations,
            )
        )
    ranked = sorted(users, key=lambda u: (-authored.get(u, 0), u))
    return Dataset(tag, seed, anchor, agents, memories, topics, ranked, authored, projects, tickets, documents)


# --------------------------------------------------------------------------------------------------
# The stores


@dataclass(slots=True)
class Env:
    """Everything one run talks to: the client (and its engine) plus direct store handles."""

    client: MemoryClient
    engine: QueryEngine
    records: RecordStore
    vectors: EdgeVectorStore
    graph: Neo4jGraphStore
    model_id: str
    pg_dsn: str

    def close(self) -> None:
        self.client.close()


# Each memory ranked by its own score: no conversational context, no session support.
ALONE = {"context_turns": 0, "session_context": False}


def open_env(
    pg_dsn: str,
    neo4j_uri: str,
    neo4j_password: str | None,
    vec_dir: Path,
    *,
    timeout_s: float = 15.0,
    retrieval: Retrieval = "dense",
) -> Env:
    """A ``MemoryClient`` whose stack holds Qdrant Edge and Neo4j (the cluster profile would open a
    Qdrant server; the composition is otherwise the client's own, engine included). ``retrieval``
    dense ranks like the other methods: each memory by its own cosine, without the conversational
    context (``[query] context_turns = 0``) or its session's support (``session_context = false``);
    hybrid is the engine's default ranking."""
    settings = load_settings(
        Path(os.devnull),
        profile="cluster",
        data_dir=vec_dir.parent,
        postgres={"dsn": pg_dsn, "connect_timeout_s": 5},
        neo4j={"uri": neo4j_uri, "password": neo4j_password or None, "timeout_s": timeout_s},
        embedder={"kind": "hash"},
        query={"store_timeout_s": timeout_s, **(ALONE if retrieval == "dense" else {})},
        # The metadata keys the relational+vector queries filter on, indexed as an operator would
        # (README, [qdrant] indexed_metadata); added to an existing collection on --reuse.
        qdrant={"indexed_metadata": INDEXED_METADATA},
    )
    stack = Stack(settings)
    vectors = EdgeVectorStore(vec_dir, meta_indexes=settings.qdrant.indexed_metadata)
    vectors.ensure_collection(stack.embedder.info)
    graph = neo4j_graph(settings.neo4j)
    graph.ensure_schema()
    stack._vectors, stack._graph = vectors, graph
    stack._tried.update({"vector", "graph"})
    client = MemoryClient(settings, stack=stack)
    engine = client.engine
    engine.recalls = None  # recall events are a write; not what is measured
    return Env(client, engine, stack.records, vectors, graph, stack.embedder.info.model_id, pg_dsn)


def _batches(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for lo in range(0, len(items), size):
        yield items[lo : lo + size]


def load(env: Env, ds: Dataset, *, graph_batch: int = 5000, log: Callable[[str], None] = print) -> dict[str, float]:
    """Load every store the fast way; seconds per store."""
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    apply_schema(env.records.pool)
    with psycopg.connect(env.pg_dsn) as conn, conn.cursor() as cur:
        with cur.copy(
            "COPY memories (id, agent_id, text, kind, created_at, updated_at, content_hash, metadata,"
            " entities, relations) FROM STDIN"
        ) as copy:
            for m in ds.memories:
                copy.write_row(
                    (
                        m.id,
                        m.agent_id,
                        m.text,
                        m.kind,
                        m.created_at,
                        m.created_at,
                        m.hash,
                        json.dumps(m.metadata),
                        json.dumps([e.as_dict() for e in m.entities]),
                        json.dumps([r.as_dict() for r in m.relations]),
                    )
                )
        conn.commit()
        conn.execute("ANALYZE memories")
    times["postgres"] = time.perf_counter() - t0
    log(f"  postgres: {len(ds.memories)} rows by COPY + ANALYZE in {times['postgres']:.1f} s")

    t0 = time.perf_counter()
    loader = neo4j_graph(env.client.settings.neo4j.model_copy(update={"timeout_s": 600.0}))
    try:
        for i, batch in enumerate(_batches(ds.memories, graph_batch)):
            loader.upsert_memories([graph_memory(m) for m in batch])
            if i % 5 == 4:
                log(f"    neo4j: {(i + 1) * graph_batch} memories, {time.perf_counter() - t0:.0f} s")
    finally:
        loader.close()
    times["neo4j"] = time.perf_counter() - t0
    log(f"  neo4j: upsert_memories in batches of {graph_batch} in {times['neo4j']:.1f} s")

    t0 = time.perf_counter()
    embedder = env.client.stack.embedder
    vecs = embedder.embed_documents([m.text for m in ds.memories])
    times["embed(hash)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for lo in range(0, len(ds.memories), 5000):
        part = ds.memories[lo : lo + 5000]
        env.vectors.upsert([vector_point(m, v) for m, v in zip(part, vecs[lo : lo + 5000].tolist(), strict=True)])
    times["qdrant-edge upsert"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    env.vectors.optimize()
    times["qdrant-edge optimize"] = time.perf_counter() - t0
    log(
        f"  qdrant edge: embed {times['embed(hash)']:.1f} s, upsert {times['qdrant-edge upsert']:.1f} s,"
        f" optimize {times['qdrant-edge optimize']:.1f} s"
    )
    return times


def drop_graph(env: Env, agents: Sequence[str]) -> None:
    """Delete this run's nodes only (the server may be shared)."""
    driver = env.graph.backend.driver
    with driver.session(database=env.graph.backend.database) as session:
        session.run(
            "MATCH (n) WHERE n.agent_id IN $agents CALL (n) { DETACH DELETE n } IN TRANSACTIONS OF 5000 ROWS",
            agents=list(agents),
        ).consume()


# --------------------------------------------------------------------------------------------------
# Query shapes


def make_queries(
    ds: Dataset, per_shape: int, seed: int, *, retrieval: Retrieval = "dense"
) -> dict[str, list[MemoryQuery]]:
    """``per_shape`` queries per shape with varied texts, entities, filters and windows.

    ``retrieval`` dense (the default) ranks text by the vector leg alone, like the naive and
    unchunked methods, so that every method must give the same answer; hybrid (the engine's
    default) adds the lexical leg and the conversational context (``open_env``), whose cost is the
    difference in (a) between the two runs.
    """
    rng = np.random.default_rng(seed + 1)
    agent = ds.agent
    since30 = ds.anchor - timedelta(days=30)

    def text() -> str:
        topic = ds.topics[int(rng.integers(0, 12))]
        return " ".join(rng.choice(topic, size=3, replace=False))

    low = [u for u in ds.users if 5 <= ds.authored.get(u, 0) <= 150][-40:] or ds.users[-5:]
    out: dict[str, list[MemoryQuery]] = {s: [] for s in SHAPES}
    for i in range(per_shape):
        top = ds.users[0]
        out[SHAPES[0]].append(
            MemoryQuery(
                text=text(),
                agent_id=agent,
                retrieval=retrieval,
                graph=GraphFilter(EntityRef("User", top), via=("AUTHORED",)),
                since=since30,
                limit=LIMIT,
                decay=False,
            )
        )
        out[SHAPES[1]].append(
            MemoryQuery(
                text=text(),
                agent_id=agent,
                retrieval=retrieval,
                graph=GraphFilter(EntityRef("User", low[i % len(low)]), via=("AUTHORED",)),
                limit=LIMIT,
                decay=False,
            )
        )
        op = "<" if i % 2 else ">"
        out[SHAPES[2]].append(
            MemoryQuery(
                text=text(),
                agent_id=agent,
                retrieval=retrieval,
                where=[
                    Where.build("kind", "=", KINDS[i % 3]),
                    Where.build("meta.sentiment", op, -0.3 if op == "<" else 0.4),
                ],
                limit=LIMIT,
                decay=False,
            )
        )
        ticket = ds.tickets[int(rng.integers(0, min(len(ds.tickets), 400)))]
        out[SHAPES[3]].append(
            MemoryQuery(
                text=text(),
                agent_id=agent,
                retrieval=retrieval,
                graph=GraphFilter(EntityRef("Ticket", ticket), via=("REFERENCES",)),
                combine="or",
                limit=LIMIT,
                decay=False,
            )
        )
        out[SHAPES[4]].append(
            MemoryQuery(
                agent_id=agent,
                graph=GraphFilter(EntityRef("Project", ds.projects[i % len(ds.projects)]), via=("BELONGS_TO",)),
                limit=LIMIT,
                decay=False,
            )
        )
        start = ds.anchor - timedelta(days=float(rng.uniform(1, DAYS)))
        out[SHAPES[5]].append(
            MemoryQuery(agent_id=agent, since=start, until=start + timedelta(days=1), limit=LIMIT, decay=False)
        )
    return out


# --------------------------------------------------------------------------------------------------
# The methods. Each returns the ranked (id, score) answer; hydrated rows and relationships are
# fetched too (and discarded) so every method does the work of a full answer.

Ranked = list[tuple[uuid.UUID, float]]


@dataclass(slots=True)
class Floor:
    """(d): per sub-query wall time (ms), each run alone."""

    parts: dict[str, float] = field(default_factory=dict)
    # (d'): the slowest sub-query a parallel fan-out over the stores would need for the same
    # question (the full traversal, the vector search, the PostgreSQL filter), when the engine's
    # plan avoided one of them; None when the plan's own sub-queries are those.
    fanout_ms: float | None = None

    @property
    def ms(self) -> float:
        return max(self.parts.values()) if self.parts else 0.0

    @property
    def slowest(self) -> str:
        return max(self.parts, key=lambda k: self.parts[k]) if self.parts else "-"


class Methods:
    def __init__(self, env: Env, *, naive_k: int = NAIVE_K) -> None:
        self.env = env
        self.naive_k = naive_k
        self.embedder = env.client.stack.embedder
        self.last_plan: QueryResult | None = None  # the engine's last answer: its plan drives (d)

    # ---- helpers ------------------------------------------------------------------------------
    def _vector(self, q: MemoryQuery) -> list[float]:
        assert q.text is not None
        out: list[float] = self.embedder.embed_query(q.text).tolist()
        return out

    def _rows(
        self, q: MemoryQuery, ids: Sequence[uuid.UUID] | None, *, with_where: bool = True
    ) -> dict[uuid.UUID, Memory]:
        """Full rows of every candidate in scope (time + where), as an application would fetch them."""
        cond, params = scope_sql(q, with_where=with_where)
        if ids is not None:
            cond = sql.SQL("{} AND id = ANY(%s)").format(cond)
            params.append(list(ids))
        query = sql.SQL(
            "SELECT id, agent_id, text, kind, created_at, updated_at, content_hash, metadata, entities, relations,"
            " deleted_at FROM memories WHERE {}"
        ).format(cond)
        with self.env.records.pool.connection() as conn:
            return {r["id"]: row_to_memory(r) for r in conn.execute(query, params)}

    def _finish(self, ranked: Ranked) -> Ranked:
        if ranked:
            self.env.graph.relationships([i for i, _ in ranked])
        return ranked

    # ---- (a) ----------------------------------------------------------------------------------
    def unified(self, q: MemoryQuery) -> tuple[Ranked, dict[str, float]]:
        res = self.env.engine.run(q)
        self.last_plan = res
        steps: dict[str, float] = {}
        for s in res.steps:
            steps[s.name] = steps.get(s.name, 0.0) + s.ms
        # The engine's score is a standardised relevance; the other methods rank by the raw cosine
        # (or RRF), which the hit keeps among its parts: compare those.
        return [(h.id, h.scores.get("rrf", h.scores.get("vector", h.score))) for h in res.hits], steps

    # ---- (b) ----------------------------------------------------------------------------------
    def naive(self, q: MemoryQuery) -> Ranked:
        vectors, model = self.env.vectors, self.env.model_id
        scope = VectorFilter(agent_id=q.agent_id)
        if q.combine == "or":
            depth = q.limit * OVERFETCH + 10
            vhits = vectors.search(self._vector(q), scope, depth, model_id=model)
            gids = self.env.graph.traverse(traversal(q))
            rows = self._rows(q, gids, with_where=False)
            newest = sorted(rows.values(), key=lambda m: (-m.created_at.timestamp(), m.id))[:depth]
            fused = rrf(
                {"vector": [h.id for h in vhits], "graph": [m.id for m in newest]}, membership=frozenset({"graph"})
            )
            ranked = sorted(((i, sum(p.values())) for i, p in fused.items()), key=lambda p: -p[1])[: q.limit]
            missing = [i for i, _ in ranked if i not in rows]
            if missing:
                self._rows(q, missing, with_where=False)
            return self._finish(ranked)
        if not q.has_vector_leg:
            gids = self.env.graph.traverse(traversal(q)) if q.graph is not None else None
            if gids is not None and not gids:
                return []
            rows = self._rows(q, gids)
            newest = sorted(rows.values(), key=lambda m: (-m.created_at.timestamp(), str(m.id)))[: q.limit]
            return self._finish([(m.id, 1.0) for m in newest])
        vec = self._vector(q)
        gids = self.env.graph.traverse(traversal(q)) if q.graph is not None else None
        if gids is not None and not gids:
            return []
        rows = self._rows(q, gids) if gids is not None else {}
        k = self.naive_k
        while True:
            vhits = vectors.search(vec, scope, k, model_id=model)
            if gids is None:
                rows = self._rows(q, [h.id for h in vhits])
            kept = [(h.id, h.score) for h in vhits if h.id in rows][: q.limit]
            if len(kept) >= q.limit or len(vhits) < k:
                return self._finish(kept)
            k *= 4  # not enough survived the graph/time/where filter: ask Qdrant for more

    # ---- (c) ----------------------------------------------------------------------------------
    def one_filter(self, q: MemoryQuery) -> Ranked | None:
        if q.graph is None or not q.has_vector_leg or q.combine == "or":
            return None
        ids = self.env.graph.traverse(traversal(q))
        if not ids:
            return []
        flt = pushdown(q, with_where=True, ids=ids)
        assert flt is not None
        store = self.env.vectors
        saved, store.id_chunk_size = store.id_chunk_size, 10**9
        try:
            hits = store.search(self._vector(q), flt, q.limit * OVERFETCH + 10, model_id=self.env.model_id)
        finally:
            store.id_chunk_size = saved
        rows = self.env.records.get_many([h.id for h in hits], include_deleted=False)
        return self._finish([(h.id, h.score) for h in hits if h.id in rows][: q.limit])

    # ---- (d) ----------------------------------------------------------------------------------
    def floor(self, q: MemoryQuery, answer: Ranked, plan: QueryResult) -> Floor:
        """Each sub-query of the plan the engine chose, alone, fed with what the previous step produced."""
        f = Floor()

        @contextmanager
        def timed(name: str) -> Iterator[None]:
            t0 = time.perf_counter()
            yield
            f.parts[name] = (time.perf_counter() - t0) * 1000

        depth = q.limit * OVERFETCH + 10
        ids: list[uuid.UUID] | None = None
        vec = self._vector(q) if q.has_vector_leg else None
        ran = {s.name: s for s in plan.steps}
        vector_first = "graph.verify" in ran  # search without ids, then check the candidates
        graph_first = q.graph is not None and (not vector_first or "graph.traverse" in ran)  # incl. a fallback
        if "graph.fanout" in ran:
            with timed("neo4j.fanout"):
                self.env.graph.fanout(traversal(q))
        if vector_first:
            t0 = time.perf_counter()
            self.env.graph.traverse(traversal(q))  # what a fan-out would have to run
            f.fanout_ms = (time.perf_counter() - t0) * 1000
            assert vec is not None
            flt = pushdown(q, with_where=True)
            assert flt is not None
            k = int(next(s for s in plan.steps if s.name == "vector.search").detail["limit"])
            with timed("qdrant.search(top K)"):
                hits = self.env.vectors.search(vec, flt, k, model_id=self.env.model_id)
            with timed("neo4j.near_entities"):
                near = self.env.graph.near_entities(traversal(q))
            with timed("neo4j.verify"):
                self.env.graph.connected(traversal(q), [h.id for h in hits], near=near)
        pushed = plan.plan.startswith("graph(time pushed down")  # graph only: newest first in the graph
        if graph_first:
            with timed("neo4j.traverse"):
                ids = self.env.graph.traverse(traversal(q, newest_first=True) if pushed else traversal(q))
        if q.combine == "or":
            assert vec is not None
            flt = pushdown(q, with_where=False)
            assert flt is not None
            with timed("qdrant.search"):
                self.env.vectors.search(vec, flt, depth, model_id=self.env.model_id)
            if ids:
                with timed("postgres.filter"):
                    self.env.engine.relational.filter(q, ids=ids, limit=depth, with_where=False)
        elif vec is not None and (graph_first or q.graph is None):
            flt = pushdown(q, with_where=True, ids=ids)
            assert flt is not None
            with timed("qdrant.search"):
                self.env.vectors.search(vec, flt, depth, model_id=self.env.model_id)
        elif vec is None and not pushed:
            with timed("postgres.filter"):
                self.env.engine.relational.filter(q, ids=ids, limit=q.limit)
        top = [i for i, _ in answer]
        if top:
            with timed("postgres.hydrate"):
                self.env.records.get_many(top, include_deleted=False)
            with timed("neo4j.relationships"):
                self.env.graph.relationships(top)
        return f


# --------------------------------------------------------------------------------------------------
# Running and reporting


def same_ranking(a: Ranked, b: Ranked, *, tol: float = 1e-5) -> bool:
    """Equal scores position by position, equal ids except among ties at the cut-off.

    Scores tie (bag-of-words vectors of equal shape); Qdrant breaks ties arbitrarily, and the
    filter it evaluates differs between methods, so an id at a tied cut-off may differ legitimately.
    """
    if len(a) != len(b) or any(abs(x[1] - y[1]) > tol for x, y in zip(a, b, strict=True)):
        return False
    if not a:
        return True
    cut = a[-1][1]
    return {i for i, s in a if s > cut + tol} == {i for i, s in b if s > cut + tol}


def pct(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass(slots=True)
class ShapeResult:
    times: dict[str, list[float]] = field(default_factory=lambda: {"a": [], "b": [], "c": [], "d": [], "d'": []})
    steps: dict[str, list[float]] = field(default_factory=dict)
    floors: dict[str, int] = field(default_factory=dict)  # which sub-query was the slowest
    agree_b: int = 0
    agree_c: int = 0
    compared: int = 0
    hits: list[int] = field(default_factory=list)
    candidates: list[int] = field(default_factory=list)


def run_shape(m: Methods, queries: Sequence[MemoryQuery], *, warmup: int = 2) -> ShapeResult:
    """Interleaved: every query runs every method (order rotated), so load noise hits all alike."""
    r = ShapeResult()
    for q in queries[:warmup]:
        m.unified(q)
        m.naive(q)
        m.one_filter(q)
    for n, q in enumerate(queries):
        out: dict[str, Any] = {}
        steps: dict[str, float] = {}
        order = ["a", "b", "c"]
        order = order[n % 3 :] + order[: n % 3]
        for key in order:
            t0 = time.perf_counter()
            if key == "a":
                out["a"], steps = m.unified(q)
            elif key == "b":
                out["b"] = m.naive(q)
            else:
                out["c"] = m.one_filter(q)
            ms = (time.perf_counter() - t0) * 1000
            if key != "c" or out["c"] is not None:
                r.times[key].append(ms)
        for name, ms in steps.items():
            r.steps.setdefault(name, []).append(ms)
        assert m.last_plan is not None
        fl = m.floor(q, out["a"], m.last_plan)
        r.times["d"].append(fl.ms)
        if fl.fanout_ms is not None:
            r.times["d'"].append(max(fl.fanout_ms, fl.ms))
        r.floors[fl.slowest] = r.floors.get(fl.slowest, 0) + 1
        r.hits.append(len(out["a"]))
        if q.combine == "and":
            r.compared += 1
            r.agree_b += same_ranking(out["a"], out["b"])
            r.agree_c += out["c"] is None or same_ranking(out["a"], out["c"])
            for key in ("b", "c"):
                if out[key] is not None and not same_ranking(out["a"], out[key]):
                    print(f"    differs ({key}): {q.as_dict()}", file=sys.stderr)
                    for x, y in zip(out["a"], out[key], strict=False):
                        print(f"      {x[0]} {x[1]:.6f} | {y[0]} {y[1]:.6f}", file=sys.stderr)
    return r


def report(results: dict[str, ShapeResult], *, out: Callable[[str], None] = print) -> None:
    hdr = (
        f"{'shape':<32} {'(a) unified':>15} {'(b) naive':>15} {'(c) ids-1-filter':>17} {'(d) floor':>15}"
        f" {'a/d':>5} {'b/a':>5} {'c/a':>5}  agree b,c   slowest sub-query (d)"
    )
    out(hdr)
    out(f"{'':<32} {'p50 / p95 ms':>15} {'p50 / p95 ms':>15} {'p50 / p95 ms':>17} {'p50 / p95 ms':>15}")
    out("-" * len(hdr))
    for shape, r in results.items():
        p = {k: (pct(v, 0.5), pct(v, 0.95)) for k, v in r.times.items()}

        def cell(k: str, w: int, p: dict[str, tuple[float, float]] = p, r: ShapeResult = r) -> str:
            if not r.times[k]:
                return f"{'n/a':>{w}}"
            return f"{p[k][0]:>{w - 8}.1f} / {p[k][1]:<5.0f}"

        a, b, c, d = (p[k][0] for k in "abcd")
        agree = f"{r.agree_b}/{r.compared},{r.agree_c}/{r.compared}" if r.compared else "   -"
        floors = ", ".join(f"{k} x{v}" for k, v in sorted(r.floors.items(), key=lambda kv: -kv[1]))
        c_ratio = f"{c / a:>5.2f}" if r.times["c"] else "  n/a"
        out(
            f"{shape:<32} {cell('a', 15)} {cell('b', 15)} {cell('c', 17)} {cell('d', 15)}"
            f" {a / d:>5.2f} {b / a:>5.2f} {c_ratio}  {agree:<10} {floors}"
        )
    fanout = {shape: r.times["d'"] for shape, r in results.items() if r.times["d'"]}
    if fanout:
        out(
            "\n(d') where the engine's plan skipped a sub-query a parallel fan-out needs (vector-first: the full"
            " traversal), the slowest of those sub-queries run alone:"
        )
        for shape, values in fanout.items():
            a = pct(results[shape].times["a"], 0.5)
            d2 = pct(values, 0.5)
            out(f"  {shape:<32} d' p50 {d2:.1f} ms / p95 {pct(values, 0.95):.0f} ms; a/d' {a / d2:.2f}")
    out("\n(a) per-step p50 ms (engine explain):")
    for shape, r in results.items():
        parts = ", ".join(f"{k} {pct(v, 0.5):.1f}" for k, v in r.steps.items())
        out(f"  {shape:<32} {parts}")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------------------------------


def _admin_dsn() -> str:
    dsn = os.environ.get("MEMORYCTL_TEST_PG_DSN")
    if not dsn:
        sys.exit('MEMORYCTL_TEST_PG_DSN is not set: scripts/services up && eval "$(scripts/services env)"')
    return dsn


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="memories (default 100000)")
    ap.add_argument("--queries", type=int, default=50, help="queries per shape (default 50)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--small", action="store_true", help="n=5000, 10 queries per shape: a quick look")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--create-db", action="store_true", help="load a fresh data set (the default)")
    mode.add_argument("--reuse", action="store_true", help="reuse the data set a --keep run left")
    ap.add_argument("--keep", action="store_true", help="keep the database, vectors and graph for --reuse")
    ap.add_argument("--graph-batch", type=int, default=5000)
    ap.add_argument("--naive-k", type=int, default=NAIVE_K)
    ap.add_argument(
        "--retrieval",
        choices=("dense", "hybrid"),
        default="dense",
        help="text legs of the engine's queries: dense (like for like with the other methods) or hybrid",
    )
    ap.add_argument("--json", type=Path, help="also write the raw timings here")
    args = ap.parse_args(argv)
    if args.small:
        args.n, args.queries = 5000, min(args.queries, 10)

    admin = _admin_dsn()
    neo_uri = os.environ.get("MEMORYCTL_BENCH_NEO4J_URI") or os.environ.get("MEMORYCTL_TEST_NEO4J_URI")
    neo_pw = (
        os.environ.get("MEMORYCTL_BENCH_NEO4J_PASSWORD")
        if os.environ.get("MEMORYCTL_BENCH_NEO4J_URI")
        else os.environ.get("MEMORYCTL_TEST_NEO4J_PASSWORD")
    )
    if not neo_uri:
        sys.exit("no Neo4j: set MEMORYCTL_BENCH_NEO4J_URI (or MEMORYCTL_TEST_NEO4J_URI via scripts/services env)")
    state_dir = ROOT / ".cache" / "bench-query" / f"n{args.n}-s{args.seed}"
    manifest = state_dir / "manifest.json"
    base = admin.rpartition("/")[0]
    load_times: dict[str, float] = {}
    print(f"# benchmarks/query.py n={args.n} queries/shape={args.queries} seed={args.seed}; neo4j {neo_uri}")
    print(f"# load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; cores: {os.cpu_count()}")

    if args.reuse:
        info = json.loads(manifest.read_text())
        t0 = time.perf_counter()
        if "summary" in info:  # what make_queries needs; the memories themselves are in the stores
            ds = Dataset(**{**info["summary"], "anchor": datetime.fromisoformat(info["anchor"]), "memories": []})
        else:
            ds = generate(args.n, args.seed, anchor=datetime.fromisoformat(info["anchor"]), tag=info["tag"])
            manifest.write_text(json.dumps({**info, "summary": summary(ds)}))
        print(f"reuse {info['db']}: data set summary in {time.perf_counter() - t0:.1f} s")
        db = info["db"]
    else:
        t0 = time.perf_counter()
        ds = generate(args.n, args.seed)
        print(
            f"generate: {args.n} memories in {time.perf_counter() - t0:.1f} s; top author {ds.users[0]}"
            f" wrote {ds.authored[ds.users[0]]}"
        )
        db = f"mctl_bench_{ds.tag}"
        shutil.rmtree(state_dir, ignore_errors=True)
        state_dir.mkdir(parents=True)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    env = open_env(f"{base}/{db}", neo_uri, neo_pw, state_dir / "vectors", retrieval=args.retrieval)
    ok = False
    try:
        if not args.reuse:
            load_times = load(env, ds, graph_batch=args.graph_batch)
            manifest.write_text(
                json.dumps({"db": db, "tag": ds.tag, "anchor": ds.anchor.isoformat(), "summary": summary(ds)})
            )
        rss_load = peak_rss_mb()
        counts = {
            "postgres": env.records.count(agent_id=ds.agent),
            "qdrant": env.vectors.count(agent_id=ds.agent),
            "neo4j": env.graph.count(agent_id=ds.agent),
        }
        print(f"memories of {ds.agent} per store: {counts}")
        queries = make_queries(ds, args.queries, args.seed, retrieval=args.retrieval)
        methods = Methods(env, naive_k=args.naive_k)
        results: dict[str, ShapeResult] = {}
        load_before = os.getloadavg()
        t0 = time.perf_counter()
        for shape, qs in queries.items():
            results[shape] = run_shape(methods, qs)
            print(f"  ran {shape}: {time.perf_counter() - t0:.0f} s", flush=True)
        load_after = os.getloadavg()
        after = env.graph.count(agent_id=ds.agent)
        if after != counts["neo4j"]:
            print(f"WARNING: the graph changed during the run ({counts['neo4j']} -> {after}): a shared server wiped?")
        print()
        report(results)
        print()
        if load_times:
            print("load: " + ", ".join(f"{k} {v:.1f} s" for k, v in load_times.items()))
        print(f"peak RSS (this process): {rss_load:.0f} MB after load, {peak_rss_mb():.0f} MB after the queries")
        print(
            f"load average during queries: {' '.join(f'{x:.2f}' for x in load_before)} -> "
            f"{' '.join(f'{x:.2f}' for x in load_after)}"
        )
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "n": args.n,
                        "queries": args.queries,
                        "load_s": load_times,
                        "peak_rss_mb": peak_rss_mb(),
                        "shapes": {s: {"times_ms": r.times, "steps_ms": r.steps} for s, r in results.items()},
                    },
                    indent=1,
                )
            )
        ok = True
    finally:
        if not args.keep:
            try:
                drop_graph(env, ds.agents)
            finally:
                env.close()
                with psycopg.connect(admin, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
                shutil.rmtree(state_dir, ignore_errors=True)
        else:
            env.close()
            print(f"kept: database {db}, {state_dir}, graph agents {ds.agents} (rerun with --reuse)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
