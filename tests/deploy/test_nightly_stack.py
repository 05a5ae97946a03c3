"""The nightly LoRA cycle on the deployed stack (issue 28, docs/nightly.md), run by cron on the gpu node.

The embedding step: the stack embeds through embedding slot a (deploy/embedding_slots.py, MiniLM
served by the stand-in from the weights the night trains on); the night trains an adapter on the
recalls marked useful (read from PostgreSQL), gates it on held-out recall, merges it into a new
model version, puts that on slot b and ``migrate`` moves every vector to it (verification, alias
swap); ``memoryctl adapters embedding --rollback`` goes back to slot a's collection.

``memoryctl nightly`` is node3's cron entry (deploy/nightly.py): it reads the dialogue turns from
PostgreSQL over the mesh, stops ``vllm@generate`` through its sudoers rule while it trains (the
GEX44 has no room for both), trains the generation adapter on the CPU (Debian's torch; the tiny
Qwen2 stands for the served model's weights), gates it on held-out loss, registers it and
hot-loads it into the running vLLM STAND-IN through vLLM's runtime LoRA API; the stand-in then
answers differently when a request names the adapter. A second night with new turns is gated
against the served adapter; a restart of ``vllm@generate`` outside a night loads the active adapter
again (the ``memoryctl-adapter-serve`` unit); ``memoryctl adapters generation --rollback`` goes back.

Each night is started by cron itself: the installed line, as written, scheduled every minute
until a run record of ``nightly`` triggered by cron appears.
"""

from __future__ import annotations

import json
import re
import shlex
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.deploy import e2e_data
from tests.deploy.cluster import MESH, memoryctl, node, put, wait_for
from tests.deploy.conftest import record

pytestmark = pytest.mark.deploy
GPU = "node3"
BASE_EMBEDDING = "all-MiniLM-L6-v2"  # the stand-in's base model (deploy/embedding_slots.py)
PSQL = "sudo -u postgres psql -XAtd memoryctl -c"
LAST_RUN = "SELECT coalesce(max(id), 0) FROM maintenance_runs"


def sql(statement: str) -> str:
    for member in ("node1", "node2"):  # a Patroni cluster's primary may be either member
        result = node(member).run(f"{PSQL} {shlex.quote(statement)}")
        if result.rc == 0:
            return result.stdout.strip()
    raise AssertionError(f"no member answered {statement!r}")


def seed_dialogue(label: str, conversations: range) -> int:
    """Dialogue turns (a user asks, the assistant answers) imported on the db node; how many.

    Written the last milliseconds before now: a night trains on the turns written since the last
    successful night began (``created_at``), and a night on the tiny model takes seconds, so each
    night sees exactly the turns seeded for it."""
    now = datetime.now(UTC)
    rows = []
    for n, i in enumerate(conversations):
        question, reply = f"how do I restart service {i}?", f"run systemctl restart service{i} and check the logs"
        for turn, (role, text) in enumerate((("user", question), ("assistant", reply))):
            rows.append(
                {
                    "agent_id": e2e_data.AGENT,
                    "kind": "dialogue",
                    "created_at": (now - timedelta(milliseconds=2 * (len(conversations) - n) - turn)).isoformat(),
                    "text": text,
                    "metadata": {"role": role, "conversation_id": f"{label}-{i}"},
                }
            )
    path = f"/var/lib/memoryctl/dialogue-{label}.jsonl"
    put("node1", "".join(json.dumps(row) + "\n" for row in rows), path)
    node("node1").check_output(f"chown memoryctl {path}")
    run = memoryctl("import", path)
    assert run.returncode == 0, run.stdout[-1500:] + run.stderr[-1500:]
    return len(rows)


def seed_useful_recalls(round_: int = 0) -> list[dict[str, str]]:
    """The nickname history (tests/lora/synthetic.py) as notes, each recalled for its paraphrased
    question and marked useful: the embedding step's training data, as ``memoryctl feedback`` records
    it (fixed ids: the step's train/held-out split is by query, so the night's outcome is decided).
    A later ``round_`` marks the same answers of the same queries useful again (the notes exist
    already): the next night's data is the same as the first's."""
    from tests.lora.synthetic import embedding_rows

    rows = embedding_rows()
    notes = [
        {"id": str(uuid.UUID(int=10_000 + i)), "agent_id": e2e_data.AGENT, "kind": "note", "text": row["positive"]}
        for i, row in enumerate(rows)
    ]
    if round_ == 0:
        path = "/var/lib/memoryctl/useful-notes.jsonl"
        put("node1", "".join(json.dumps(note) + "\n" for note in notes), path)
        node("node1").check_output(f"chown memoryctl {path}")
        run = memoryctl("import", path)
        assert run.returncode == 0, run.stdout[-1500:] + run.stderr[-1500:]
    events = [
        {"agent_id": e2e_data.AGENT, "memory_id": note["id"], "query_id": str(uuid.UUID(int=20_000 + i)), **event}
        for i, (note, row) in enumerate(zip(notes, rows, strict=True))
        for event in (
            {"event": "recall", "payload": {"text": row["query"]}},
            {"event": "feedback", "payload": {"useful": True}},
        )
    ]
    insert(
        "INSERT INTO memory_events (agent_id, memory_id, query_id, event, payload)"
        " SELECT agent_id, memory_id, query_id, event, payload FROM jsonb_to_recordset(:'rows'::jsonb)"
        " AS r(agent_id text, memory_id uuid, query_id uuid, event text, payload jsonb)",
        events,
    )
    pairs = zip(notes, rows, strict=True)
    return [{"id": note["id"], "query": row["query"], "text": note["text"]} for note, row in pairs]


def insert(statement: str, rows: list[dict[str, Any]]) -> None:
    """``statement`` run on the primary with ``rows`` as the psql variable ``rows`` (JSON, quoted by psql)."""
    path = "/tmp/memoryctl-test-rows.json"
    for member in ("node1", "node2"):
        put(member, json.dumps(rows), path)
        command = f"{PSQL.removesuffix(' -c')} -v ON_ERROR_STOP=1 -v rows=\"$(cat {path})\" <<'EOF'\n{statement};\nEOF"
        if node(member).run(command).rc == 0:
            return
    raise AssertionError(f"no member took {statement!r}")


def embedding_model() -> str:
    """The model the stack's vectors are embedded with (the spec ``migrate`` recorded), as health says."""
    health = memoryctl("health", "--json", "--deadline", "15", on=GPU).json()
    return str(health["components"]["nightly"]["embedding_model"])


def embed(port: int, model: str, text: str) -> list[float]:
    body = {"model": model, "input": [text]}
    return list(vllm("/v1/embeddings", body, port=port)["data"][0]["embedding"])


def night_from_cron(label: str) -> dict[str, Any]:
    """Schedule the installed nightly line every minute until cron has run it once; its run record."""
    host = node(GPU)
    lines = host.file("/etc/cron.d/memoryctl").content_string.splitlines()
    every_minute = [
        re.sub(r"^(\S+\s+){5}", "* * * * * ", line) if "/bin/memoryctl " in line else line for line in lines
    ]
    before = int(sql(LAST_RUN))
    latest = (
        "SELECT id, status, trigger, details FROM maintenance_runs WHERE command = 'nightly'"
        " AND status <> 'running' ORDER BY id DESC LIMIT 1"
    )

    def finished() -> list[str] | None:
        row = sql(latest).split("|", 3)
        return row if len(row) == 4 and int(row[0]) > before else None

    started = time.monotonic()
    host.run("cat > /etc/cron.d/memoryctl-night-test <<'EOF'\n" + "\n".join(every_minute) + "\nEOF")
    try:
        row = wait_for(f"cron ran the {label} night on {GPU}", finished, timeout=900, interval=5)
    finally:
        host.run("rm -f /etc/cron.d/memoryctl-night-test")
    run_id, status, trigger, details = row
    return {
        "id": int(run_id),
        "status": status,
        "trigger": trigger,
        "details": json.loads(details),
        "seconds_from_schedule": round(time.monotonic() - started, 1),
    }


def steps(night: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {step["name"]: step for step in night["details"]["steps"]}


def vllm(path: str, body: dict[str, Any] | None = None, port: int = 8000) -> dict[str, Any]:
    """vLLM's (the stand-in's) OpenAI API on the gpu node's mesh address, with its API key."""
    key = "$(sed -n 's/^VLLM_API_KEY=//p' /etc/vllm/vllm.env)"
    data = f" -H 'Content-Type: application/json' -d {shlex.quote(json.dumps(body))}" if body is not None else ""
    out = node(GPU).check_output(
        f'curl -sf -m 30 -H "Authorization: Bearer {key}"{data} http://{MESH[GPU]}:{port}{path}'
    )
    answer: dict[str, Any] = json.loads(out)
    return answer


def served() -> set[str]:
    return {card["id"] for card in vllm("/v1/models")["data"]}


def adapter_unit(state: str) -> str | None:
    """``systemctl show`` of the unit that loads the active adapter when vllm@generate starts, once
    it shows ``state`` (a oneshot shows Result=success while it still runs)."""
    unit = node(GPU).check_output("systemctl show -p Result -p ActiveState memoryctl-adapter-serve")
    return unit if state in unit.splitlines() else None


def listed() -> set[str]:
    """What ``/v1/models`` lists, nothing while vLLM is (re)starting and does not answer."""
    key = "$(sed -n 's/^VLLM_API_KEY=//p' /etc/vllm/vllm.env)"
    out = node(GPU).run(f'curl -sf -m 10 -H "Authorization: Bearer {key}" http://{MESH[GPU]}:8000/v1/models')
    return {card["id"] for card in json.loads(out.stdout)["data"]} if out.rc == 0 else set()


def answer(model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "who decided the rollback?"}]}
    return str(vllm("/v1/chat/completions", body)["choices"][0]["message"]["content"])


def test_nights_from_the_gpu_nodes_cron_train_gate_hot_load_and_roll_back(imported: e2e_data.DataSet) -> None:
    base = vllm("/v1/models")["data"][0]["id"]
    before = {"models": sorted(served()), "answer": answer(base)}
    assert "nightly" not in node("node1").file("/etc/cron.d/memoryctl").content_string  # it runs on the gpu node

    turns = seed_dialogue("n1", range(16))
    recalls = seed_useful_recalls()
    # Nothing recorded yet (a fresh stack: health says the configured embedder serves) or, after
    # test_e2e's migrate and rollback, the base recorded by them.
    recorded = embedding_model()
    assert recorded in ("None", f"http:{BASE_EMBEDDING}"), recorded
    base_model = f"http:{BASE_EMBEDDING}"
    probe = recalls[0]["query"]
    base_vector = embed(8001, BASE_EMBEDDING, probe)
    first = night_from_cron("first")
    s1 = steps(first)
    assert first["status"] == "ok" and first["trigger"] == "cron", first
    generation = s1["generation"]
    assert generation["status"] == "ok", generation
    gate = generation["gate_metrics"]
    assert gate["candidate_heldout_loss"] < gate["active_heldout_loss"], gate
    adapter = generation["swap"]["loaded"]
    assert adapter in served(), (adapter, served())
    after = answer(adapter)
    assert after != before["answer"] and adapter in after  # the adapter answers, the base did not
    assert answer(base) == before["answer"]  # requests naming the base model still get the base
    pause = generation.get("gpu_pause") or {}
    # The embedding adapter: trained on the GPU node, gated, merged into a new version on slot b,
    # every vector migrated to it; slot a keeps the base for a rollback.
    emb = s1["embedding"]
    assert emb["status"] == "ok", emb
    emb_gate = emb["gate_metrics"]
    assert emb_gate["candidate_recall_at_k"] > emb_gate["active_recall_at_k"], emb_gate
    # Trained with the GPU freed too (vllm@generate stopped and started, as for the generation step).
    emb_pause = emb.get("gpu_pause") or {}
    assert emb_pause.get("units") == ["vllm@generate"] and emb_pause.get("ready_s") is not None, emb_pause
    version = f"{BASE_EMBEDDING}+lora-v0001"
    assert emb["serve"]["slot"] == f"http://{MESH[GPU]}:8002" and emb["serve"]["served_name"] == version, emb
    assert emb["migrate"]["status"] == "swapped" and emb["migrate"]["verify"], emb["migrate"]
    assert embedding_model() == f"http:{version}"
    assert {card["id"] for card in vllm("/v1/models", port=8002)["data"]} == {version}
    assert embed(8002, version, probe) != base_vector and embed(8001, BASE_EMBEDDING, probe) == base_vector
    # Queries go on through slot b (a query embedded by another model than the collection's is
    # refused by the model check): a note asked for by its own words comes first.
    found = memoryctl("query", recalls[0]["text"], "--agent", e2e_data.AGENT, "--limit", "5", "--json")
    assert found.returncode == 0, found.stdout[-1500:] + found.stderr[-1500:]
    assert [hit["id"] for hit in found.json()["hits"]][:1] == [recalls[0]["id"]], found.stdout[-1500:]
    assert s1["reembed"]["status"] == "ok" and s1["reconcile"]["status"] == "ok", s1

    # The night's GPU pauses started vllm@generate, and with it the unit: it left the night alone.
    assert "Result=success" in wait_for("the unit finished", lambda: adapter_unit("ActiveState=inactive"), 60, 1)

    turns2 = seed_dialogue("n2", range(16, 26))
    seed_useful_recalls(round_=1)  # the same feedback again: nothing new to learn
    second = night_from_cron("second")
    s2 = steps(second)
    assert second["status"] == "ok", second
    # More turns of the same kind: the candidate does not beat the served adapter by the gate's
    # noise floor (min_loss_improvement 0.01, deploy/night.py), so nothing changes.
    decided = s2["generation"]
    assert decided["status"] == "rejected", decided
    assert decided["gate_metrics"]["improvement"] <= decided["gate_metrics"]["min_improvement"], decided
    assert served() == {base, adapter} and answer(adapter) == after
    # The same feedback again: the candidate trained on it is as good as the served version and no
    # better (recall@1 equal on the same held-out queries), so the gate keeps what is served: no new
    # version, no migrate. (With new query ids the split moves and the candidate does beat it:
    # 0.964 > 0.929, measured offline with the same training settings.)
    rejected = s2["embedding"]
    assert rejected["status"] == "rejected" and "serve" not in rejected and "migrate" not in rejected, rejected
    gm = rejected["gate_metrics"]
    assert gm["candidate_recall_at_k"] <= gm["active_recall_at_k"] + gm["min_improvement"], gm
    assert embedding_model() == f"http:{version}"
    assert {card["id"] for card in vllm("/v1/models", port=8002)["data"]} == {version}

    # vLLM restarted outside a night (a reboot, a crash, by hand) forgets the adapter; the unit every
    # start of vllm@generate pulls in (memoryctl-adapter-serve, deploy/nightly.py) loads it again.
    restarted = time.monotonic()
    node(GPU).check_output("systemctl restart vllm@generate")
    wait_for("the active adapter served again after vllm@generate restarted", lambda: adapter in listed(), 180)
    reloaded_s = round(time.monotonic() - restarted, 1)
    unit = wait_for("memoryctl-adapter-serve finished", lambda: adapter_unit("ActiveState=inactive"), 60, 1)
    assert "Result=success" in unit, unit
    assert answer(adapter) == after and answer(base) == before["answer"]

    back = memoryctl("adapters", "embedding", "--rollback", on=GPU)
    assert back.returncode == 0, back.stdout[-1500:] + back.stderr[-1500:]
    assert embedding_model() == base_model  # slot a's collection and model again
    found = memoryctl("query", recalls[0]["text"], "--agent", e2e_data.AGENT, "--limit", "5", "--json")
    assert found.returncode == 0 and [hit["id"] for hit in found.json()["hits"]][:1] == [recalls[0]["id"]]

    rollback = memoryctl("adapters", "generation", "--rollback", on=GPU)
    assert rollback.returncode == 0, rollback.stdout[-1500:] + rollback.stderr[-1500:]
    assert served() == {base} and answer(base) == before["answer"]  # back to the base model
    health = memoryctl("health", "--json", "--deadline", "15", on=GPU).json()["components"]["nightly"]
    logs = node(GPU).check_output("tail -n 400 /var/log/memoryctl/nightly.log")
    assert "Traceback" not in logs, logs[-3000:]
    record(
        "nightly_stack",
        {
            "before": before,
            "dialogue_turns": [turns, turns2],
            "first": {"run": first["id"], "seconds_from_schedule": first["seconds_from_schedule"], "steps": s1},
            "gate": gate,
            "gpu_pause": pause,
            "adapter": adapter,
            "answer_after": after,
            "second": {"run": second["id"], "seconds_from_schedule": second["seconds_from_schedule"], "steps": s2},
            "rollback": rollback.stdout[-1500:],
            "embedding_rollback": back.stdout[-1500:],
            "embedding_versions": {"before": base_model, "after_first": f"http:{version}"},
            "served_after_rollback": sorted(served()),
            "adapter_served_again_after_restart_s": reloaded_s,
            "health": health,
        },
    )
