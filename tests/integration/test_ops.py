"""Operations against the real stores: reconcile, migrate, reembed, health with stores down.

Fault tests stop a *private* Neo4j server (scripts/neo4j-server on its own port and state
directory) for real, so the shared test server other suites use is never taken away from them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memoryctl.client import MemoryClient
from memoryctl.delivery import Deliverer, vector_point
from memoryctl.embed import make_embedder
from memoryctl.errors import StoreError
from memoryctl.health import check
from memoryctl.model import EntityRef, Memory
from memoryctl.ops.migrate import MigrationInterrupted, Migrator
from memoryctl.ops.models import parse_model_spec
from memoryctl.ops.pgstate import OpsState
from memoryctl.ops.reconcile import Reconciler, reconcile
from memoryctl.ops.reembed import reembed_changed
from memoryctl.stack import Stack
from memoryctl.stores.protocols import GraphMemory, VectorFilter
from tests.conftest import cluster_settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


NEO4J_PORT = int(os.environ.get("MEMORYCTL_TEST_OPS_NEO4J_PORT", "57787"))
NEO4J_STATE = ROOT / ".services" / "neo4j-ops"


def neo4j_server(action: str) -> None:
    env = {**os.environ, "NEO4J_PORT": str(NEO4J_PORT), "NEO4J_STATE": str(NEO4J_STATE)}
    subprocess.run([str(ROOT / "scripts" / "neo4j-server"), action], env=env, check=True, capture_output=True,
                   timeout=300)


@pytest.fixture(scope="module")
def private_neo4j() -> Iterator[dict[str, str]]:
    """A Neo4j server of this module's own, so stopping it never disturbs other suites.

    Left running if it was running before (re-runs are fast); stopped otherwise.
    """
    env = {**os.environ, "NEO4J_PORT": str(NEO4J_PORT), "NEO4J_STATE": str(NEO4J_STATE)}
    was_up = subprocess.run([str(ROOT / "scripts" / "neo4j-server"), "status"], env=env, capture_output=True).returncode == 0
    neo4j_server("start")
    password = (NEO4J_STATE / "password").read_text().strip()
    yield {"uri": f"bolt://127.0.0.1:{NEO4J_PORT}", "password": password}
    if not was_up:
        neo4j_server("stop")


def wipe_neo4j(env: dict[str, str]) -> None:
    from neo4j import GraphDatabase

    with GraphDatabase.driver(env["uri"], auth=("neo4j", env["password"]), connection_timeout=5) as driver:
        with driver.session() as session:  # CALL ... IN TRANSACTIONS needs an auto-commit transaction
            session.run("MATCH (n) CALL (n) { DETACH DELETE n } IN TRANSACTIONS OF 5000 ROWS").consume()


@pytest.fixture
def neo4j_ops(private_neo4j: dict[str, str]) -> dict[str, str]:
    neo4j_server("start")  # idempotent; a fault test may have left it stopped on failure
    wipe_neo4j(private_neo4j)
    return private_neo4j


@pytest.fixture
def cluster(pg_dsn: str, neo4j_ops: dict[str, str], tmp_path: Path) -> Iterator[MemoryClient]:
    """Like conftest's ``cluster``, on the private Neo4j."""
    client = MemoryClient(cluster_settings(pg_dsn, neo4j_ops, tmp_path / "qdrant"))
    client.init()
    yield client
    client.close()


def memories(n: int, *, agent: str = "a1", seed: int = 0) -> list[Memory]:
    return [
        Memory(
            text=f"memory {seed}-{i} about project p{i % 7} and topic t{i % 13}",
            agent_id=agent,
            id=uuid.UUID(int=(seed << 64) + i + 1),
            kind="note",
            entities=[EntityRef("Project", f"p{i % 7}")],
            metadata={"i": i},
        )
        for i in range(n)
    ]


def store_counts(client: MemoryClient) -> dict[str, int]:
    return {
        "postgres": client.stack.records.count(include_deleted=True),
        "qdrant": client.stack.require_vectors().count(),
        "neo4j": client.stack.require_graph().count(),
    }


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------ reconcile


def test_reconcile_finds_and_repairs_orphans_missing_stale(cluster: MemoryClient) -> None:
    stack = cluster.stack
    mems = memories(300)
    out = cluster.add(mems, extract=False)
    assert not out.degraded
    clean = reconcile(stack)
    assert clean.drift == 0, clean.as_dict()
    assert clean.postgres_scanned == 300 and clean.stores["vector"].scanned == 300

    vectors, graph = stack.require_vectors(), stack.require_graph()
    # Plant drift behind the outbox's back.
    orphan_v, orphan_g = uuid.uuid4(), uuid.uuid4()
    ghost = Memory(text="never in postgres", agent_id="a1", id=orphan_v)
    vectors.upsert([vector_point(ghost, stack.embedder.embed_documents([ghost.text])[0].tolist())])
    now = datetime.now(UTC)
    graph.upsert_memories([GraphMemory(orphan_g, "a1", now, False, [], [], [])])
    missing = mems[10]
    vectors.delete([missing.id])
    graph.delete([missing.id])
    stale = mems[20]
    wrong = Memory(text="some other text entirely", agent_id="a1", id=stale.id, created_at=stale.created_at)
    vectors.upsert([vector_point(wrong, stack.embedder.embed_documents([wrong.text])[0].tolist())])
    graph.set_deleted([mems[30].id], True)

    dry = reconcile(stack)
    v, g = dry.stores["vector"], dry.stores["graph"]
    assert (v.orphan, v.missing, v.stale) == (1, 1, 1), dry.as_dict()
    assert (g.orphan, g.missing, g.stale) == (1, 1, 1), dry.as_dict()
    assert v.samples["orphan"] == [str(orphan_v)] and g.samples["orphan"] == [str(orphan_g)]
    assert dry.drift == 6
    assert vectors.count() == 300  # a dry run changes nothing (+1 orphan, -1 missing)

    fixed = reconcile(stack, repair=True)
    assert fixed.stores["vector"].repaired == 3 and fixed.stores["graph"].repaired == 3, fixed.as_dict()
    assert fixed.unrepaired == 0
    again = reconcile(stack, repair=True)  # idempotent: nothing left to do
    assert again.drift == 0, again.as_dict()
    assert store_counts(cluster) == {"postgres": 300, "qdrant": 300, "neo4j": 300}
    hits = cluster.query(text=stale.text, agent_id="a1", limit=1).hits
    assert hits and hits[0].id == stale.id
    runs = stack.runs.recent(command="reconcile")
    assert [r["status"] for r in runs[:3]] == ["ok", "ok", "ok"]
    assert runs[1]["counts"]["qdrant_orphan"] == 1


def test_pending_outbox_is_not_drift_and_agent_scope(cluster: MemoryClient) -> None:
    stack = cluster.stack
    cluster.add(memories(50, agent="a1"), extract=False)
    cluster.add(memories(40, agent="a2", seed=1), extract=False, deliver=False)
    report = reconcile(stack)
    assert report.drift == 0
    assert report.stores["vector"].pending == 40 and report.stores["graph"].pending == 40
    scoped = reconcile(stack, agent_id="a1")
    assert scoped.postgres_scanned == 50 and scoped.drift == 0


def test_purge_after_grace(pg_dsn: str, neo4j_ops: dict[str, str], tmp_path: Path) -> None:
    with MemoryClient(cluster_settings(pg_dsn, neo4j_ops, tmp_path / "q", delete_grace="1s")) as client:
        client.init()
        mems = memories(30)
        client.add(mems, extract=False)
        client.forget([m.id for m in mems[:5]])
        early = reconcile(client.stack)
        assert early.purge_due == 0 and early.drift == 0
        time.sleep(1.5)
        due = reconcile(client.stack)
        assert due.purge_due == 5
        done = reconcile(client.stack, repair=True)
        assert done.purged == 5
        assert store_counts(client) == {"postgres": 25, "qdrant": 25, "neo4j": 25}
        assert reconcile(client.stack).drift == 0


def test_model_mismatch_is_reported_not_repaired(cluster: MemoryClient) -> None:
    """Same dimension, another model id: every vector is stale, and reconcile must not 'fix' it."""
    stack = cluster.stack
    cluster.add(memories(20), extract=False)
    other = make_embedder(parse_model_spec("kind=hash,model=hash/other-v2"))
    vectors = stack.require_vectors()
    vectors.delete([memories(20)[0].id])  # one missing point: repair must not embed it with `other`
    report = Reconciler(
        stack.records, vectors, stack.require_graph(), other, delete_grace=timedelta(days=7)
    ).run(repair=True)
    assert report.model["match"] is False and report.model["collection"] == stack.embedder.info.model_id
    assert report.stores["vector"].missing == 1 and report.stores["vector"].repaired == 0
    assert report.unrepaired >= 1
    assert vectors.count() == 19


# ------------------------------------------------------------------------------------- reembed


def test_reembed_changed_in_place(cluster: MemoryClient) -> None:
    stack = cluster.stack
    mems = memories(100)
    cluster.add(mems, extract=False)
    vectors = stack.require_vectors()
    target = mems[5]
    old = Memory(text="what it said before the edit", agent_id="a1", id=target.id, created_at=target.created_at)
    vectors.upsert([vector_point(old, stack.embedder.embed_documents([old.text])[0].tolist())])
    report = reembed_changed(stack.records, vectors, stack.embedder)
    assert (report.scanned, report.changed) == (100, 1)
    assert reembed_changed(stack.records, vectors, stack.embedder).changed == 0
    other = make_embedder(parse_model_spec("kind=hash,dim=64"))
    with pytest.raises(StoreError, match="mix models"):
        reembed_changed(stack.records, vectors, other)
