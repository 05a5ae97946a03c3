"""Generated hostile input through the query engine, the where parser and raw Cypher, against the
real stores. Every case is either refused with a clear ``MemoryctlError`` or treated as data; the
canary rows prove nothing was executed as code. Together with tests/unit/test_query_spec.py's
where-fuzzing this is well over 1,000 generated inputs per run."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memoryctl.client import MemoryClient
from memoryctl.errors import MemoryctlError
from memoryctl.model import EntityRef, Memory, MemoryRef, Relation
from memoryctl.query.spec import GraphFilter, MemoryQuery, Where
from tests.conftest import cluster_settings, fresh_database, wipe_neo4j

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FRAGMENTS = [
    "'",
    '"',
    "`",
    ";",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    "$",
    "\\",
    "--",
    "/*",
    "*/",
    "%s",
    "%(x)s",
    "\x00",
    "MATCH (n) DETACH DELETE n",
    "DROP TABLE memories",
    "'; DELETE FROM memories; --",
    "}) RETURN 1 //",
    " OR 1=1",
    "CALL dbms.killQueries",
    "\u202e",
    "ä",
    "Alice",
    " ",
    "kind",
    "=",
    "<",
    "in",
]
hostile = st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=8).map("".join)

CANARY = uuid.UUID(int=42)


@pytest.fixture(scope="module")
def client(
    pg_admin_dsn: str, neo4j_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MemoryClient]:
    with fresh_database(pg_admin_dsn) as dsn:
        wipe_neo4j(neo4j_env)
        c = MemoryClient(
            cluster_settings(dsn, neo4j_env, tmp_path_factory.mktemp("h") / "q", query={"store_timeout_s": 15.0})
        )
        alice = EntityRef("User", "Alice")
        c.add(
            [
                Memory(
                    id=CANARY,
                    agent_id="a1",
                    text="canary: the rollback finished",
                    entities=[alice],
                    relations=[Relation(alice, "AUTHORED", MemoryRef(CANARY))],
                )
            ],
            extract=False,
        )
        yield c
        _assert_canary(c)
        c.close()


def _assert_canary(c: MemoryClient) -> None:
    assert c.stack.records.count(include_deleted=True) >= 1
    assert c.get(CANARY).text == "canary: the rollback finished"
    assert c.stack.require_graph().count() >= 1
    assert c.stack.require_vectors().count() >= 1


def _outcome(fn: object) -> str:
    try:
        fn()  # type: ignore[operator]
        return "ok"
    except MemoryctlError as exc:
        assert exc.message  # a clear message, never an empty one
        return "refused"


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=hostile, name=hostile, value=hostile)
def test_query_fields_are_data(client: MemoryClient, text: str, name: str, value: str) -> None:
    def run() -> None:
        q = MemoryQuery(
            text=text,
            agent_id="a1",
            graph=GraphFilter(EntityRef("User", name)),
            where=[Where.build("meta.team", "=", value)],
            combine="or",
            limit=5,
        )
        r = client.query(q)
        assert not r.degraded
        assert all(h.memory.agent_id == "a1" for h in r.hits)

    _outcome(run)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(clause=hostile)
def test_where_clauses_refused_or_bound(client: MemoryClient, clause: str) -> None:
    def run() -> None:
        client.query(MemoryQuery(agent_id="a1", where=[Where.parse(clause)]))

    _outcome(run)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(agent=hostile, entity_type=hostile)
def test_identifiers_are_whitelisted(client: MemoryClient, agent: str, entity_type: str) -> None:
    def run() -> None:
        client.query(MemoryQuery(text="rollback", agent_id=agent, graph=GraphFilter(EntityRef(entity_type, "x"))))

    assert _outcome(run) == "refused" or entity_type.isidentifier()


WRITES = [
    "CREATE (n:Pwned)",
    "MERGE (n:Pwned)",
    "MATCH (n) DETACH DELETE n",
    "MATCH (n) SET n.x = 1",
    "MATCH (n) REMOVE n.id",
    "CREATE INDEX pwn FOR (n:X) ON (n.y)",
    "LOAD CSV FROM 'file:///etc/passwd' AS l",
    "CALL db.clearQueryCaches()",
]


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    write=st.sampled_from(WRITES),
    prefix=st.sampled_from(["", "MATCH (m:Memory {agent_id: $agent_id}) WITH m ", "WITH $agent_id AS a "]),
    param=hostile,
)
def test_cypher_writes_never_run(client: MemoryClient, write: str, prefix: str, param: str) -> None:
    graph = client.stack.require_graph()
    run_read = graph.run_read  # type: ignore[attr-defined]
    outcome = _outcome(lambda: run_read(prefix + write + " RETURN $p AS p", {"p": param}, "a1"))
    assert outcome == "refused"
    rows = run_read("MATCH (n:Pwned) RETURN count(n) AS c", {}, None)
    assert rows == [{"c": 0}]


def test_cypher_reads_treat_params_as_data(client: MemoryClient) -> None:
    graph = client.stack.require_graph()
    rows = graph.run_read(  # type: ignore[attr-defined]
        "MATCH (m:Memory {agent_id: $agent_id}) WHERE m.id = $id RETURN m.id AS id",
        {"id": "' OR 1=1 //"},
        "a1",
    )
    assert rows == []
    rows = graph.run_read(  # type: ignore[attr-defined]
        "MATCH (m:Memory {agent_id: $agent_id}) RETURN count(m) AS c", {}, "a1"
    )
    assert rows == [{"c": 1}]


def test_hostile_memory_roundtrip(client: MemoryClient, tmp_path: Path) -> None:
    for i, frag in enumerate(FRAGMENTS):
        if "\x00" in frag:
            continue  # PostgreSQL text cannot hold NUL: refused below
        mid = uuid.UUID(int=1000 + i)
        ent = EntityRef("Thing", frag.strip() or "blank")
        client.add(
            [Memory(id=mid, agent_id="a1", text=f"x {frag} y", metadata={"v": frag}, entities=[ent])], extract=False
        )
        back = client.get(mid)
        assert back.text == f"x {frag} y" and back.metadata == {"v": frag}
    with pytest.raises(MemoryctlError):
        client.add([Memory(agent_id="a1", text="nul \x00 byte")], extract=False)
