"""The write path against real PostgreSQL, real Neo4j and Qdrant (local mode or QDRANT_URL)."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from pathlib import Path

import psycopg
import pytest

from memoryctl import operations
from memoryctl.client import MemoryClient
from memoryctl.errors import ConflictError, ExitCode, InputError
from memoryctl.model import EntityRef, Memory, MemoryRef, Relation
from memoryctl.serve.server import Service
from tests.conftest import cluster_settings
from tests.relay import BreakingRelay, close_both

pytestmark = pytest.mark.integration

HOSTILE = [
    "Robert'); DROP TABLE memories;--",
    "a`b`c",
    "}) MATCH (n) DETACH DELETE n //",
    '{"$ne": null}',
    "x\\' OR 1=1 --",
    "name with ; semicolon and $param",
]


def write_jsonl(path: Path, n: int, *, agent: str = "a1", seed: int = 0) -> list[str]:
    ids = []
    with path.open("w") as f:
        for i in range(n):
            mid = str(uuid.UUID(int=seed * 1_000_000 + i + 1))
            ids.append(mid)
            f.write(
                json.dumps(
                    {
                        "id": mid,
                        "agent_id": agent,
                        "text": f"memory number {i} about project {i % 7}",
                        "kind": "note" if i % 2 else "dialogue",
                        "created_at": f"2026-11-{1 + i % 28:02d}T10:00:00Z",
                        "entities": [
                            {"type": "User", "name": f"user{i % 5}"},
                            {"type": "Project", "name": f"p{i % 7}"},
                        ],
                        "relations": [
                            {"from": {"type": "User", "name": f"user{i % 5}"}, "type": "AUTHORED", "to": "this"}
                        ],
                        "metadata": {"i": i},
                    }
                )
                + "\n"
            )
    return ids


def counts(client: MemoryClient) -> dict[str, int]:
    return {
        "postgres": client.stack.records.count(include_deleted=True),
        "qdrant": client.stack.require_vectors().count(),
        "neo4j": client.stack.require_graph().count(),
    }


def test_import_twice_is_idempotent(cluster: MemoryClient, tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    write_jsonl(path, 300)
    first = cluster.import_jsonl(path)
    assert (first.inserted, first.updated, first.unchanged, len(first.invalid)) == (300, 0, 0, 0)
    assert first.pending == {"qdrant": 0, "neo4j": 0}, first.delivery.failed
    assert counts(cluster) == {"postgres": 300, "qdrant": 300, "neo4j": 300}
    second = cluster.import_jsonl(path)
    assert (second.inserted, second.updated, second.unchanged) == (0, 0, 300)
    assert counts(cluster) == {"postgres": 300, "qdrant": 300, "neo4j": 300}


def test_changed_text_is_updated_not_duplicated(cluster: MemoryClient) -> None:
    mid = uuid.uuid4()
    cluster.add([Memory(id=mid, text="first version", agent_id="a1")])
    out = cluster.add([Memory(id=mid, text="second version", agent_id="a1")])
    assert (out.inserted, out.updated) == (0, 1)
    assert cluster.get(mid).text == "second version"
    assert counts(cluster) == {"postgres": 1, "qdrant": 1, "neo4j": 1}


def test_a_metadata_value_changed_between_false_and_0_is_an_update(cluster: MemoryClient) -> None:
    """Python says ``False == 0`` and ``1 == True``; JSON does not: each change is stored (the
    hostile-client harness found ``false`` -> ``0`` reported unchanged and dropped)."""
    mid = uuid.uuid4()
    cluster.add([Memory(id=mid, text="flags", agent_id="a1", metadata={"x": [False, {"y": True}]})])
    for metadata in ({"x": [0, {"y": True}]}, {"x": [0, {"y": 1}]}, {"x": [0.0, {"y": 1}]}):
        out = cluster.add([Memory(id=mid, text="flags", agent_id="a1", metadata=metadata)])
        stored = cluster.get(mid).metadata
        if metadata["x"][0] == 0.0 and isinstance(metadata["x"][0], float):
            assert (out.updated, out.unchanged) == (0, 1), stored  # 0 and 0.0: one JSON number
        else:
            assert (out.updated, out.unchanged) == (1, 0), (metadata, stored)
        assert json.dumps(stored) == json.dumps({"x": [0, {"y": metadata["x"][1]["y"]}]}), stored


def test_bad_lines_reported_and_skipped_or_refused(cluster: MemoryClient, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"text": "fine"}\n'
        "not json\n"
        '{"text": "bad rel", "relations": [{"from": "this", "type": "DROP ALL]->()", "to": "this"}]}\n'
        '{"text": ""}\n'
        '{"text": "bad entity type", "entities": [{"type": "User`) DETACH DELETE n", "name": "x"}]}\n'
        '{"text": "fine too", "agent_id": "a2"}\n'
    )
    strict = cluster.import_jsonl(path, strict=True)
    assert [b.line for b in strict.invalid] == [2, 3, 4, 5]
    assert cluster.stack.records.count() == 0  # strict: nothing written
    lenient = cluster.import_jsonl(path)
    assert [b.line for b in lenient.invalid] == [2, 3, 4, 5]
    assert "DROP ALL" in lenient.invalid[1].error
    assert lenient.inserted == 2


def test_hostile_names_are_data(cluster: MemoryClient) -> None:
    mid = uuid.uuid4()
    ents = [EntityRef("User", name) for name in HOSTILE]
    m = Memory(
        id=mid,
        text=" ".join(HOSTILE),
        agent_id="a1",
        metadata={"k": HOSTILE[0], "q": "'\"`"},
        entities=ents,
        relations=[Relation(ents[0], "AUTHORED", MemoryRef(mid))],
    )
    out = cluster.add([m])
    assert out.pending == {"qdrant": 0, "neo4j": 0}
    back = cluster.get(mid)
    assert back.text == m.text and back.metadata == m.metadata
    assert sorted(e.name for e in back.entities) == sorted(HOSTILE)
    graph = cluster.stack.require_graph()
    rels = graph.relationships([mid])[mid]
    assert any(r["type"] == "AUTHORED" for r in rels)
    assert counts(cluster) == {"postgres": 1, "qdrant": 1, "neo4j": 1}
    with pytest.raises(InputError):
        EntityRef("User) DETACH DELETE (n", "x")
    with pytest.raises(InputError):
        Relation(ents[0], "AUTHORED]->() DELETE n//", MemoryRef(mid))


def test_neo4j_unreachable_import_lands_then_sync_delivers(
    pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path
) -> None:
    """Neo4j down (nothing listens on its port) during an import: PostgreSQL and Qdrant get
    everything, the graph deliveries wait in the outbox, and sync delivers them once it is back."""
    down = MemoryClient(cluster_settings(pg_dsn, {**neo4j_clean, "uri": "bolt://127.0.0.1:9"}, tmp_path / "q"))
    path = tmp_path / "m.jsonl"
    write_jsonl(path, 200)
    out = down.import_jsonl(path)
    assert out.inserted == 200
    assert out.pending == {"qdrant": 0, "neo4j": 200}
    assert "graph" in out.delivery.failed
    down.close()
    up = MemoryClient(cluster_settings(pg_dsn, neo4j_clean, tmp_path / "q"))
    with psycopg.connect(pg_dsn) as other, other.transaction():  # a delivery in progress elsewhere
        other.execute("SELECT id FROM outbox FOR UPDATE").fetchall()
        held = operations.run(up, "sync", {})
        assert held.exit_code == ExitCode.PARTIAL and held.data["pending"]["neo4j"] == 200
        assert held.warnings == [
            "still pending for neo4j: another delivery (an import, or memoryctl serve) is writing them now;"
            " run sync again when it ends"
        ]
    report, pending = up.sync()
    assert pending == {"qdrant": 0, "neo4j": 0}
    assert report.delivered["graph"] == 200
    assert counts(up) == {"postgres": 200, "qdrant": 200, "neo4j": 200}
    up.close()


class SilentRelay(BreakingRelay):
    """Relays loopback TCP to a server; once ``silent`` is set, nothing more goes either way and
    no connection closes: what a client sees when the server's machine vanished."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.silent = threading.Event()
        super().__init__(target)

    def _pipe(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while data := src.recv(65536):
                if not self.silent.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        close_both(src, dst)


def test_a_graph_gone_silent_costs_a_write_one_budget_then_nothing(
    pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path
) -> None:
    """Neo4j's machine vanishes under the service's open client (issue 26's drill: the primary's
    node is the index node): the first write waits for the graph no longer than ``[write]
    delivery_budget_s`` (Qdrant is delivered meanwhile, concurrently), answers exit 3 and names the
    budget; the next write does not wait for it at all. With Neo4j back, a write delivers again."""
    host, port = neo4j_clean["uri"].rsplit("//", 1)[1].rsplit(":", 1)
    relay = SilentRelay((host, int(port)))
    relayed = {**neo4j_clean, "uri": f"bolt://127.0.0.1:{relay.port}"}
    # A budget well above a write's delivery on a loaded machine (0.5 s failed the write before the
    # silence, on 2 cores shared with a deploy test); the silent store is what must exceed it.
    write = {"delivery_budget_s": 1.5, "breaker_reset_s": 3600.0}
    with MemoryClient(cluster_settings(pg_dsn, relayed, tmp_path / "q", write=write)) as client:
        assert Service(client.settings, client).client.write_budget_s == 1.5  # what `memoryctl serve` sets
        client.init()
        assert operations.run(client, "add", {"text": "before it went"}).exit_code == ExitCode.OK
        relay.silent.set()
        first = operations.run(client, "add", {"text": "the rollback was Alice's call"})
        assert first.exit_code == ExitCode.PARTIAL
        assert first.data["pending"] == {"qdrant": 0, "neo4j": 1}
        assert "neo4j did not take it within 1.5 s of the commit" in first.warnings[0], first.warnings
        second = operations.run(client, "add", {"text": "and Bob agreed"})
        assert second.exit_code == ExitCode.PARTIAL and second.data["pending"] == {"qdrant": 0, "neo4j": 1}
        assert "not tried: its delivery failed" in second.warnings[0], second.warnings
    relay.close()
    with MemoryClient(cluster_settings(pg_dsn, neo4j_clean, tmp_path / "q", write=write)) as client:
        third = operations.run(client, "add", {"text": "the graph is back"})
        assert third.exit_code == ExitCode.OK, third.warnings
        # The write that was not tried came along (its row was due); the one whose delivery still
        # hangs on the vanished machine's connection keeps its row in the outbox (nothing lost):
        # whoever holds it, or a later sync once that delivery has given up, delivers it.
        assert counts(client) == {"postgres": 4, "qdrant": 4, "neo4j": 3}
        assert client.stack.records.pending_count([uuid.UUID(first.data["id"])]) == {"graph": 1}


def test_a_commit_that_hangs_has_the_stores_probed_so_it_answers_at_once_when_it_lands(
    pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path
) -> None:
    """The failover drill's order of events: the node that held the primary also held Neo4j, so
    every write first waits for the new primary, then would spend its budget on the lost graph.
    Here the commit is held (a lock on ``memories``, as a failover holds it) while Neo4j has gone
    silent: the service asks the stores meanwhile, the graph does not answer within the budget, and
    the write that finally commits is not made to wait for it ("not tried"), stored and pending."""
    host, port = neo4j_clean["uri"].rsplit("//", 1)[1].rsplit(":", 1)
    relay = SilentRelay((host, int(port)))
    relayed = {**neo4j_clean, "uri": f"bolt://127.0.0.1:{relay.port}"}
    # A budget well above a write's delivery on a loaded machine (0.5 s failed the write before the
    # silence, on 2 cores shared with a deploy test); the silent store is what must exceed it.
    write = {"delivery_budget_s": 1.5, "breaker_reset_s": 3600.0}
    with MemoryClient(cluster_settings(pg_dsn, relayed, tmp_path / "q", write=write)) as client:
        Service(client.settings, client)  # sets the budget, as `memoryctl serve` does
        client.init()
        assert operations.run(client, "add", {"text": "before it went"}).exit_code == ExitCode.OK
        relay.silent.set()
        with psycopg.connect(pg_dsn, autocommit=False) as holder:
            holder.execute("LOCK TABLE memories IN SHARE MODE")  # every insert waits for it
            # Held past the probe (after 1 s) and its budget (1.5 s): a failover holds it ~20 s.
            release = threading.Timer(4.0, holder.rollback)
            release.start()
            held = operations.run(client, "add", {"text": "written while the primary was away"})
            release.join()
        assert held.exit_code == ExitCode.PARTIAL, held.warnings
        assert held.data["pending"] == {"qdrant": 0, "neo4j": 1}
        assert "not tried: its delivery failed" in held.warnings[0], held.warnings
    relay.close()


def test_forget_hides_at_once_and_purge_removes_everywhere(cluster: MemoryClient) -> None:
    keep, drop = uuid.uuid4(), uuid.uuid4()
    cluster.add(
        [
            Memory(id=keep, text="the rollback went fine", agent_id="a1", entities=[EntityRef("User", "Alice")]),
            Memory(id=drop, text="the rollback was a disaster", agent_id="a1", entities=[EntityRef("User", "Alice")]),
        ]
    )
    cluster.forget([drop], agent_id="a1")
    hits = cluster.query(text="rollback", agent_id="a1").hits
    assert [h.id for h in hits] == [keep]
    vec = cluster.stack.require_vectors()
    assert vec.count() == 2  # soft: still there, flagged deleted in both stores (the outbox delivered it)
    flagged = {r.id: r.deleted for page in vec.scroll(agent_id="a1") for r in page}
    assert flagged == {keep: False, drop: True}
    in_graph = {r.id: r.deleted for page in cluster.stack.require_graph().scroll(agent_id="a1") for r in page}
    assert in_graph == {keep: False, drop: True}
    assert cluster.stack.records.purge([drop]) == [drop]
    cluster.sync()
    assert counts(cluster) == {"postgres": 1, "qdrant": 1, "neo4j": 1}


def lexical_terms(client: MemoryClient) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
    """(what the writer kept in lexical_terms, a recount from the live memories)."""
    with client.stack.pool.connection() as conn:
        kept = conn.execute("SELECT agent_id, term, df FROM lexical_terms WHERE df <> 0").fetchall()
        counted = conn.execute(
            "SELECT agent_id, term, count(*) AS df FROM memories,"
            " unnest(memoryctl_memory_terms(tsv, entities)) AS term WHERE deleted_at IS NULL GROUP BY 1, 2"
        ).fetchall()
    return {(r["agent_id"], r["term"]): r["df"] for r in kept}, {(r["agent_id"], r["term"]): r["df"] for r in counted}


def test_lexical_terms_follow_every_write(cluster: MemoryClient) -> None:
    """The lexical leg's word statistics and the agents' entity names (schema 0009) equal a
    recount after inserts, re-imports, changed texts and entities, a refused move to another
    agent, soft deletes and purges (each its own transaction)."""
    ids = [uuid.uuid4() for _ in range(6)]
    alice = [EntityRef("User", "Alice")]
    texts = ["the rollback went fine", "rollbacks again", "deploy of payments", "Alice's lunch", "payments down", "ok"]
    agents = ["a1"] * 4 + ["a2"] * 2
    mems = [Memory(id=i, text=t, agent_id=a, entities=alice) for i, t, a in zip(ids, texts, agents, strict=True)]
    cluster.add(mems, extract=False)
    kept, counted = lexical_terms(cluster)
    assert kept == counted and kept[("a1", "rollb")] == 2 and kept[("a1", "")] == 4 and kept[("a2", "alice")] == 2
    assert kept[("a1", "entity alice")] == 4 and kept[("a2", "entity alice")] == 2
    cluster.add(mems, extract=False)  # unchanged: nothing counted twice
    assert lexical_terms(cluster) == (counted, counted)
    changed = Memory(
        id=ids[0], text="the deploy went fine", agent_id="a1", entities=[EntityRef("Customer", " Acme  Corp.")]
    )
    moved = Memory(id=ids[4], text="payments down", agent_id="a1", entities=alice)  # a2's id: refused
    with pytest.raises(ConflictError):
        cluster.add([changed, moved], extract=False)
    assert lexical_terms(cluster) == (counted, counted)  # the batch was refused whole
    cluster.add([changed], extract=False)
    kept, counted = lexical_terms(cluster)
    assert kept == counted and kept[("a1", "rollb")] == 1 and kept[("a1", "")] == 4 and kept[("a2", "")] == 2
    assert kept[("a1", "entity alice")] == 3 and kept[("a1", "entity acme corp")] == 1
    cluster.forget([ids[1], ids[2]], agent_id="a1")
    cluster.forget([ids[1]], agent_id="a1")  # already forgotten: nothing taken twice
    kept, counted = lexical_terms(cluster)
    assert kept == counted and ("a1", "rollb") not in kept and kept[("a1", "")] == 2
    assert kept[("a1", "entity alice")] == 1
    assert set(cluster.stack.records.purge([ids[1], ids[2]])) == {ids[1], ids[2]}  # already out of the counts
    assert lexical_terms(cluster) == (counted, counted)


def test_delivery_writes_each_batch_in_id_order(cluster: MemoryClient) -> None:
    """A vector store lists equal-score points in write order; the same data written in the same
    order answers the same query the same way, whatever order PostgreSQL returned the rows in."""
    from memoryctl.write.outbox import Deliverer

    class Recording:
        def __init__(self, inner: object) -> None:
            self.inner, self.written = inner, []  # type: list[uuid.UUID]

        def upsert(self, points: list[object], **kw: object) -> None:
            self.written += [p.id for p in points]  # type: ignore[attr-defined]
            self.inner.upsert(points, **kw)  # type: ignore[attr-defined]

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

    ids = [uuid.uuid4() for _ in range(60)]  # inserted in this (random) order
    cluster.add(
        [Memory(id=i, agent_id="order", text=f"the same words {n % 3}") for n, i in enumerate(ids)], deliver=False
    )
    vectors = Recording(cluster.stack.require_vectors())
    stack = cluster.stack
    report = Deliverer(stack.records, vectors, None, stack.embedder).deliver(batch=25, targets=("vector",))  # type: ignore[arg-type]
    assert report.delivered["vector"] == 60 and not report.failed
    batches = [vectors.written[i : i + 25] for i in range(0, 60, 25)]
    assert all(b == sorted(b) for b in batches), batches
    assert sorted(vectors.written) == sorted(ids)


def _lock_waiters(dsn: str) -> int:
    """Backends waiting for a row lock on the outbox (a delivery waiting for another one)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%FROM outbox%'"
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_delivery_of_named_ids_waits_for_rows_another_delivery_holds(cluster: MemoryClient, pg_dsn: str) -> None:
    """Reconcile's repair asks whether *its* ids landed; cron's reconcile or sync may hold outbox rows
    of the same ids. Skipping them made a restore report drift that was being delivered right then
    (a flaky restore drill): the waiting pass outlasts the holder and sees the truth."""
    import threading
    import time

    from memoryctl.write.outbox import Deliverer, DeliveryReport

    stack = cluster.stack
    mems = [Memory(id=uuid.uuid4(), agent_id="held", text=f"held memory {i}") for i in range(12)]
    ids = [m.id for m in mems]
    cluster.add(mems, deliver=False)  # one graph row per id in the outbox: "the other delivery's"
    graph = stack.require_graph()
    deliverer = Deliverer(stack.records, None, graph, None)

    with psycopg.connect(pg_dsn) as holder:
        held = holder.execute(
            "SELECT id FROM outbox WHERE target = 'graph' AND memory_id = ANY(%s) FOR UPDATE", (ids,)
        ).fetchall()
        assert len(held) == 12
        stack.records.enqueue(ids, "upsert")  # the repair's own rows for the same ids

        skipping = deliverer.deliver(memory_ids=ids, targets=["graph"])
        assert skipping.delivered["graph"] == 12 and not skipping.failed  # its own rows went through ...
        assert stack.records.pending_count(ids)["graph"] == 12  # ... but the held ones look pending

        timed_out = deliverer.deliver(memory_ids=ids, targets=["graph"], wait_held_s=0.3)
        assert "held by another delivery for more than 0.3 s" in timed_out.failed["graph"]
        assert stack.records.pending_count(ids)["graph"] == 12  # nothing lost

        stack.records.enqueue(ids[:4], "upsert")  # more of the repair's own rows, then it waits
        result: list[DeliveryReport] = []
        waiting = threading.Thread(
            target=lambda: result.append(deliverer.deliver(memory_ids=ids, targets=["graph"], wait_held_s=60))
        )
        waiting.start()
        deadline = time.monotonic() + 30
        while _lock_waiters(pg_dsn) == 0 and waiting.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert waiting.is_alive(), "the delivery returned without waiting for the held rows"
        # The other delivery finishes: it removes the rows it delivered.
        holder.execute("DELETE FROM outbox WHERE id = ANY(%s)", ([r[0] for r in held],))
        holder.commit()
    waiting.join(timeout=60)
    assert result and not result[0].failed and result[0].delivered["graph"] == 4
    assert stack.records.pending_count(ids).get("graph", 0) == 0
    assert {r.id for page in graph.scroll(agent_id="held", batch=100) for r in page} == set(ids)
