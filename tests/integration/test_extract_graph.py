"""The LLM extractor's output written through ``add()`` into both graph engines.

vLLM is the one part that cannot run here (no GPU): a STAND-IN serves the response pinned to vLLM
0.19.1 (tests/fixtures/vllm-0.19.1, whose schema compiles with the xgrammar it runs with:
tests/unit/test_extract_contract.py). Everything after the HTTP answer is real: the extractor's
validation, ``MemoryClient.add`` with ``[extractor] kind = "llm"``, the write path, and the graph in
Neo4j (cluster profile) and in PostgreSQL's tables (embedded profile), read back and traversed.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memoryctl.client import MemoryClient
from memoryctl.config import load_settings
from memoryctl.model import EntityRef, Memory, MemoryRef, Relation
from memoryctl.query.spec import GraphFilter, MemoryQuery
from tests.conftest import cluster_settings
from tests.unit.test_extract import StandInChatServer

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.19.1"
TEXT = json.loads((FIXTURES / "chat_request.json").read_text())["request_text"]
ALICE, BOB = EntityRef("Person", "Alice"), EntityRef("Person", "Bob")
OPS, PAYMENTS = EntityRef("Ticket", "OPS-42"), EntityRef("Project", "payments service")


@pytest.fixture
def vllm() -> Iterator[StandInChatServer]:
    srv = StandInChatServer()
    srv.reply = (200, json.loads((FIXTURES / "chat_response.json").read_text()))
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(params=["neo4j", "sql"])
def client(
    request: pytest.FixtureRequest, vllm: StandInChatServer, pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path
) -> Iterator[MemoryClient]:
    llm: dict[str, Any] = {"extractor": {"kind": "llm"}, "vllm": {"url": vllm.url}}
    if request.param == "neo4j":
        settings = cluster_settings(pg_dsn, neo4j_clean, tmp_path / "qdrant", **llm)
    else:  # the embedded profile: PostgreSQL from the wheel, the SQL graph, Qdrant Edge
        settings = load_settings(Path(os.devnull), data_dir=tmp_path / "embedded", embedder={"kind": "hash"}, **llm)
    with MemoryClient(settings) as c:
        c.init()
        yield c


def test_extracted_graph_is_written_and_traversable(client: MemoryClient, vllm: StandInChatServer) -> None:
    mid, other = uuid.UUID(int=42), uuid.UUID(int=43)
    out = client.add([Memory(id=mid, agent_id="support", text=TEXT)])
    assert out.pending == {client.stack.store_names["vector"]: 0, client.stack.store_names["graph"]: 0}
    [request] = vllm.requests
    assert request["body"]["response_format"]["type"] == "json_schema"
    stored = client.get(mid)
    assert {(e.type, e.name) for e in stored.entities} == {(e.type, e.name) for e in (ALICE, BOB, OPS, PAYMENTS)}
    assert set(stored.relations) == {
        Relation(ALICE, "WORKS_ON", OPS),
        Relation(OPS, "BELONGS_TO", PAYMENTS),
        Relation(BOB, "RELATES_TO", MemoryRef(mid)),
        Relation(ALICE, "AUTHORED", MemoryRef(mid)),
    }
    # A second memory that only mentions the payments service: the extracted edges are the only way
    # from Alice or the ticket to it.
    client.add([Memory(id=other, agent_id="support", text="payments are back", entities=[PAYMENTS])], extract=False)
    assert client.stack.require_graph().count() == 2
    for entity, via, hops, direction, expected in [
        (ALICE, ("WORKS_ON",), 1, "both", {mid}),
        (ALICE, ("WORKS_ON", "BELONGS_TO"), 2, "both", {mid, other}),
        (ALICE, ("WORKS_ON", "BELONGS_TO"), 2, "in", {mid}),
        (OPS, ("BELONGS_TO",), 1, "out", {mid, other}),
        (OPS, ("BELONGS_TO",), 1, "in", {mid}),
        (PAYMENTS, ("BELONGS_TO",), 1, "in", {mid, other}),
        (BOB, ("RELATES_TO",), 3, "both", {mid}),
        (EntityRef("Person", "Carol"), (), 1, "both", set()),
    ]:
        r = client.query(
            MemoryQuery(agent_id="support", graph=GraphFilter(entity, via=via, hops=hops, direction=direction))
        )
        assert {h.id for h in r.hits} == expected, (entity, via, hops, direction)
        assert not r.degraded
