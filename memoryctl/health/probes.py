"""``memoryctl health``: every component probed in parallel, each under its own deadline.

A hung store must not hang the command: probes run in daemon threads and whatever has not
answered by the deadline is reported ``timeout`` (the thread is abandoned, the process exits).
Status per component: ``ok``, ``degraded`` (answers, but something needs attention), ``down``,
``timeout``, ``disabled`` (not configured). Overall: unhealthy (exit 1) when PostgreSQL — the
source of truth — is down or does not answer in time; degraded (exit 3) when it answers degraded
(a failing TimescaleDB job, no synchronous standby, ...) or any other configured component is not ok.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from memoryctl._version import __version__
from memoryctl.config import revealed
from memoryctl.deadline import Call, deadline_in
from memoryctl.errors import ExitCode, MemoryctlError
from memoryctl.health.alerting import alerting_probe
from memoryctl.health.nightly import nightly_probe
from memoryctl.health.postgres import (
    cluster_status,
    pending_restart_note,
    read_pending_restart,
    read_replication,
    server_address,
)
from memoryctl.stack import Stack
from memoryctl.stores import names
from memoryctl.stores.pg import pg_errors
from memoryctl.stores.schema import TimescaleStatus, latest_version, schema_state, timescale_status
from memoryctl.wgstatus import PUBLIC_FIELDS, STALE_AFTER_S, PeerStatus, parse_public

if TYPE_CHECKING:
    from memoryctl.stores.qdrant_rest import QdrantRest

PROBE_TIMEOUT_S = 1.2  # one HTTP request of a probe (health's budget is ~2 s for every component)

Probe = Callable[[], dict[str, Any]]


@dataclass(slots=True)
class HealthReport:
    components: dict[str, dict[str, Any]] = field(default_factory=dict)
    checked_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    seconds: float = 0.0

    @property
    def status(self) -> str:
        pg = self.components.get(names.POSTGRES, {}).get("status")
        if pg not in ("ok", "degraded"):
            return "unhealthy"
        bad = [c for c in self.components.values() if c["status"] not in ("ok", "disabled")]
        return "degraded" if bad else "healthy"

    @property
    def exit_code(self) -> int:
        return {"healthy": ExitCode.OK, "degraded": ExitCode.PARTIAL}.get(self.status, ExitCode.FAILURE)

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "version": __version__,
            "checked_at": self.checked_at.isoformat(),
            "seconds": round(self.seconds, 3),
            "components": self.components,
        }


def run_probes(probes: dict[str, Probe], deadline_s: float) -> HealthReport:
    """Every probe at once, each in a daemon thread; one that has not answered by the deadline is
    reported as timed out (and goes on in its thread)."""
    report = HealthReport()
    started = time.perf_counter()

    def call(probe: Probe) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            res = probe()
            res.setdefault("status", "ok")
        except MemoryctlError as exc:
            res = {"status": "down", "error": exc.message}
        except Exception as exc:  # a probe must never take the command down
            res = {"status": "down", "error": f"{type(exc).__name__}: {exc}"}
        res["latency_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        return res

    deadline = deadline_in(deadline_s)
    running = [(n, Call(partial(call, p), name=f"probe-{n}")) for n, p in probes.items()]
    for name, probe in running:
        answered = probe.wait_until(deadline) and probe.error is None
        report.components[name] = (
            probe.outcome()
            if answered
            else {
                "status": "timeout",
                "error": f"no answer within {deadline_s:.1f}s",
                "latency_ms": round(deadline_s * 1000, 1),
            }
        )
    report.seconds = time.perf_counter() - started
    return report


def _age_s(ts: Any) -> float | None:
    return round((datetime.now(UTC) - ts).total_seconds(), 1) if isinstance(ts, datetime) else None


def postgres_probe(stack: Stack) -> dict[str, Any]:
    pool = stack.pool
    pg = stack.settings.postgres
    # A replicated cluster is configured: read who leads and who follows, on the same connection.
    replicated = stack.settings.profile != "embedded" and len(pg.hosts) >= 2
    with pg_errors(), pool.connection() as conn:
        version = conn.execute("SHOW server_version").fetchone()
        ts = timescale_status(conn)
        count = conn.execute("SELECT count(*) AS n FROM memories WHERE deleted_at IS NULL").fetchone()
        jobs = timescale_jobs(conn) if ts.installed else []
        replication = read_replication(conn) if replicated else None
        pending = read_pending_restart(conn)
        server = server_address(conn)
    schema = schema_state(pool)
    applied = max((r["version"] for r in schema), default=0)
    path = next((r["variant"] for r in schema if r["version"] == 2), None)
    res: dict[str, Any] = {
        "version": version["server_version"] if version else None,
        "timescaledb": ts.installed,
        "timescaledb_available": ts.available,
        "timescaledb_preloaded": ts.preloaded,
        "timescale_policies": jobs,
        "schema_version": applied,
        "schema_path": path,
        "memories": count["n"] if count else None,
        "profile": stack.settings.profile,
        "pending_restart": pending,
    }
    problems = timescale_problems(ts, path, jobs)
    if applied < latest_version():
        problems.insert(0, f"schema at {applied}, {latest_version()} available: run `memoryctl init`")
    if replication is not None:
        cluster = cluster_status(*replication, members=pg.hosts, max_lag_bytes=pg.max_replication_lag_bytes)
        res["cluster"] = cluster
        if cluster["problems"]:
            problems.insert(0, "PostgreSQL cluster: " + "; ".join(cluster["problems"]))
    notes = [pending_restart_note(pending, server)] if pending else []
    if problems:
        res.update(status="degraded", error="; ".join(problems))
    elif path == "plain" and ts.available and not ts.preloaded:
        notes.append(
            "TimescaleDB is installed but not in shared_preload_libraries: this database uses the plain tables"
        )
    if notes:
        res["note"] = "; ".join(notes)
    return res


def timescale_jobs(conn: Any) -> list[dict[str, Any]]:
    """TimescaleDB's background jobs in this database, with their last outcome and error."""
    return list(
        conn.execute(
            "SELECT j.job_id, j.proc_name, j.hypertable_name, j.schedule_interval::text AS schedule,"
            " j.config, st.last_run_status, st.total_runs, st.total_failures,"
            # -infinity until a job first succeeds: not a datetime Python can hold
            " CASE WHEN isfinite(st.last_successful_finish) THEN st.last_successful_finish END AS last_success,"
            " (SELECT e.err_message FROM timescaledb_information.job_errors e WHERE e.job_id = j.job_id"
            "  ORDER BY e.finish_time DESC LIMIT 1) AS last_error"
            " FROM timescaledb_information.jobs j"
            " LEFT JOIN timescaledb_information.job_stats st USING (job_id) ORDER BY j.job_id"
        )
    )


def timescale_problems(ts: TimescaleStatus, path: str | None, jobs: list[dict[str, Any]]) -> list[str]:
    """What needs an operator: the Timescale schema without the extension, or failing jobs.

    A job's last run failing is the symptom that matters: on PostgreSQL 15.20 every TimescaleDB
    2.28 background job fails (``cannot drop portal``) while the database otherwise looks fine, so
    compression, retention and the stats aggregate silently stop (see the artefacts' README).
    """
    problems = []
    if path == "timescale" and not (ts.installed and ts.preloaded):
        problems.append("the schema uses TimescaleDB but the extension is not loaded (shared_preload_libraries)")
    for job in jobs:
        if job["last_run_status"] == "Failed":
            problems.append(
                f"TimescaleDB job {job['job_id']} ({job['proc_name']}"
                f"{' on ' + job['hypertable_name'] if job['hypertable_name'] else ''}) failed:"
                f" {job['last_error'] or 'no error recorded'}"
            )
    return problems


def vector_probe(stack: Stack) -> dict[str, Any]:
    store = stack.require_vectors()
    res = store.ping()
    active = store.active_model()
    res["active_model"] = active.model_id if active else None
    res["embedder_model"] = stack.embedder.info.model_id
    if active is not None:
        res["points"] = store.count(model_id=active.model_id)
    if active is None or active.model_id != stack.embedder.info.model_id:
        res.update(status="degraded", error="the active collection was not built by the configured embedder")
    res.update(_model_registry(stack))
    return res


def qdrant_rest_probe(stack: Stack) -> dict[str, Any]:
    """The Qdrant server probe over its REST API (``stores.qdrant_rest``), without qdrant-client,
    whose import alone can take longer than the probe's budget."""
    from memoryctl.stores.qdrant_rest import QdrantRest

    qs = stack.settings.qdrant
    assert qs.url is not None
    key = revealed(qs.api_key)
    try:
        with QdrantRest(qs.url, api_key=key, timeout_s=min(qs.timeout_s, 1.5)) as rest:
            res, active_model = _qdrant_status(rest, qs.alias)
    except MemoryctlError as exc:
        return {"status": "down", "error": f"{qs.url}: {exc.message}"[:300]}
    if "error" in res:
        return res
    res["active_model"] = active_model
    res["embedder_model"] = stack.embedder.info.model_id
    cluster = res.get("cluster") or {}
    if not res["ready"]:
        res.update(status="degraded", error="Qdrant answers but /readyz is not ready")
    elif cluster.get("problems"):
        res.update(status="degraded", error="Qdrant cluster: " + "; ".join(cluster["problems"]))
    elif active_model is None or active_model != res["embedder_model"]:
        res.update(status="degraded", error="the active collection was not built by the configured embedder")
    res.update(_model_registry(stack))
    return res


def _qdrant_status(rest: QdrantRest, alias: str) -> tuple[dict[str, Any], str | None]:
    root = rest.get("/")
    if root.status_code in (401, 403):
        return {"status": "down", "error": "Qdrant refused the API key (qdrant.api_key)"}, None
    ready = rest.get("/readyz")
    aliases = rest.result("/aliases")["aliases"]
    res: dict[str, Any] = {
        "engine": "qdrant",
        "location": rest.url,
        "version": root.json().get("version"),
        "ready": ready.status_code == 200,
        "alias": alias,
    }
    target = next((a["collection_name"] for a in aliases if a.get("alias_name") == alias), None)
    res["collection"] = target
    active_model = None
    if target is not None:
        info = rest.result(f"/collections/{target}")
        meta = (info.get("config") or {}).get("metadata") or {}
        active_model = meta.get("model_id")
        res.update(
            model_id=active_model,
            dim=meta.get("dim"),
            points=info.get("points_count"),
            collection_status=info.get("status"),
        )
    peers = rest.result("/cluster")
    if peers.get("status") == "enabled":
        shards = rest.result(f"/collections/{target}/cluster") if target else None
        res["cluster"] = qdrant_cluster_status(peers, shards, time.time())
    return res, active_model


CLUSTER_FAILURE_WINDOW_S = 30.0  # a peer that failed a message this recently counts as unreachable


def qdrant_cluster_status(peers: dict[str, Any], shards: dict[str, Any] | None, now: float) -> dict[str, Any]:
    """A Qdrant cluster's state from one peer's ``GET /cluster`` and ``/collections/{c}/cluster``.

    Every replica of every shard (this peer's and the others') with its state; a replica that is
    not ``Active``, a shard transfer under way, a consensus thread that is not ``working`` or a peer
    this one failed to reach in the last 30 s is a problem: answers may still be complete (another
    replica serves them), but the cluster is not at full strength.
    """
    raft = peers.get("raft_info") or {}
    consensus = (peers.get("consensus_thread_status") or {}).get("consensus_thread_status")
    unreachable = sorted(
        uri
        for uri, failure in (peers.get("message_send_failures") or {}).items()
        if _epoch(failure.get("latest_error_timestamp")) > now - CLUSTER_FAILURE_WINDOW_S
    )
    out: dict[str, Any] = {
        "peers": len(peers.get("peers") or {}),
        "this_peer": peers.get("peer_id"),
        "leader": raft.get("leader"),
        "role": raft.get("role"),
        "term": raft.get("term"),
        "commit": raft.get("commit"),
        "pending_operations": raft.get("pending_operations"),
        "consensus": consensus,
        "unreachable": unreachable,
    }
    problems = [f"consensus thread {consensus}"] if consensus != "working" else []
    problems += [f"peer {uri} unreachable" for uri in unreachable]
    if shards is not None:
        own = [(r["shard_id"], shards.get("peer_id"), r["state"]) for r in shards.get("local_shards", [])]
        others = [(r["shard_id"], r["peer_id"], r["state"]) for r in shards.get("remote_shards", [])]
        replicas = sorted(own + others, key=lambda r: (r[0], str(r[1])))
        out["shards"] = shards.get("shard_count")
        out["replicas"] = [{"shard": shard, "peer": peer, "state": state} for shard, peer, state in replicas]
        out["transfers"] = len(shards.get("shard_transfers") or [])
        problems += [
            f"shard {shard} replica on peer {peer} is {state}" for shard, peer, state in replicas if state != "Active"
        ]
        if out["transfers"]:
            problems.append(f"{out['transfers']} shard transfer(s) under way")
    out["problems"] = problems
    return out


def _epoch(timestamp: Any) -> float:
    try:
        return datetime.fromisoformat(str(timestamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _model_registry(stack: Stack) -> dict[str, Any]:
    """PostgreSQL's count next to the point count, the recorded active model, an unfinished migration."""
    from memoryctl.maintenance.pgstate import OpsState

    out: dict[str, Any] = {}
    if "pool" not in stack.__dict__:  # PostgreSQL not open (yet, or down): its probe reports that
        return out
    try:
        out["postgres_memories"] = stack.records.count(include_deleted=True)
        state = OpsState(stack.pool)
        recorded = state.active_embedding()
        out["recorded_model"] = recorded["model_id"] if recorded else None
        config_model = stack.settings.embedder.model
        if recorded and stack.settings.embedder.kind != (recorded["manifest"].get("embedder") or {}).get("kind"):
            out["config_note"] = (
                f"[embedder] in the config ({stack.settings.embedder.kind}{':' + config_model if config_model else ''})"
                f" differs from the model `migrate` activated ({recorded['model_id']}), which is the one used"
            )
        mig = state.any_open_migration()
        if mig is not None:
            out["migration"] = {
                "target": mig["target_model"],
                "status": mig["status"],
                "copied": mig["copied"],
                "age_s": _age_s(mig["started_at"]),
            }
    except MemoryctlError as exc:  # schema older than 0003: nothing recorded yet
        out["recorded_model"] = None
        out["registry_error"] = exc.message
    return out


def wireguard_probe() -> dict[str, Any]:
    """Last handshake age of every WireGuard peer on this node.

    From the public fields of ``wg show`` (interfaces, handshakes, endpoints, allowed ips,
    transfer), never ``dump``, which prints the private and preshared keys. ``wg`` needs root:
    another user (cron's and memoryctl serve's ``memoryctl``) runs exactly these commands through
    ``sudo -n``, which the deploy allows and nothing more.
    """
    import os
    import shutil
    import subprocess

    wg = shutil.which("wg")
    if wg is None:
        return {"status": "disabled", "detail": "wg not installed (not a cluster node)"}
    command = [wg, "show"] if os.geteuid() == 0 else ["sudo", "-n", wg, "show"]
    outputs: dict[str, str] = {}
    for what in ("interfaces", *PUBLIC_FIELDS):
        args = [*command, what] if what == "interfaces" else [*command, "all", what]
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=1.0, check=False)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "error": f"`{' '.join(args)}` did not answer within 1 s"}
        if proc.returncode != 0:
            error = proc.stderr.strip() or f"`{' '.join(args)}` exited {proc.returncode}"
            return {"status": "down", "error": error[:300]}
        outputs[what] = proc.stdout
    interfaces, peers = wireguard_peers(parse_public(outputs), time.time())
    if not interfaces:
        return {"status": "disabled", "detail": "no WireGuard interface is up"}
    stale = [p for p in peers if not p["up"]]
    res: dict[str, Any] = {"interfaces": interfaces, "peers": peers}
    if stale:
        res.update(status="degraded", error=f"{len(stale)} peer(s) without a handshake in {STALE_AFTER_S} s")
    return res


def wireguard_peers(
    interfaces: Mapping[str, Sequence[PeerStatus]], now: float
) -> tuple[list[str], list[dict[str, Any]]]:
    """Interfaces and peers (handshake ages, up or stale), as health reports them."""
    peers = [
        {
            "interface": name,
            "peer": p.public_key[:10] + "…",
            "endpoint": p.endpoint,
            "allowed_ips": ",".join(p.allowed_ips),
            "handshake_age_s": None if (age := p.handshake_age(now)) is None else round(age, 1),
            "up": p.is_up(now),
        }
        for name, status in interfaces.items()
        for p in status
    ]
    return list(interfaces), peers


def vllm_probe(stack: Stack) -> dict[str, Any]:
    """vLLM's ``/health`` and ``/v1/models``: the base model and the LoRA adapters it has loaded.
    One attempt each within the probe's budget (``memoryctl.vllm``, retries off)."""
    from memoryctl.http_service import Retry
    from memoryctl.vllm import VLLMClient

    vs = stack.settings.vllm
    if not vs.url:
        return {"status": "disabled", "detail": "[vllm] url is not configured"}
    key = revealed(vs.api_key)
    with VLLMClient(vs.url, api_key=key, timeout_s=PROBE_TIMEOUT_S, retry=Retry(retries=0)) as client:
        try:
            healthy = client.health()
            models = client.models()
        except MemoryctlError as exc:
            return {"status": "down", "error": exc.message[:300]}
    if not healthy:
        return {"status": "down", "error": f"{client.url}/health did not answer 200"}
    bases = [m.id for m in models.base]
    adapters = [{"id": a.id, "base": a.parent} for a in models.adapters]
    res: dict[str, Any] = {"url": client.url, "models": bases, "lora_adapters": adapters}
    if vs.model not in bases:
        res.update(status="degraded", error=f"configured model {vs.model!r} is not served (serving {bases})")
    return res


def graph_probe(stack: Stack) -> dict[str, Any]:
    store = stack.require_graph()
    res = store.ping()
    res["memories"] = store.count()
    return res


def outbox_probe(stack: Stack) -> dict[str, Any]:
    stats = stack.records.outbox_stats()
    res: dict[str, Any] = {
        t: {
            "pending": s["pending"],
            "oldest_age_s": _age_s(s["oldest"]),
            "last_error": s["last_error"],
            "set_aside": s["set_aside"],
            "set_aside_error": s["set_aside_error"],
        }
        for t, s in stats.items()
    }
    oldest = max((v["oldest_age_s"] or 0.0) for v in res.values())
    aside = {t: v for t, v in res.items() if v["set_aside"]}
    if aside:
        first = next(iter(aside.values()))["set_aside_error"]
        counts = ", ".join(f"{t} {v['set_aside']}" for t, v in aside.items())
        res.update(
            status="degraded",
            error=f"outbox rows set aside after errors ({counts}; e.g. {first}): `memoryctl outbox list`",
        )
    elif oldest > 900:
        res.update(status="degraded", error=f"outbox entries waiting {oldest:.0f}s: is `memoryctl sync` running?")
    return res


def runs_probe(stack: Stack) -> dict[str, Any]:
    last = stack.runs.last_per_command()
    res: dict[str, Any] = {
        cmd: {
            "status": r["status"],
            "started_at": r["started_at"].isoformat(),
            "age_s": _age_s(r["started_at"]),
            "error": r["error"],
            # reconcile's findings feed memoryctl_reconcile_drift (memoryctl.health.exposition)
            **({"counts": r["counts"]} if cmd == "reconcile" else {}),
        }
        for cmd, r in last.items()
    }
    failed = [c for c, r in last.items() if r["status"] == "failed"]
    out: dict[str, Any] = {"last": res}
    if failed:
        out.update(status="degraded", error="last run failed: " + ", ".join(sorted(failed)))
    return out


def default_probes(stack: Stack) -> dict[str, Probe]:
    probes: dict[str, Probe] = {
        names.POSTGRES: lambda: postgres_probe(stack),
        names.QDRANT: (lambda: qdrant_rest_probe(stack))
        if stack.settings.qdrant.url and stack.settings.profile == "cluster"
        else (lambda: vector_probe(stack)),
        stack.store_names["graph"]: lambda: graph_probe(stack),
        "outbox": lambda: outbox_probe(stack),
        "runs": lambda: runs_probe(stack),
        "nightly": lambda: nightly_probe(stack, timeout_s=PROBE_TIMEOUT_S),
        "vllm": lambda: vllm_probe(stack),
        "wireguard": wireguard_probe,
        "alerting": lambda: alerting_probe(stack.settings, timeout_s=PROBE_TIMEOUT_S),
    }
    return probes


def check(stack: Stack, *, deadline_s: float = 1.8) -> HealthReport:
    if stack.settings.profile == "embedded":
        # In-process engines cannot hang on a network; starting them (PostgreSQL from the wheel,
        # opening Qdrant Edge shards) is this process's start-up, not the stores' latency.
        with contextlib.suppress(MemoryctlError):
            stack.pool  # noqa: B018 - starts the embedded server
            stack.vectors()
            stack.graph()
    return run_probes(default_probes(stack), deadline_s)
