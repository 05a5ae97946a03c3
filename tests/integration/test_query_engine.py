"""The unified query engine against real PostgreSQL, real Neo4j and Qdrant (local mode or
QDRANT_URL), with the real local embedding model: a hand-made memory set with known answers for
every plan shape, agent isolation, soft deletes, and degraded answers."""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from memoryctl.client import MemoryClient
from memoryctl.model import EntityRef, Memory, MemoryRef, Relation
from memoryctl.query import lexical
from memoryctl.query.fusion import RECENCY_WEIGHT, spread
from memoryctl.query.relational import scope_sql
from memoryctl.query.spec import GraphFilter, MemoryQuery, Where
from tests.conftest import cluster_settings, fresh_database, wipe_neo4j

pytestmark = pytest.mark.integration

NOW = datetime.now(UTC)
ALICE, BOB, CAROL = EntityRef("User", "Alice"), EntityRef("User", "Bob"), EntityRef("User", "Carol")
PHOENIX, OPS101 = EntityRef("Project", "Phoenix"), EntityRef("Ticket", "OPS-101")
PAYMENTS = EntityRef("Service", "payments")


def _said(mid: uuid.UUID, who: EntityRef, text: str, hours: float, agent: str = "a1", **kw: object) -> Memory:
    return Memory(
        id=mid,
        agent_id=agent,
        text=text,
        kind="dialogue",
        created_at=NOW - timedelta(hours=hours),
        entities=[who],
        relations=[Relation(who, "AUTHORED", MemoryRef(mid))],
        **kw,  # type: ignore[arg-type]
    )


def dataset() -> dict[str, Memory]:
    ids = {name: uuid.uuid5(uuid.NAMESPACE_URL, name) for name in "m1 m2 m3 m4 m5 m6 m7 m8 m9 m10 x1".split()}
    return {
        "m1": _said(
            ids["m1"],
            ALICE,
            "Alice: the rollback of the payments service finished, errors are back to normal.",
            1,
            metadata={"sentiment": 0.6},
        ),
        "m2": _said(
            ids["m2"],
            ALICE,
            "Alice: I started the rollback of payments because latency doubled.",
            3,
            metadata={"sentiment": -0.4},
        ),
        "m3": _said(
            ids["m3"],
            BOB,
            "Bob: can we skip the rollback and hotfix the connection pool instead?",
            4,
            metadata={"sentiment": -0.1},
        ),
        "m4": _said(
            ids["m4"], ALICE, "Alice: lunch today is pizza at the usual place.", 2, metadata={"sentiment": 0.9}
        ),
        "m5": _said(
            ids["m5"],
            ALICE,
            "Alice: the rollback of the search service last month took two hours.",
            24 * 20,
            metadata={"sentiment": -0.7},
        ),
        "m6": Memory(
            id=ids["m6"],
            agent_id="a1",
            kind="ticket",
            created_at=NOW - timedelta(hours=5),
            text="OPS-101: payments p99 latency doubled after the 2.4 deploy.",
            entities=[OPS101],
            relations=[Relation(OPS101, "BELONGS_TO", PHOENIX)],
            metadata={"severity": 1},
        ),
        "m7": Memory(
            id=ids["m7"],
            agent_id="a1",
            kind="document",
            created_at=NOW - timedelta(hours=30),
            text="Phoenix roadmap: milestone 3 ships the new checkout flow.",
            entities=[PHOENIX],
        ),
        # two hops from Phoenix: payments DEPENDS_ON OPS-101, which BELONGS_TO Phoenix
        "m10": Memory(
            id=ids["m10"],
            agent_id="a1",
            kind="note",
            created_at=NOW - timedelta(hours=50),
            text="The payments team owns the card processing integration.",
            entities=[PAYMENTS],
            relations=[Relation(PAYMENTS, "DEPENDS_ON", OPS101)],
        ),
        # same text, different ages: recency decides
        "m8": Memory(
            id=ids["m8"],
            agent_id="a1",
            kind="note",
            created_at=NOW - timedelta(days=1),
            text="The nightly backup job finished without errors.",
        ),
        "m9": Memory(
            id=ids["m9"],
            agent_id="a1",
            kind="note",
            created_at=NOW - timedelta(days=60),
            text="The nightly backup job finished without errors.",
        ),
        # another agent: a near copy of m1 with the same entity name
        "x1": _said(
            ids["x1"],
            ALICE,
            "Alice: the rollback of the payments service finished, errors are back to normal.",
            1,
            agent="a2",
        ),
    }


def _client(pg: str, neo4j: dict[str, str], tmp: Path, **extra: object) -> MemoryClient:
    return MemoryClient(cluster_settings(pg, neo4j, tmp / "qdrant", embedder={"kind": "local"}, **extra))


@pytest.fixture(scope="module")
def world(
    pg_admin_dsn: str, neo4j_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[MemoryClient, dict[str, Memory]]]:
    data = dataset()
    with fresh_database(pg_admin_dsn) as dsn:
        wipe_neo4j(neo4j_env)
        client = _client(dsn, neo4j_env, tmp_path_factory.mktemp("q"))
        client.init()
        out = client.add(list(data.values()), extract=False)
        assert out.pending == {"qdrant": 0, "neo4j": 0}, out.delivery.failed
        yield client, data
        client.close()


def ids_of(result: object) -> list[str]:
    return [str(h.id) for h in result.hits]  # type: ignore[attr-defined]


def names(data: dict[str, Memory], result: object) -> list[str]:
    by_id = {str(m.id): k for k, m in data.items()}
    return [by_id[i] for i in ids_of(result)]


def test_graph_vector_time(world: tuple[MemoryClient, dict[str, Memory]]) -> None:
    client, data = world
    r = client.query(
        MemoryQuery(
            text="what did Alice say about the rollback?",
            agent_id="a1",
            graph=GraphFilter(ALICE, ("AUTHORED",)),
            since=NOW - timedelta(days=7),
        )
    )
    got = names(data, r)
    assert set(got) == {"m1", "m2", "m4"}  # Alice's, within 7 days (m5 too old; m3 is Bob's; x1 other agent)
    assert set(got[:2]) == {"m1", "m2"}  # the rollback ones first, lunch last
    assert r.degraded == []
    assert r.plan.startswith("graph → vector")
    steps = {s.name: s for s in r.steps}
    assert steps["graph.traverse"].rows_out == 4  # m1 m2 m4 m5: the time filter is pushed into Qdrant
    assert steps["vector.search"].detail["filter"]["ids"] == 4
    assert all(h.scores["vector"] > 0 and h.score == h.scores["relevance"] for h in r.hits)
    assert not any("recency" in h.scores for h in r.hits)  # no half-life configured: relevance alone
    assert steps["lexical.search"].detail["ids"] == 4  # the lexical leg is scoped to the same candidates
    assert r.hits[0].relationships and r.hits[0].relationships[0]["type"] == "AUTHORED"


def test_relational_vector_pushdown(world: tuple[MemoryClient, dict[str, Memory]]) -> None:
    client, data = world
    r = client.query(MemoryQuery(text="latency problems", agent_id="a1", where=[Where.parse("kind = ticket")]))
    assert names(data, r) == ["m6"]
    # nothing pulled up first: PostgreSQL's other steps are the lexical leg, under the same where
    # clause, the entity names the question says (query/dense_question.py: none here, a few key lookups)
    # and the candidates' following turns under the where clause too (the conversational context)
    assert [s.name for s in r.steps if s.store == "postgres"] == [
        "lexical.search",
        "postgres.names",
        "postgres.context",
        "postgres.hydrate",
    ]
    r = client.query(MemoryQuery(text="rollback", agent_id="a1", where=[Where.parse("sentiment < 0")]))
    assert set(names(data, r)) == {"m2", "m3", "m5"}


def test_or_fuses_legs(world: tuple[MemoryClient, dict[str, Memory]]) -> None:
    client, data = world
    r = client.query(MemoryQuery(text="rollback", agent_id="a1", graph=GraphFilter(BOB), combine="or", limit=5))
    got = names(data, r)
    assert got[0] == "m3"  # the only memory both legs return
    assert {"m1", "m2"} <= set(got)
    assert "rrf" in r.hits[0].scores and "vector" in r.hits[0].scores and "graph" in r.hits[0].scores
    assert r.plan.startswith("or")


def test_graph_only_hops_and_types(world: tuple[MemoryClient, dict[str, Memory]]) -> None:
    """Entities reached within N hops along the allowed types; a hit is a memory that mentions one
    of them (or is itself on the path). Newest first."""
    client, data = world
    one = client.query(MemoryQuery(agent_id="a1", graph=GraphFilter(PHOENIX, hops=1)))
    assert names(data, one) == ["m6", "m7"]  # m7 mentions Phoenix; m6 mentions OPS-101 (BELONGS_TO Phoenix)
    two = client.query(MemoryQuery(agent_id="a1", graph=GraphFilter(PHOENIX, hops=2)))
    assert names(data, two) == ["m6", "m7", "m10"]  # + payments DEPENDS_ON OPS-101
    typed = client.query(MemoryQuery(agent_id="a1", graph=GraphFilter(PHOENIX, via=("DEPENDS_ON",), hops=2)))
    assert names(data, typed) == ["m7"]  # BELONGS_TO not allowed: only Phoenix itself
    outgoing = client.query(MemoryQuery(agent_id="a1", graph=GraphFilter(PHOENIX, hops=2, direction="out")))
    assert names(data, outgoing) == ["m7"]  # every edge points at Phoenix, none away from it
    assert {s.store for s in two.steps} == {"neo4j", "postgres"}
    # The graph store filters by time, orders newest first and cuts; PostgreSQL only hydrates.
    assert two.plan == "graph(time pushed down, newest first)"
    assert [st.name for st in two.steps if st.store == "postgres"] == ["postgres.hydrate"]
    around = GraphFilter(PHOENIX, hops=2)
    recent = client.query(MemoryQuery(agent_id="a1", graph=around, since=NOW - timedelta(hours=40)))
    assert names(data, recent) == ["m6", "m7"]  # m10 is 50 hours old
    newest = client.query(MemoryQuery(agent_id="a1", graph=around, limit=1))
    assert names(data, newest) == ["m6"]
    traverse = next(st for st in newest.steps if st.name == "graph.traverse")
    assert traverse.detail["order"] == "newest first" and traverse.detail["limit"] == 12
    # A where clause the graph cannot answer: traversal, then PostgreSQL filters.
    notes = client.query(MemoryQuery(agent_id="a1", graph=around, where=[Where.parse("kind = note")]))
    assert names(data, notes) == ["m10"]
    assert "postgres.filter" in [st.name for st in notes.steps]


def test_time_only(world: tuple[MemoryClient, dict[str, Memory]]) -> None:
    client, data = world
    r = client.query(MemoryQuery(agent_id="a1", since=NOW - timedelta(hours=6), limit=20))
    assert names(data, r) == ["m1", "m4", "m2", "m3", "m6"]


def test_recency_orders_equal_texts_and_never_lifts_the_unrelated(
    world: tuple[MemoryClient, dict[str, Memory]],
) -> None:
    client, data = world
    q = MemoryQuery(text="nightly backup job finished", agent_id="a1", half_life=timedelta(days=30), limit=20)
    r = client.query(q)
    got = names(data, r)
    # The newer copy first; the 60-day-old copy right after it, above every newer memory that is
    # about something else (the old multiplier put it below them all).
    assert got[:2] == ["m8", "m9"]
    new, old = r.hits[0].scores["recency"], r.hits[1].scores["recency"]
    assert old / new == pytest.approx(0.5 ** (59 / 30), rel=0.02)
    assert len(r.hits) < q.limit  # every candidate is a hit: the band's spread is over these
    band = RECENCY_WEIGHT * spread([h.scores["relevance"] for h in r.hits])
    assert r.hits[0].score - r.hits[1].score == pytest.approx(band * (new - old), abs=1e-6)
    flat = client.query(MemoryQuery(text="nightly backup job finished", agent_id="a1", decay=False, limit=2))
    assert flat.hits[0].score == pytest.approx(flat.hits[1].score, abs=1e-5)


def test_lexical_leg_is_scoped_like_the_vector_leg(world: tuple[MemoryClient, dict[str, Memory]]) -> None:
    """Agent, time, where clauses and graph candidates, in the same SQL as the words; soft
    deletes too (tests/integration/test_write_path forgets and queries)."""
    client, data = world
    words = "rollback payments Alice"  # x1 (agent a2) has all three words too

    def lexical(**kw: object) -> list[str]:
        r = client.query(MemoryQuery(text=words, agent_id="a1", retrieval="lexical", **kw))  # type: ignore[arg-type]
        assert r.plan.startswith(("lexical(", "graph → lexical(")) and r.degraded == []
        return names(data, r)

    assert set(lexical()) >= {"m1", "m2", "m3"} and "x1" not in lexical()
    assert "m5" not in lexical(since=NOW - timedelta(days=7))  # 20 days old
    assert set(lexical(where=[Where.parse("sentiment < 0")])) == {"m2", "m3", "m5"}
    assert set(lexical(graph=GraphFilter(BOB))) == {"m3"}

    # the graph's candidates choose what is returned, not the words' weights: m3 scores the same
    def m3_score(graph: GraphFilter | None) -> float:
        r = client.query(MemoryQuery(text=words, agent_id="a1", retrieval="lexical", graph=graph))
        return next(h.scores["lexical"] for h in r.hits if h.id == data["m3"].id)

    assert m3_score(GraphFilter(BOB)) == pytest.approx(m3_score(None), rel=1e-9)
    # entity names are searched as words, also where the text never says them
    said = Memory(agent_id="a3", text="the canary stage is still missing", entities=[EntityRef("Speaker", "Zebulon")])
    client.add([said], extract=False)
    found = client.query(MemoryQuery(text="what did Zebulon say", agent_id="a3", retrieval="lexical"))
    assert [h.id for h in found.hits] == [said.id]


def test_the_speaker_named_in_the_question_separates_equal_texts(
    world: tuple[MemoryClient, dict[str, Memory]],
) -> None:
    """Two people said the same words; the question names the one who said them first. The name
    is a word of every turn that person said (a third of this agent's memories): weighed among the
    memories that matched any word, nearly all of them on the name, it weighed next to nothing
    and recency gave the newer copy the first place. Asked with a half-life: the older, named turn
    still comes first."""
    client, _ = world
    chatter = [
        "The staging cluster is slow again",
        "Release notes are drafted",
        "Who owns the billing dashboard",
        "The on-call rota is posted",
        "Coffee machine is fixed",
        "Standup moved to ten",
        "I reviewed the schema change",
        "Docs site deploy went fine",
    ]
    said = {
        "Hana": ["GPU hours doubled last month, need to cut", *chatter],
        "Lukas": ["GPU hours doubled last month, need to cut", *chatter[::-1]],
        "Chen": chatter,
    }
    turns = [
        Memory(
            agent_id="a4",
            text=text,
            kind="dialogue",
            # Hana said it three months before Lukas repeated it
            created_at=NOW - timedelta(days=100 if who == "Hana" else 1, minutes=n),
            entities=[EntityRef("Speaker", who)],
        )
        for who, texts in said.items()
        for n, text in enumerate(texts)
    ]
    client.add(turns, extract=False)
    question = "When Hana raised the GPU hours issue"
    r = client.query(MemoryQuery(text=question, agent_id="a4", half_life=timedelta(days=30)))
    assert r.hits[0].id == turns[0].id, [(h.memory.text, h.memory.entities[0].name, h.score) for h in r.hits]
    # The name's weight in the lexical leg: its inverse document frequency over the agent's 26
    # memories, 9 of them Hana's (among the 10 that matched any word it was ln(1 + 1.5 / 9.5)).
    lexical = {h.id: h.scores["lexical"] for h in r.hits if "lexical" in h.scores}
    hana, lukas = turns[0].id, turns[len(said["Hana"])].id
    assert lexical[hana] - lexical[lukas] == pytest.approx(math.log(1 + (26 - 9 + 0.5) / (9 + 0.5)), rel=1e-6)
    # The dense leg alone cannot tell the copies apart; the named-entity leg can.
    dense = client.query(MemoryQuery(text=question, agent_id="a4", retrieval="dense", decay=False))
    by_id = {h.id: h for h in dense.hits}
    assert dense.hits[0].id == hana and by_id[hana].scores["entity"] == 1.0 and "entity" not in by_id[lukas].scores
    assert by_id[hana].scores["vector"] == pytest.approx(by_id[lukas].scores["vector"], abs=1e-6)


def test_threshold_is_a_similarity_floor(world: tuple[MemoryClient, dict[str, Memory]]) -> None:
    client, _ = world
    loose = client.query(MemoryQuery(text="pizza for lunch", agent_id="a1", limit=20, decay=False))
    sims = sorted((h.scores["vector"] for h in loose.hits), reverse=True)
    cut = (sims[0] + sims[1]) / 2
    tight = client.query(MemoryQuery(text="pizza for lunch", agent_id="a1", threshold=cut, decay=False))
    assert len(tight.hits) == 1 and tight.hits[0].scores["vector"] >= cut


def test_agent_isolation_every_path(world: tuple[MemoryClient, dict[str, Memory]]) -> None:
    client, data = world
    queries = [
        MemoryQuery(text="rollback payments", agent_id="a2"),
        MemoryQuery(text="rollback", agent_id="a2", graph=GraphFilter(ALICE, ("AUTHORED",))),
        MemoryQuery(agent_id="a2", graph=GraphFilter(ALICE)),
        MemoryQuery(agent_id="a2", since=NOW - timedelta(days=90)),
        MemoryQuery(text="rollback", agent_id="a2", graph=GraphFilter(ALICE), combine="or"),
        MemoryQuery(agent_id="a2", where=[Where.parse("kind = dialogue")]),
    ]
    for q in queries:
        assert names(data, client.query(q)) == ["x1"], q


def test_degraded_neo4j_unreachable(pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path) -> None:
    data = dataset()
    with _client(pg_dsn, neo4j_clean, tmp_path) as healthy:
        healthy.add(list(data.values()), extract=False)
    # same PostgreSQL and Qdrant data; nothing listens where Neo4j should be
    broken = _client(pg_dsn, {"uri": "bolt://127.0.0.1:9", "password": ""}, tmp_path)
    try:
        r = broken.query(MemoryQuery(text="rollback", agent_id="a1", graph=GraphFilter(ALICE)))
        assert r.degraded == ["neo4j"]
        assert set(names(data, r)) <= {"m1", "m2", "m4", "m5"} and "m1" in names(data, r)
        assert any(s.name == "fallback.mentions" for s in r.steps)
        iso = broken.query(MemoryQuery(agent_id="a2", graph=GraphFilter(ALICE)))
        assert names(data, iso) == ["x1"]
    finally:
        broken.close()


def test_degraded_qdrant_unreachable(world: tuple[MemoryClient, dict[str, Memory]], tmp_path: Path) -> None:
    client, data = world
    settings = cluster_settings(
        client.settings.postgres.dsn,
        {
            "uri": client.settings.neo4j.uri,
            "password": client.settings.neo4j.password.get_secret_value() if client.settings.neo4j.password else "",
        },
        tmp_path / "unused",
        embedder={"kind": "local"},
        qdrant={"url": "http://127.0.0.1:9", "timeout_s": 1.0},
    )
    broken = MemoryClient(settings)
    try:
        r = broken.query(MemoryQuery(text="rollback payments", agent_id="a1"))
        assert r.degraded == ["qdrant"]
        assert names(data, r)[0] in {"m1", "m2"}
        assert any("lexical leg alone" in n for n in r.notes)
        assert names(data, broken.query(MemoryQuery(text="rollback payments", agent_id="a2"))) == ["x1"]
    finally:
        broken.close()


def test_lexical_statement_timeout_degrades_to_the_dense_leg(
    pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path
) -> None:
    """A real fault: an ACCESS EXCLUSIVE lock on ``memories`` (what a migration's ALTER TABLE
    takes) holds the lexical statement until PostgreSQL cancels it (``[query] lexical_timeout_s``,
    well under the 2 s store timeout). The dense leg answers alone and the answer names the lexical
    leg; the lock goes once the next statement (hydration) queues behind it."""
    data = dataset()
    client = _client(pg_dsn, neo4j_clean, tmp_path, query={"lexical_timeout_s": 0.2})
    try:
        client.add(list(data.values()), extract=False)
        dense = client.query(MemoryQuery(text="rollback payments", agent_id="a1", retrieval="dense"))
        with psycopg.connect(pg_dsn) as locker:
            locker.execute("LOCK TABLE memories IN ACCESS EXCLUSIVE MODE")
            release = threading.Thread(target=_release_after_second_waiter, args=(locker, pg_dsn))
            release.start()
            r = client.query(MemoryQuery(text="rollback payments", agent_id="a1"))
            release.join()
        assert r.degraded == ["lexical"] and any("dense leg alone" in n for n in r.notes)
        failed = next(st for st in r.steps if st.name == "lexical.search")
        assert failed.status == "failed" and "statement timeout" in (failed.error or "")  # PostgreSQL cancelled it
        assert ids_of(r) == ids_of(dense) and all("lexical" not in h.scores for h in r.hits)
        healthy = client.query(MemoryQuery(text="rollback payments", agent_id="a1"))
        assert healthy.degraded == [] and any("lexical" in h.scores for h in healthy.hits)
    finally:
        client.close()


def _release_after_second_waiter(locker: psycopg.Connection[Any], dsn: str) -> None:
    """Commit ``locker`` (releasing its lock) once a second statement waits for it: the first is
    the lexical leg's, the next one comes only after the engine gave the lexical leg up. After 30 s
    it commits anyway, and the test's assertions say what happened."""
    first: tuple[object, object] | None = None
    deadline = time.monotonic() + 30
    with psycopg.connect(dsn, autocommit=True) as watch:
        while time.monotonic() < deadline:
            waiting = watch.execute(
                "SELECT pid, query_start FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            ).fetchall()
            first = first or (waiting[0] if waiting else None)
            if any(w != first for w in waiting):
                break
            time.sleep(0.01)
    locker.commit()


def test_soft_deleted_never_returned(pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path) -> None:
    data = dataset()
    client = _client(pg_dsn, neo4j_clean, tmp_path)
    try:
        client.add(list(data.values()), extract=False)
        client.forget([data["m1"].id, data["m6"].id], agent_id="a1")
        gone = {str(data["m1"].id), str(data["m6"].id)}
        queries = [
            MemoryQuery(text="rollback payments finished", agent_id="a1", limit=50),
            MemoryQuery(text="rollback", agent_id="a1", graph=GraphFilter(ALICE, ("AUTHORED",)), limit=50),
            MemoryQuery(agent_id="a1", graph=GraphFilter(PHOENIX, hops=2), limit=50),
            MemoryQuery(agent_id="a1", since=NOW - timedelta(days=90), limit=50),
            MemoryQuery(text="latency", agent_id="a1", graph=GraphFilter(ALICE), combine="or", limit=50),
            MemoryQuery(agent_id="a1", where=[Where.parse("kind in dialogue,ticket")], limit=50),
        ]
        for q in queries:
            got = set(ids_of(client.query(q)))
            assert got and not gone & got, q  # an answer, without the deleted ones
        # the fallbacks too
        client.stack.records.pool  # noqa: B018 - keep the database; break the secondary stores
        fallback = _client(
            pg_dsn,
            {"uri": "bolt://127.0.0.1:9", "password": ""},
            tmp_path / "other",
            qdrant={"url": "http://127.0.0.1:9", "timeout_s": 1.0},
        )
        try:
            for q in queries:
                r = fallback.query(q)
                got = set(ids_of(r))
                assert got and not gone & got, q
        finally:
            fallback.close()
    finally:
        client.close()


# The oracle: the statement the lexical leg had before its statistics and word sets, which scored
# every memory in scope that holds a word, with weights counted over the scope on every query.
WHOLE_SCOPE = (
    "WITH terms AS MATERIALIZED (SELECT t, to_tsquery('simple', t) AS tq FROM (SELECT DISTINCT"
    " CASE WHEN length(w) >= 5 THEN quote_literal(left(w, 5)) || ':*' ELSE quote_literal(w) END AS t"
    " FROM unnest(tsvector_to_array(to_tsvector('simple', %s))) AS w"
    " WHERE position(chr(92) in w) = 0 AND to_tsvector('english', w) <> ''::tsvector) AS words),"
    " cand AS MATERIALIZED (SELECT id, tsv, created_at FROM memories"
    " WHERE tsv @@ (SELECT to_tsquery('simple', string_agg(t, ' | ')) FROM terms) AND {}),"
    " hits AS MATERIALIZED (SELECT c.id, c.created_at, t.t FROM cand c JOIN terms t ON c.tsv @@ t.tq),"
    " idf AS MATERIALIZED (SELECT t, ln(1.0 + ((SELECT count(*) FROM memories WHERE {}) - count(*) + 0.5)"
    " / (count(*) + 0.5)) AS w FROM hits GROUP BY t)"
    " SELECT h.id, sum(idf.w) AS score, max(h.created_at) AS at FROM hits h JOIN idf ON idf.t = h.t"
    " GROUP BY h.id ORDER BY score DESC, at DESC, h.id LIMIT %s"
)


def scored_in_full(client: MemoryClient, q: MemoryQuery, limit: int) -> list[tuple[uuid.UUID, float]]:
    cond, params = scope_sql(q)
    with client.stack.pool.connection() as conn:
        rows = conn.execute(sql.SQL(WHOLE_SCOPE).format(cond, cond), [q.text, *params, *params, limit])
        return [(r["id"], float(r["score"])) for r in rows]


def test_lexical_leg_ranks_common_word_sets_as_if_it_scored_every_memory(
    world: tuple[MemoryClient, dict[str, Memory]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every word "common" (a budget of 0), each set of words is read newest first up to the
    limit; with every word "rare", every holder is scored: both give the same memories with the same
    scores, in the same order, as the statement that scored every memory in scope holding a word --
    with small limits that cut the sets short, in every kind of scope."""
    client, data = world
    relational = client.engine.relational
    cases = [
        MemoryQuery(text="the rollback of payments latency", agent_id="a1"),
        MemoryQuery(text="Alice rollback payments", agent_id="a1"),
        MemoryQuery(text="Alice rollback", agent_id="a1", since=NOW - timedelta(days=7)),  # counted over the scope
        MemoryQuery(text="Alice rollback", agent_id="a1", since=NOW - timedelta(days=365)),  # all of a1: statistics
        MemoryQuery(text="rollback payments errors", agent_id="a1", where=[Where.parse("sentiment < 0.7")]),
        MemoryQuery(text="nightly backup errors", agent_id="a1", until=NOW - timedelta(hours=20)),
    ]
    common_sets: list[int] = []
    split = lexical.split

    def recording_split(words: list[lexical.Word], *, bounded: bool) -> tuple[list[lexical.Word], list[lexical.Word]]:
        rare, common = split(words, bounded=bounded)
        common_sets.append(len(common))
        return rare, common

    monkeypatch.setattr(lexical, "split", recording_split)

    def ranked(budget: int) -> list[list[tuple[uuid.UUID, float]]]:
        monkeypatch.setattr(lexical, "RARE_BUDGET", budget)
        return [relational.lexical(q, q.text or "", limit=limit) for q in cases for limit in (1, 2, 3, 10)]

    everything = ranked(10**9)
    assert set(common_sets) == {0} and all(everything)
    assert everything == [scored_in_full(client, q, limit) for q in cases for limit in (1, 2, 3, 10)]
    common_sets.clear()
    assert ranked(0) == everything
    assert min(common_sets) >= 2 and max(common_sets) == lexical.MAX_COMMON
    # every agent at once, or the graph's candidates: every word is scored (nothing to read newest first)
    common_sets.clear()
    relational.lexical(MemoryQuery(text="Alice rollback", agent_id=None), "Alice rollback", limit=3)
    relational.lexical(cases[1], "Alice rollback", limit=3, ids=[data["m1"].id])
    assert common_sets == [0, 0]


def test_lexical_common_word_sets_are_read_newest_first_without_statistics(
    world: tuple[MemoryClient, dict[str, Memory]],
) -> None:
    """Right after an import, before autovacuum analyses the table, the planner knows nothing about
    the words: the common words' sets must still be read newest first from the agent's live
    memories (stopping at the limit), never gathered from the word index and sorted."""
    client, _ = world
    words = [lexical.Word("'alice'", 90_000, Decimal("0.1")), lexical.Word("'rollb':*", 60_000, Decimal("0.5"))]
    cond, params = scope_sql(MemoryQuery(text="Alice rollback", agent_id="a1"))
    query, params = lexical.ranked_sql(words, words, cond, params, limit=10, ids=None)
    with client.stack.pool.connection() as conn:
        conn.execute("DELETE FROM pg_statistic WHERE starelid = 'memories'::regclass")
        conn.execute("UPDATE pg_class SET reltuples = -1, relpages = 0 WHERE oid = 'memories'::regclass")
        plan = "\n".join(str(row["QUERY PLAN"]) for row in conn.execute(sql.SQL("EXPLAIN ") + query, params))
        conn.execute("ANALYZE memories")
    # on a hypertable one backward scan per chunk (of that chunk's memories_live_scope), in time order
    assert plan.count("memories_live_scope on") >= 3 and "Index Scan Backward" in plan, plan
    assert "memories_tsv" not in plan and "Seq Scan" not in plan, plan


def test_following_turns_are_the_next_live_memories_in_scope(world: tuple[MemoryClient, dict[str, Memory]]) -> None:
    """The conversational context's statement (``RelationalQueries.following``): per memory, the
    next memories of its agent in (time, write order), later by at most ``within``, live and in
    the query's scope. Memories written at the same instant follow each other in the order they
    were written (schema 0008), whatever their ids; without a write order (memories written
    before 0008) neither follows the other."""
    client, _ = world
    rel = client.engine.relational
    agent = "ctx"
    start = NOW - timedelta(days=3)
    turns = [
        Memory(agent_id=agent, text=f"turn {n}", created_at=start + timedelta(minutes=n), metadata={"n": n})
        for n in range(6)
    ]
    # same instant as turn 2, written after it: ids in both orders, so the id cannot be what orders
    twins = [
        Memory(id=uuid.UUID(int=n), agent_id=agent, text=f"turn 2 twin {n}", created_at=turns[2].created_at)
        for n in (2**127 + 1, 1)
    ]
    late = Memory(agent_id=agent, text="the next day", created_at=start + timedelta(days=1))
    elsewhere = Memory(agent_id="ctx-other", text="turn 0 elsewhere", created_at=turns[0].created_at)
    client.add([*turns, *twins, late, elsewhere], extract=False)
    client.forget([turns[3].id])
    hour = timedelta(hours=1)
    q = MemoryQuery(text="turn", agent_id=agent)
    got = rel.following(q, [turns[0].id, turns[2].id, twins[0].id, turns[5].id], turns=2, within=hour)
    # turn 2 and its twins share an instant: the write order; the deleted turn 3 is skipped; the
    # next day is too late
    assert got == {
        turns[0].id: [turns[1].id, turns[2].id],
        turns[2].id: [twins[0].id, twins[1].id],
        twins[0].id: [twins[1].id, turns[4].id],
        turns[5].id: [],
    }
    assert rel.following(q, [turns[1].id], turns=4, within=hour)[turns[1].id] == [
        turns[2].id,
        twins[0].id,
        twins[1].id,
        turns[4].id,
    ]
    assert rel.following(q, [turns[5].id], turns=2, within=timedelta(days=2)) == {turns[5].id: [late.id]}
    # the query's scope: a time range, where clauses; another agent's memory is never a neighbour
    until = MemoryQuery(text="turn", agent_id=agent, until=turns[2].created_at)
    assert rel.following(until, [turns[0].id], turns=3, within=hour) == {turns[0].id: [turns[1].id]}
    odd = MemoryQuery(text="turn", agent_id=agent, where=[Where.parse("n in [1, 5]")])
    assert rel.following(odd, [turns[0].id], turns=3, within=hour) == {turns[0].id: [turns[1].id, turns[5].id]}
    assert rel.following(MemoryQuery(text="turn"), [elsewhere.id], turns=9, within=hour) == {elsewhere.id: []}
    # written before schema 0008 (no write order): memories of one instant follow neither way
    with client.stack.pool.connection() as conn:
        conn.execute("UPDATE memories SET seq = NULL WHERE id = ANY(%s)", ([twins[0].id, twins[1].id],))
    assert rel.following(q, [turns[2].id, twins[0].id], turns=2, within=hour) == {
        turns[2].id: [turns[4].id, turns[5].id],
        twins[0].id: [turns[4].id, turns[5].id],
    }


def test_names_said_are_the_scopes_entity_names_in_the_question(world: tuple[MemoryClient, dict[str, Memory]]) -> None:
    """``RelationalReads.names_said`` (schema 0009): the names of entities the agent's live
    memories carry that the question says as whole words, lower-cased, multi-word names and
    punctuation included; a forgotten memory's entity, another agent's, or a name inside a word is
    none of them. The engine embeds the question without them (``embed.query``'s text)."""
    client, _ = world
    rel = client.engine.relational
    agent = "names"
    kept = [
        Memory(agent_id=agent, text="renewal signed", entities=[EntityRef("Customer", "Acme  Corp.")]),
        Memory(agent_id=agent, text="thanks Bob", entities=[EntityRef("Speaker", "Fatima")]),
        Memory(agent_id=agent, text="no canary scares me", entities=[EntityRef("Speaker", "Bob")]),
    ]
    gone = Memory(agent_id=agent, text="old news", entities=[EntityRef("Place", "Lisbon")])
    other = Memory(agent_id="names-other", text="hi", entities=[EntityRef("Speaker", "Hana")])
    client.add([*kept, gone, other], extract=False)
    client.forget([gone.id])
    q = MemoryQuery(text="x", agent_id=agent)
    said = "Did Bob's team and Fatima talk about ACME corp, Lisbon, Hana or Bobby?"
    assert rel.names_said(q, said) == ["acme corp", "bob", "fatima"]
    assert rel.names_said(MemoryQuery(text="x"), said) == ["acme corp", "bob", "fatima", "hana"]  # every agent
    assert rel.names_said(q, "?!") == []
    r = client.query(MemoryQuery(text="the risks Bob raised", agent_id=agent))
    step = next(st for st in r.steps if st.name == "embed.query")
    ranked = [h.memory.text for h in r.hits]
    assert step.detail["text"] == "the risks raised" and ranked.index("no canary scares me") < ranked.index(
        "thanks Bob"
    )
