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

import psycopg
import pytest

from memoryctl.client import MemoryClient
from memoryctl.embed import make_embedder
from memoryctl.errors import StoreError
from memoryctl.health.probes import check
from memoryctl.maintenance.model_migration import MigrationInterrupted, Migrator, run_model_migration
from memoryctl.maintenance.models import parse_model_spec
from memoryctl.maintenance.pgstate import OpsState
from memoryctl.maintenance.reconcile import Reconciler, reconcile
from memoryctl.maintenance.reembed import reembed_changed
from memoryctl.model import EntityRef, Memory
from memoryctl.stack import Stack
from memoryctl.stores.protocols import GraphMemory
from memoryctl.write.outbox import Deliverer, vector_point
from memoryctl.write.pipeline import IMPORT_BATCH
from tests.conftest import cluster_settings, write_cluster_config

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


# Its own port, next to the shared test server's: engineers (and CI jobs) running the suite side by
# side with their own servers (MEMORYCTL_TEST_NEO4J_PORT) must not share this one either.
NEO4J_PORT = int(
    os.environ.get("MEMORYCTL_TEST_OPS_NEO4J_PORT") or int(os.environ.get("MEMORYCTL_TEST_NEO4J_PORT", "57687")) + 100
)
NEO4J_STATE = ROOT / ".services" / "neo4j-ops"


def neo4j_server(action: str) -> None:
    env = {**os.environ, "NEO4J_PORT": str(NEO4J_PORT), "NEO4J_STATE": str(NEO4J_STATE)}
    subprocess.run(
        [str(ROOT / "scripts" / "neo4j-server"), action], env=env, check=True, capture_output=True, timeout=300
    )


@pytest.fixture(scope="module")
def private_neo4j() -> Iterator[dict[str, str]]:
    """A Neo4j server of this module's own, so stopping it never disturbs other suites.

    Left running if it was running before (re-runs are fast); stopped otherwise.
    """
    env = {**os.environ, "NEO4J_PORT": str(NEO4J_PORT), "NEO4J_STATE": str(NEO4J_STATE)}
    was_up = (
        subprocess.run([str(ROOT / "scripts" / "neo4j-server"), "status"], env=env, capture_output=True).returncode == 0
    )
    neo4j_server("start")
    password = (NEO4J_STATE / "password").read_text().strip()
    yield {"uri": f"bolt://127.0.0.1:{NEO4J_PORT}", "password": password}
    if not was_up:
        neo4j_server("stop")


def wipe_neo4j(env: dict[str, str]) -> None:
    from neo4j import GraphDatabase
    from neo4j.exceptions import TransientError

    with GraphDatabase.driver(env["uri"], auth=("neo4j", env["password"]), connection_timeout=5) as driver:
        for attempt in range(5):
            try:
                with driver.session() as session:  # CALL ... IN TRANSACTIONS needs an auto-commit transaction
                    session.run("MATCH (n) CALL (n) { DETACH DELETE n } IN TRANSACTIONS OF 5000 ROWS").consume()
                return
            except TransientError:  # a deadlock with a late writer of the previous test: try again
                if attempt == 4:
                    raise
                time.sleep(0.5)


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
    with MemoryClient(cluster_settings(pg_dsn, neo4j_ops, tmp_path / "q", delete_grace="1h")) as client:
        client.init()
        mems = memories(30)
        client.add(mems, extract=False)
        gone = [m.id for m in mems[:5]]
        client.forget(gone)
        early = reconcile(client.stack)
        assert early.purge_due == 0 and early.drift == 0, early.as_dict()
        # Age the soft deletes past the grace period (deterministic, unlike sleeping on a busy machine).
        with client.stack.pool.connection() as conn, conn.transaction():
            conn.execute("UPDATE memories SET deleted_at = now() - interval '2 hours' WHERE id = ANY(%s)", (gone,))
        due = reconcile(client.stack)
        assert due.purge_due == 5 and due.purge_samples
        assert store_counts(client) == {"postgres": 30, "qdrant": 30, "neo4j": 30}  # dry run
        done = reconcile(client.stack, repair=True)
        assert done.purged == 5 and done.unrepaired == 0
        assert store_counts(client) == {"postgres": 25, "qdrant": 25, "neo4j": 25}
        assert reconcile(client.stack).drift == 0


def test_model_mismatch_is_reported_not_repaired(cluster: MemoryClient) -> None:
    """Same dimension, another model id: every vector is stale, and reconcile must not 'fix' it."""
    stack = cluster.stack
    cluster.add(memories(20), extract=False)
    other = make_embedder(parse_model_spec("kind=hash,model=hash/other-v2"))
    vectors = stack.require_vectors()
    vectors.delete([memories(20)[0].id])  # one missing point: repair must not embed it with `other`
    report = Reconciler(stack.records, vectors, stack.require_graph(), other, delete_grace=timedelta(days=7)).run(
        repair=True
    )
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


# ------------------------------------------------------------------------------------- migrate


def test_migrate_interrupted_resumes_swaps_and_rolls_back(cluster: MemoryClient) -> None:
    stack = cluster.stack
    old_model = stack.embedder.info.model_id
    mems = memories(400)
    cluster.add(mems, extract=False)
    # Same dimension (384), another model id: the mix-up the engine must refuse.
    target = parse_model_spec("kind=hash,model=hash/bow-v2-test")
    with pytest.raises(MigrationInterrupted):
        Migrator(stack, batch=50, stop_after_batches=3, sample=20).migrate(target)
    row = OpsState(stack.pool).open_migration("hash/bow-v2-test")
    assert row is not None and row["copied"] == 150 and row["status"] == "copying"
    vectors = stack.require_vectors()
    assert vectors.active_model().model_id == old_model  # type: ignore[union-attr]
    assert cluster.query(text=mems[3].text, agent_id="a1", limit=1).hits[0].id == mems[3].id  # queries still work

    # Writes while the migration is paused half-way: an insert, an edit, a soft delete.
    late = memories(5, seed=9)
    cluster.add(late, extract=False)
    edited = Memory(text="an edited text about zebras", agent_id="a1", id=mems[399].id, created_at=mems[399].created_at)
    cluster.add([edited], extract=False)
    cluster.forget([mems[398].id])

    report = Migrator(stack, batch=50, sample=20).migrate(target)
    assert report.status == "swapped" and report.resumed_from == 150, report.as_dict()
    assert report.verify["counts_equal"] and report.verify["new_points"] == 404
    assert report.verify["recall_new"] >= 0.9 and "recall_old" in report.verify
    assert vectors.active_model().model_id == "hash/bow-v2-test"  # type: ignore[union-attr]
    assert "[embedder]" in (report.config_hint or "")

    # A process still holding the old embedder cannot write into the new collection (same dim) ...
    old_embedder = make_embedder(cluster.settings.embedder)
    assert old_embedder.info.model_id == old_model
    stack.records.enqueue([late[0].id])
    refused = Deliverer(stack.records, vectors, None, old_embedder).deliver(memory_ids=[late[0].id], targets=["vector"])
    assert "vector" in refused.failed and stack.records.pending_count([late[0].id]).get("vector") == 1
    # ... while a process started now follows the recorded active model and queries it.
    with MemoryClient(cluster.settings, stack=None) as fresh:
        fresh.stack._vectors = vectors
        fresh.stack._tried.add("vector")
        assert fresh.stack.embedder.info.model_id == "hash/bow-v2-test"
        hits = fresh.query(text="edited zebras", agent_id="a1", limit=1).hits
        assert hits and hits[0].id == edited.id
        fresh.stack._vectors = None
    stack.records.enqueue([late[0].id])
    models = {r["model_id"]: r["status"] for r in OpsState(stack.pool).embedding_models()}
    assert models == {old_model: "retired", "hash/bow-v2-test": "active"}

    # Rollback: writes made after the swap reach the old collection too.
    after = memories(3, seed=11)
    Deliverer(stack.records, vectors, None, make_embedder(target)).deliver(targets=["vector"])
    stack.records.upsert(after)
    Deliverer(stack.records, vectors, None, make_embedder(target)).deliver(targets=["vector"])
    back = Migrator(stack, batch=50).rollback()
    assert back.status == "rolled-back" and back.target_model == old_model
    assert vectors.active_model().model_id == old_model  # type: ignore[union-attr]
    assert (
        vectors.count(model_id=old_model)
        - sum(1 for page in vectors.scroll(model_id=old_model) for r in page if r.deleted)
        == stack.records.count()
    )
    assert [r["status"] for r in stack.runs.recent(command="migrate")] == []  # Migrator itself records nothing
    cleanup = run_model_migration(stack, "cleanup", grace=timedelta(0))  # the CLI's entry point records its run
    assert cleanup.dropped == ["hash/bow-v2-test"]
    [run] = stack.runs.recent(command="migrate")
    assert (run["status"], run["counts"]["dropped"]) == ("ok", 1)


def test_a_long_lived_client_follows_a_model_swap_made_by_another(cluster: MemoryClient) -> None:
    """memoryctl serve keeps one client for days while `migrate` runs in another process: after the
    swap its text queries embed with the model now active instead of degrading."""
    mems = memories(60)
    cluster.add(mems, extract=False)
    before = cluster.stack.embedder.info.model_id
    vectors = cluster.stack.require_vectors()
    with MemoryClient(cluster.settings) as other:  # the other process (sharing the local-mode store)
        other.stack._vectors = vectors
        other.stack._tried.add("vector")
        report = Migrator(other.stack, batch=50, sample=10).migrate(parse_model_spec("kind=hash,model=hash/elsewhere"))
        other.stack._vectors = None
    assert report.status == "swapped" and before != "hash/elsewhere"
    result = cluster.query(text=mems[7].text, agent_id="a1", limit=1)
    assert result.degraded == [] and result.hits[0].id == mems[7].id, result.explain
    assert cluster.stack.embedder.info.model_id == "hash/elsewhere"


def test_migrate_catches_a_historical_insert_made_during_verification(cluster: MemoryClient) -> None:
    """A memory dated last year, written after the catch-up's watermark: ``updated_at`` is the
    store's write time, so the post-swap catch-up (timestamps only, no second merge-join) finds it."""
    stack = cluster.stack
    cluster.add(memories(60), extract=False)
    old = Memory(
        text="a memory from last year about walruses",
        agent_id="a1",
        created_at=datetime.now(UTC) - timedelta(days=365),
        updated_at=datetime.now(UTC) - timedelta(days=365),
    )
    written: list[str] = []

    def progress(phase: str, advance: int, total: int | None) -> None:
        if phase == "verify" and not written:
            written.append(phase)
            out = cluster.add([old], extract=False)  # delivered to the old (still active) collection
            assert out.pending["qdrant"] == 0

    target = parse_model_spec("kind=hash,model=hash/bow-v3-test")
    report = Migrator(stack, batch=25, sample=10, progress=progress).migrate(target)
    assert written and report.status == "swapped", report.as_dict()
    assert set(report.phases) == {"copy", "catch-up", "verify", "post-swap catch-up"}
    vectors = stack.require_vectors()
    assert vectors.count(model_id="hash/bow-v3-test") == stack.records.count() == 61
    row = stack.records.get(old.id)
    assert row is not None and row.created_at < datetime.now(UTC) - timedelta(days=300)
    assert row.updated_at is not None and row.updated_at > datetime.now(UTC) - timedelta(hours=1)
    with MemoryClient(cluster.settings, stack=None) as fresh:
        fresh.stack._vectors = vectors
        fresh.stack._tried.add("vector")
        hits = fresh.query(text="walruses last year", agent_id="a1", limit=1, decay=False).hits
        assert hits and hits[0].id == old.id
        fresh.stack._vectors = None


def test_migrate_cli_killed_with_sigkill_resumes(pg_dsn: str, neo4j_ops: dict[str, str], tmp_path: Path) -> None:
    """The real thing: `memoryctl migrate` SIGKILLed mid-copy, then run again to completion."""
    cfg = write_cluster_config(tmp_path / "memoryctl.toml", pg_dsn, neo4j_ops, tmp_path / "q")
    env = {**os.environ, "MEMORYCTL_CONFIG": str(cfg), "MEMORYCTL_TRIGGER": "test"}
    with MemoryClient(cluster_settings(pg_dsn, neo4j_ops, tmp_path / "q")) as client:
        client.init()
        client.add(memories(3000), extract=False)
    cmd = ["memoryctl", "migrate", "--to-model", "kind=hash,dim=128", "--batch", "20", "--json"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Wait for the copy to pass 200 (an event, bounded so a stuck child fails the test), then hold
    # its checkpoint row: the child blocks at its next checkpoint, and is killed there. The copy
    # is thus stopped at a known point, whatever the machine's speed.
    with psycopg.connect(pg_dsn, autocommit=False) as conn:
        deadline = time.monotonic() + 300
        row = None
        while proc.poll() is None and time.monotonic() < deadline:
            row = conn.execute(
                "SELECT id, copied FROM embedding_migrations WHERE status = 'copying' AND copied >= 200"
            ).fetchone()
            conn.rollback()
            if row:
                break
        assert row is not None, "the child ended or stalled before copying 200 memories"
        locked = conn.execute("SELECT copied FROM embedding_migrations WHERE id = %s FOR UPDATE", (row[0],))
        copied = int(locked.fetchone()[0])  # type: ignore[index]
        proc.kill()
        proc.wait()
        conn.rollback()
    assert 200 <= copied < 3000, "the migration must be killed mid-copy"
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr

    result = json.loads(done.stdout)
    assert result["status"] == "swapped" and result["resumed_from"] == copied
    assert result["verify"]["counts_equal"] and result["verify"]["new_points"] == 3000
    runs = subprocess.run(
        ["memoryctl", "runs", "--json", "--command", "migrate"], env=env, capture_output=True, text=True, timeout=60
    )
    statuses = [r["status"] for r in json.loads(runs.stdout)]
    assert statuses[0] == "ok" and statuses[1] == "running"  # the SIGKILLed run could not record its end


# -------------------------------------------------------------------------------------- health


# Only for a probe that hangs (then reported "timeout", which these tests tell apart): never a measure.
HEALTH_HANG_GUARD_S = 30.0


def _health_settings(pg_dsn: str, neo4j: dict[str, str], tmp_path: Path, **extra: object) -> MemoryClient:
    client = MemoryClient(cluster_settings(pg_dsn, neo4j, tmp_path / "q", **extra))
    return client


@pytest.mark.parametrize("down", ["none", "qdrant", "qdrant-hangs", "neo4j", "postgres"])
def test_health_with_each_store_down(down: str, pg_dsn: str, neo4j_ops: dict[str, str], tmp_path: Path) -> None:
    with MemoryClient(cluster_settings(pg_dsn, neo4j_ops, tmp_path / "q")) as client:
        client.init()
    port = closed_port()
    extra: dict[str, object] = {}
    neo4j = dict(neo4j_ops)
    hang = socket.socket()  # accepts connections (backlog) and never answers: a hung server
    hang.bind(("127.0.0.1", 0))
    hang.listen(16)
    if down == "qdrant":
        extra["qdrant"] = {"url": f"http://127.0.0.1:{port}", "timeout_s": 1.0}
    elif down == "qdrant-hangs":
        extra["qdrant"] = {"url": f"http://127.0.0.1:{hang.getsockname()[1]}", "timeout_s": 5.0}
    elif down == "neo4j":
        neo4j["uri"] = f"bolt://127.0.0.1:{port}"
    elif down == "postgres":
        pg_dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    with MemoryClient(cluster_settings(pg_dsn, neo4j, tmp_path / "q", **extra)) as client:
        # What each store's state is reported as, not how fast: opening pools and drivers cold on a
        # busy 2-core box can alone outlast health's 1.8 s deadline (that deadline cutting off a
        # probe that never answers is test_a_hung_probe_is_reported_as_timeout_and_the_rest_answer).
        report = check(client.stack, deadline_s=HEALTH_HANG_GUARD_S)
    hang.close()
    expected = {
        "none": ("healthy", 0),
        "qdrant": ("degraded", 3),
        "qdrant-hangs": ("degraded", 3),
        "neo4j": ("degraded", 3),
        "postgres": ("unhealthy", 1),
    }[down]
    assert (report.status, report.exit_code) == expected, report.as_dict()
    if down != "none":
        assert report.components[down.split("-")[0]]["status"] in ("down", "timeout")


@pytest.mark.slow
def test_neo4j_stopped_mid_import_then_sync_and_reconcile(cluster: MemoryClient, neo4j_ops: dict[str, str]) -> None:
    """Neo4j really stopped while 2,000 memories are imported; nothing is lost, 0 drift after."""
    n = int(os.environ.get("MEMORYCTL_OPS_FAULT_N", "2000"))
    src = Path(cluster.settings.data_dir) / "import.jsonl"

    with src.open("w") as f:
        for m in memories(n, seed=5):
            f.write(
                json.dumps(
                    {
                        "id": str(m.id),
                        "agent_id": m.agent_id,
                        "text": m.text,
                        "entities": [{"type": "Project", "name": m.entities[0].name}],
                    }
                )
                + "\n"
            )
    stopped: list[int] = []

    def stop_after_first_batch(done: int) -> None:
        # The fault at a fixed point: once the first batch (IMPORT_BATCH memories) is delivered.
        if not stopped:
            stopped.append(done)
            neo4j_server("stop")

    outcome = cluster.import_jsonl(src, progress=stop_after_first_batch)
    assert stopped == [IMPORT_BATCH] and outcome.inserted == n
    assert outcome.pending == {"qdrant": 0, "neo4j": n - IMPORT_BATCH}, outcome.as_dict()
    # Health sees it while it is really down.
    report = check(cluster.stack)
    assert report.exit_code == 3
    assert report.components["neo4j"]["status"] in ("down", "timeout")
    neo4j_server("start")
    # A freshly started Neo4j on a loaded machine can time out its first batches (cold page cache):
    # sync reports that and leaves them in the outbox; running it again (as cron does) finishes.
    failures = []
    for _ in range(6):
        report_sync, pending = cluster.sync()
        if not any(pending.values()):
            break
        failures.append(report_sync.failed)
    assert pending == {"qdrant": 0, "neo4j": 0}, failures
    drift = reconcile(cluster.stack)
    assert drift.drift == 0, drift.as_dict()
    assert store_counts(cluster) == {"postgres": n, "qdrant": n, "neo4j": n}


def test_a_hung_probe_is_reported_as_timeout_and_the_rest_answer() -> None:
    """The deadline is code, not a figure: a probe that never answers is cut off and named."""
    from memoryctl.health.probes import run_probes

    release = threading.Event()

    def hung() -> dict[str, str]:
        release.wait()
        return {}

    try:
        report = run_probes({"hung": hung, "fine": dict, "broken": lambda: 1 / 0}, deadline_s=0.5)  # type: ignore[dict-item]
    finally:
        release.set()
    assert report.components["hung"]["status"] == "timeout"
    assert report.components["fine"]["status"] == "ok"
    assert report.components["broken"] == {
        "status": "down",
        "error": "ZeroDivisionError: division by zero",
        "latency_ms": report.components["broken"]["latency_ms"],
    }


def test_wireguard_public_fields_parsing() -> None:
    """What health reads as the memoryctl user: public fields only, as wg-tools prints them."""
    from memoryctl.health.probes import wireguard_peers
    from memoryctl.wgstatus import parse_public

    a, b = "peerAAAAAAAAAAAAAAAA=", "peerBBBBBBBBBBBBBBBB="
    outputs = {
        "interfaces": "wg0\n",
        "latest-handshakes": f"wg0\t{a}\t1000\nwg0\t{b}\t0\n",
        "endpoints": f"wg0\t{a}\t10.0.0.2:51820\n{b}\t(none)\n",  # the interface on the first line only
        "allowed-ips": f"wg0\t{a}\t10.77.0.2/32\nwg0\t{b}\t10.77.0.3/32\n",
        "transfer": f"wg0\t{a}\t10\t20\nwg0\t{b}\t0\t0\n",
    }
    interfaces, peers = wireguard_peers(parse_public(outputs), now=1100.0)
    assert interfaces == ["wg0"]
    assert [p["handshake_age_s"] for p in peers] == [100.0, None]
    assert [p["endpoint"] for p in peers] == ["10.0.0.2:51820", None]
    assert [p["allowed_ips"] for p in peers] == ["10.77.0.2/32", "10.77.0.3/32"]
    assert [p["up"] for p in peers] == [True, False]


def test_cli_reconcile_reembed_health_exit_codes(pg_dsn: str, neo4j_ops: dict[str, str], tmp_path: Path) -> None:
    import json

    cfg = write_cluster_config(tmp_path / "memoryctl.toml", pg_dsn, neo4j_ops, tmp_path / "q")
    env = {**os.environ, "MEMORYCTL_CONFIG": str(cfg), "MEMORYCTL_TRIGGER": "cron"}

    def mctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["memoryctl", *args], env=env, capture_output=True, text=True, timeout=120)

    with MemoryClient(cluster_settings(pg_dsn, neo4j_ops, tmp_path / "q")) as client:
        client.init()
        client.add(memories(50), extract=False)
        client.stack.require_graph().delete([memories(50)[7].id])  # drift behind the outbox's back
    dry = mctl("reconcile", "--json")
    assert dry.returncode == 3, dry.stderr
    assert json.loads(dry.stdout)["stores"]["graph"]["missing"] == 1
    fixed = mctl("reconcile", "--repair")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "reconcile --repair" in fixed.stdout
    clean = mctl("reconcile", "--json", "--agent", "a1")
    assert clean.returncode == 0 and json.loads(clean.stdout)["drift"] == 0
    re = mctl("reembed", "--changed", "--json")
    assert re.returncode == 0 and json.loads(re.stdout)["changed"] == 0, re.stderr
    assert mctl("reembed").returncode == 2  # --changed is required
    assert mctl("migrate").returncode == 2  # exactly one action
    assert mctl("migrate", "--to-model", "kind=nope").returncode == 2
    health = mctl("health", "--json", "--deadline", "15")  # contents here; the 2 s bound is tested above
    report = json.loads(health.stdout)
    assert health.returncode == 0, report
    assert report["components"]["wireguard"]["status"] in ("disabled", "ok", "degraded")
    assert report["components"]["vllm"]["status"] == "disabled"
    assert report["components"]["qdrant"]["postgres_memories"] == 50
    runs = json.loads(mctl("runs", "--json", "--command", "reconcile").stdout)
    assert [r["trigger"] for r in runs] == ["cron"] * 3 and runs[-1]["status"] == "ok"


def test_vllm_probe_against_standin(tmp_path: Path) -> None:
    """The vLLM probe against the stand-in server (tests/lora/vllm_standin.py: vLLM's shapes)."""
    from memoryctl.config import load_settings
    from memoryctl.health.probes import vllm_probe
    from tests.lora.vllm_standin import StandinState, VLLMStandin

    base = "Qwen/Qwen2.5-7B-Instruct"
    state = StandinState(api_key="k", loras={"support-v3": str(tmp_path)})

    def stack(**vllm: str) -> Stack:
        return Stack(load_settings(Path(os.devnull), data_dir=tmp_path, vllm=vllm))

    with VLLMStandin(state) as srv:
        ok = vllm_probe(stack(url=srv.url, api_key="k"))
        wrong = vllm_probe(stack(url=srv.url, api_key="k", model="x"))
        url = srv.url
    assert ok.get("status", "ok") == "ok", ok
    assert ok["models"] == [base] and ok["lora_adapters"] == [{"id": "support-v3", "base": base}]
    assert wrong["status"] == "degraded"
    gone = vllm_probe(stack(url=url))
    assert gone["status"] == "down"
    assert vllm_probe(stack())["status"] == "disabled"
