"""End to end on the deployed cluster: memoryctl on the db node, every store over the mesh.

The data set (tests/deploy/e2e_data.py) is imported through the write path once per session
(fixture ``imported``); then one query of every plan shape with the answers the data implies,
health all green (Qdrant cluster and Timescale jobs included), reconcile without drift, a
migration with the alias swap on the real Qdrant cluster and its rollback, and each cron job run
once by cron itself. Queries run with ``--half-life off``: the expected answers are about
retrieval, not about how old the data is on the day the test runs.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.deploy import e2e_data
from tests.deploy.cluster import MESH, memoryctl, node, peer_api, wait_for
from tests.deploy.conftest import record

pytestmark = pytest.mark.deploy

NEWEST_FIRST = "newest first"


def query(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    run = memoryctl("query", "--agent", e2e_data.AGENT, "--json", "--half-life", "off", *args, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    answer: dict[str, Any] = run.json()
    assert answer["degraded"] == [], answer["explain"]
    return answer


def ids(answer: dict[str, Any]) -> list[str]:
    return [hit["id"] for hit in answer["hits"]]


def health() -> dict[str, Any]:
    # A generous deadline: the test judges what the stores say, not how fast a loaded CI box is.
    run = memoryctl("health", "--json", "--deadline", "15")
    report: dict[str, Any] = run.json()
    return report


def _store_counts() -> dict[str, Any] | None:
    """Each store's count as health reports it; None while a probe did not answer (each store call
    of a probe has 1.5 s, which a CI box running two test stages can exceed: seen in a rehearsal)."""
    components = health()["components"]
    counts = {
        "postgres": components["postgres"].get("memories"),
        "qdrant": components["qdrant"].get("points"),
        "neo4j": components["neo4j"].get("memories"),
    }
    return counts if None not in counts.values() else None


def test_counts_per_store_are_equal(imported: e2e_data.DataSet) -> None:
    counts = wait_for("every store's count in memoryctl health", _store_counts, 60, describe=health)
    record("e2e_counts", counts)
    assert counts == dict.fromkeys(counts, len(imported.records))


def test_text_query_finds_each_needle_first(imported: e2e_data.DataSet) -> None:
    for needle in imported.needles():
        assert needle.query is not None
        answer = query(needle.query)
        assert re.match(r"vector(\+lexical)?\(pushdown: agent", answer["explain"]["plan"]), answer["explain"]["plan"]
        assert ids(answer)[0] == needle.id, (needle.text, answer["hits"][:3])


def _reranked(question: str) -> dict[str, Any]:
    # A budget no loaded CI box runs out of: the test is about who reads the candidates (a budget
    # cut is a note too, and the stand-in on a shared core took over 500 ms for 30 in a rehearsal).
    # In the CLI's own process, so the setting applies (the resident service has its own).
    run = memoryctl(
        "query",
        question,
        "--agent",
        e2e_data.AGENT,
        "--rerank",
        "--explain",
        "--json",
        "--half-life",
        "off",
        env={"MEMORYCTL_SERVE__USE": "false", "MEMORYCTL_QUERY__RERANK_BUDGET_MS": "60000"},
    )
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    step = next(s for s in answer["explain"]["steps"] if s["name"] == "rerank")
    return {"scorer": step["detail"]["scorer"], "notes": answer["explain"]["notes"], "ids": ids(answer)[:3]}


def test_the_rerank_stage_asks_vllm_rerank_and_the_cpu_model_takes_over_when_it_is_away(
    imported: e2e_data.DataSet,
) -> None:
    """vllm@rerank (the stand-in serving the registry's CPU cross-encoder on the gpu node, vLLM's
    score API) reads a --rerank query's candidates; stopped, the CPU model installed beside
    memoryctl reads them and --explain says why; started again, it answers as before."""
    gpu = node("node3")
    assert gpu.service("vllm@rerank").is_running
    needle = imported.needles()[0]
    assert needle.query is not None
    served = _reranked(needle.query)
    assert served["scorer"] == f"cross-encoder/ms-marco-MiniLM-L-12-v2 at http://{MESH['node3']}:8003", served
    assert needle.id in served["ids"] and served["notes"] == [], served
    gpu.run("systemctl stop vllm@rerank")
    try:
        away = _reranked(needle.query)
    finally:
        gpu.run("systemctl start vllm@rerank")
        ready = "/usr/bin/python3 /opt/vllm/vllm-smoke ready --env /etc/vllm/vllm.env --timeout 300"
        assert gpu.run(f"{ready} --url http://{MESH['node3']}:8003").rc == 0
    assert away["scorer"] == "cpu" and needle.id in away["ids"], away
    assert any("the CPU cross-encoder read the candidates instead" in n for n in away["notes"]), away


def test_text_query_with_a_time_range_pushed_down(imported: e2e_data.DataSet) -> None:
    needle = imported.needles()[0]  # created 2026-03-15
    assert needle.query is not None
    inside = query(needle.query, "--since", "2026-03-01T00:00:00+00:00", "--until", "2026-04-01T00:00:00+00:00")
    assert "time" in inside["explain"]["plan"]
    assert ids(inside)[0] == needle.id
    assert all(hit["created_at"].startswith("2026-03") for hit in inside["hits"])
    outside = query(needle.query, "--since", "2026-05-01T00:00:00+00:00")
    assert needle.id not in ids(outside) and outside["hits"]


def test_graph_first_text_query(imported: e2e_data.DataSet) -> None:
    needle = imported.needles()[0]  # authored by p07, who authored ~33 memories: a small fan-out
    assert needle.query is not None
    answer = query(needle.query, "--entity", f"person:{needle.author}", "--via", "AUTHORED")
    assert answer["explain"]["plan"].startswith("graph → vector")
    assert ids(answer)[0] == needle.id
    assert set(ids(answer)) <= imported.ids(author=needle.author)


def test_vector_first_text_query_for_a_high_fan_out_entity(imported: e2e_data.DataSet) -> None:
    needle = imported.needles()[2]  # mentions atlas, which 700 memories mention
    threshold = e2e_data.VECTOR_FIRST_MIN_FANOUT
    assert needle.query is not None and len(imported.ids(project="atlas")) >= threshold
    # In-process (MEMORYCTL_SERVE__USE=false): the node's `memoryctl serve` would answer the query
    # with the settings of the deployed file, not with this command's threshold.
    settings = {"MEMORYCTL_SERVE__USE": "false", "MEMORYCTL_QUERY__VECTOR_FIRST_MIN_FANOUT": str(threshold)}
    answer = query(needle.query, "--entity", "project:atlas", env=settings)
    assert "vector-first" in answer["explain"]["plan"]
    assert ids(answer)[0] == needle.id
    assert set(ids(answer)) <= imported.ids(project="atlas")


def test_graph_only_query_returns_exactly_the_authored_memories(imported: e2e_data.DataSet) -> None:
    answer = query("--entity", "person:p03", "--via", "AUTHORED", "--limit", "1000")
    assert answer["explain"]["plan"].startswith("graph(") and NEWEST_FIRST in answer["explain"]["plan"]
    assert set(ids(answer)) == imported.ids(author="p03")
    created = [hit["created_at"] for hit in answer["hits"]]
    assert created == sorted(created, reverse=True)


def test_graph_and_where_query(imported: e2e_data.DataSet) -> None:
    answer = query("--entity", "person:p03", "--via", "AUTHORED", "--where", "kind = incident", "--limit", "1000")
    assert answer["explain"]["plan"].startswith("graph → postgres")
    expected = imported.ids(author="p03", kind="incident")
    assert expected and set(ids(answer)) == expected


def test_relational_query_with_time_range(imported: e2e_data.DataSet) -> None:
    start, end = datetime(2026, 4, 1, tzinfo=UTC), datetime(2026, 5, 1, tzinfo=UTC)
    answer = query(
        "--where", "kind = incident", "--since", start.isoformat(), "--until", end.isoformat(), "--limit", "1000"
    )
    assert answer["explain"]["plan"].startswith("postgres(filter")
    expected = imported.created_between(start, end, kind="incident")
    assert expected and set(ids(answer)) == expected


def test_or_query_fuses_both_legs(imported: e2e_data.DataSet) -> None:
    """The union of the legs: every incident (the where leg, a membership) and the text leg's hits,
    led among the latter by the needle the text describes."""
    needle = imported.needles()[1]
    assert needle.query is not None
    answer = query(needle.query, "--where", "kind = incident", "--combine", "or", "--limit", "1000")
    assert answer["explain"]["plan"].startswith("or:")
    assert imported.ids(kind="incident") <= set(ids(answer))
    from_text = [hit["id"] for hit in answer["hits"] if hit["kind"] != "incident"]
    assert from_text and from_text[0] == needle.id


def test_health_is_all_green_with_the_qdrant_cluster_and_timescale_jobs(imported: e2e_data.DataSet) -> None:
    report = health()
    record("e2e_health", report)
    components = report["components"]
    assert report["status"] == "healthy", {k: v.get("error") for k, v in components.items()}
    assert all(c["status"] == "ok" for c in components.values()), components
    cluster = components["qdrant"]["cluster"]
    assert cluster["peers"] == 3 and cluster["consensus"] == "working" and cluster["unreachable"] == []
    assert cluster["shards"] == 3 and len(cluster["replicas"]) == 6
    assert {r["state"] for r in cluster["replicas"]} == {"Active"}
    pg = components["postgres"]
    assert pg["timescaledb"] == "2.28.3" and pg["schema_path"] == "timescale"
    jobs = [job for job in pg["timescale_policies"] if job["hypertable_name"]]
    assert jobs and all((job["total_failures"] or 0) == 0 for job in jobs), jobs
    peers = {p["allowed_ips"] for p in components["wireguard"]["peers"]}
    assert peers == {"10.77.0.2/32", "10.77.0.3/32"}


def test_reconcile_finds_no_drift(imported: e2e_data.DataSet) -> None:
    run = memoryctl("reconcile", "--json")
    report = run.json()
    record("e2e_reconcile", {"cli_seconds": round(run.seconds, 1), **report})
    assert run.returncode == 0 and report["drift"] == 0, report
    assert report["postgres"]["scanned"] == len(imported.records)
    assert {name: s["scanned"] for name, s in report["stores"].items()} == dict.fromkeys(
        report["stores"], len(imported.records)
    )


def test_migrate_swaps_the_alias_on_the_qdrant_cluster_and_rolls_back(imported: e2e_data.DataSet) -> None:
    before = health()["components"]["qdrant"]
    needle = imported.needles()[0]
    assert needle.query is not None
    migrated = memoryctl("migrate", "--to-model", "kind=local", "--json")
    report = migrated.json()
    record("e2e_migrate", {"cli_seconds": round(migrated.seconds, 1), **report})
    assert migrated.returncode == 0 and report["status"] == "swapped", report
    assert report["copied"] == len(imported.records)
    after = health()["components"]["qdrant"]
    assert after["collection"] != before["collection"] and after["points"] == len(imported.records)
    # The new collection was created for the cluster: 3 shards, each on 2 of the 3 peers.
    layout = peer_api("node1", f"/collections/{after['collection']}")["config"]["params"]
    assert (layout["shard_number"], layout["replication_factor"]) == (3, 2)
    assert ids(query(needle.query))[0] == needle.id  # answered by the new model's collection
    rolled = memoryctl("migrate", "--rollback", "--json")
    assert rolled.returncode == 0 and rolled.json()["status"] == "rolled-back", rolled.stdout
    assert health()["components"]["qdrant"]["collection"] == before["collection"]
    assert ids(query(needle.query))[0] == needle.id


def test_each_cron_job_runs_once_recorded_as_cron(imported: e2e_data.DataSet) -> None:
    """The installed cron lines, as written, run by cron itself once a minute until each has run:
    sync and reconcile on the db node, the night on the gpu node (deploy/nightly.py)."""
    hosts = {"node1": node("node1"), "node3": node("node3")}
    psql = "sudo -u postgres psql -XAtd memoryctl -c"
    last = "SELECT coalesce(max(id), 0) FROM maintenance_runs"
    before = int(hosts["node1"].check_output(f'{psql} "{last}"'))
    recent = (
        "SELECT id, command, status, coalesce(details->'steps', 'null') FROM maintenance_runs"
        " WHERE trigger = 'cron' AND status <> 'running' ORDER BY id DESC LIMIT 50"
    )
    assert "/bin/memoryctl nightly" not in hosts["node1"].file("/etc/cron.d/memoryctl").content_string
    t0 = time.monotonic()
    for host in hosts.values():
        lines = host.file("/etc/cron.d/memoryctl").content_string.splitlines()
        every_minute = [
            re.sub(r"^(\S+\s+){5}", "* * * * * ", line) if "/bin/memoryctl " in line else line for line in lines
        ]
        host.run("cat > /etc/cron.d/memoryctl-e2e <<'EOF'\n" + "\n".join(every_minute) + "\nEOF")
    try:

        def finished() -> dict[str, tuple[str, str]] | None:
            out = hosts["node1"].check_output(f'{psql} "{recent}"')
            rows = [line.split("|", 3) for line in out.splitlines()]
            runs = {cmd: (status, steps) for run_id, cmd, status, steps in rows if int(run_id) > before}
            return runs if {"sync", "reconcile", "nightly"} <= runs.keys() else None

        runs = wait_for("a cron run of sync, reconcile and nightly", finished, timeout=600, interval=5)
    finally:
        for host in hosts.values():
            host.run("rm -f /etc/cron.d/memoryctl-e2e")
    record("e2e_cron", {"seconds_until_all_three_ran": round(time.monotonic() - t0, 1), "runs": runs})
    assert {cmd: status for cmd, (status, _) in runs.items()} == {"sync": "ok", "reconcile": "ok", "nightly": "ok"}
    steps = {step["name"]: step for step in json.loads(runs["nightly"][1])}
    # The embedding slots are deployed (issue 28 item 3), so the step looks at the data: no recall of
    # this data set was marked useful, nothing to train on (test_nightly_stack.py trains it).
    embedding = steps["embedding"]
    assert embedding["status"] == "skipped" and "examples (minimum" in embedding["reason"], embedding
    # The data set has no dialogue turns: nothing to train the generation adapter on (tests/deploy/
    # test_nightly_stack.py trains it), said in the record.
    assert steps["generation"]["status"] == "skipped" and steps["generation"]["reason"], steps["generation"]
    assert steps["reembed"]["status"] == "ok" and steps["reconcile"]["status"] == "ok"
    # What cron saw: the jobs' own logs (their human output, stderr included) hold no traceback. The
    # run records above say "ok" even when printing the report fails afterwards (it did: a KeyError
    # in the nightly's table, exit 1 every night, unseen until the logs were read).
    logs = hosts["node1"].check_output("tail -n 400 /var/log/memoryctl/sync.log /var/log/memoryctl/reconcile.log")
    logs += hosts["node3"].check_output("tail -n 400 /var/log/memoryctl/nightly.log")
    assert "Traceback" not in logs, logs[-3000:]
    assert "nightly: ok" in logs, logs[-3000:]
    for name, job in (("node1", "sync"), ("node1", "reconcile"), ("node3", "nightly")):
        assert hosts[name].file(f"/var/log/memoryctl/{job}.log").size > 0
