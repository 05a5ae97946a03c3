"""``memoryctl health``: every component probed in parallel, each under its own deadline.

A hung store must not hang the command: probes run in daemon threads and whatever has not
answered by the deadline is reported ``timeout`` (the thread is abandoned, the process exits).
Status per component: ``ok``, ``degraded`` (answers, but something needs attention), ``down``,
``timeout``, ``disabled`` (not configured). Overall: unhealthy (exit 1) when PostgreSQL — the
source of truth — is not ok; degraded (exit 3) when any other configured component is not ok.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from memoryctl._version import __version__
from memoryctl.errors import ExitCode, MemoryctlError
from memoryctl.stack import Stack
from memoryctl.stores.pg import pg_errors
from memoryctl.stores.schema import latest_version, schema_state

Probe = Callable[[], dict[str, Any]]


@dataclass(slots=True)
class HealthReport:
    components: dict[str, dict[str, Any]] = field(default_factory=dict)
    checked_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    seconds: float = 0.0

    @property
    def status(self) -> str:
        pg = self.components.get("postgres", {}).get("status")
        if pg != "ok":
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
    report = HealthReport()
    results: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()

    def call(name: str, probe: Probe) -> None:
        t0 = time.perf_counter()
        try:
            res = probe()
            res.setdefault("status", "ok")
        except MemoryctlError as exc:
            res = {"status": "down", "error": exc.message}
        except Exception as exc:  # a probe must never take the command down
            res = {"status": "down", "error": f"{type(exc).__name__}: {exc}"}
        res["latency_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        results[name] = res

    threads = {n: threading.Thread(target=call, args=(n, p), daemon=True, name=f"probe-{n}") for n, p in probes.items()}
    for t in threads.values():
        t.start()
    for name, t in threads.items():
        t.join(max(0.0, deadline_s - (time.perf_counter() - started)))
        report.components[name] = results.get(name) or {
            "status": "timeout",
            "error": f"no answer within {deadline_s:.1f}s",
            "latency_ms": round(deadline_s * 1000, 1),
        }
    report.seconds = time.perf_counter() - started
    return report


def _age_s(ts: Any) -> float | None:
    return round((datetime.now(UTC) - ts).total_seconds(), 1) if isinstance(ts, datetime) else None


def postgres_probe(stack: Stack) -> dict[str, Any]:
    pool = stack.pool
    with pg_errors(), pool.connection() as conn:
        version = conn.execute("SHOW server_version").fetchone()
        ts = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'timescaledb'").fetchone()
        count = conn.execute("SELECT count(*) AS n FROM memories WHERE deleted_at IS NULL").fetchone()
        policies: list[dict[str, Any]] = []
        if ts:
            policies = list(
                conn.execute(
                    "SELECT proc_name, hypertable_name, schedule_interval::text FROM timescaledb_information.jobs"
                )
            )
    schema = schema_state(pool)
    applied = max((r["version"] for r in schema), default=0)
    res: dict[str, Any] = {
        "version": version["server_version"] if version else None,
        "timescaledb": ts["extversion"] if ts else None,
        "timescale_policies": policies,
        "schema_version": applied,
        "schema_path": next((r["variant"] for r in schema if r["version"] == 2), None),
        "memories": count["n"] if count else None,
        "profile": stack.settings.profile,
    }
    if applied < latest_version():
        res.update(status="degraded", error=f"schema at {applied}, {latest_version()} available: run `memoryctl init`")
    return res


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
    return res


def graph_probe(stack: Stack) -> dict[str, Any]:
    store = stack.require_graph()
    res = store.ping()
    res["memories"] = store.count()
    return res


def outbox_probe(stack: Stack) -> dict[str, Any]:
    stats = stack.records.outbox_stats()
    res: dict[str, Any] = {
        t: {"pending": s["pending"], "oldest_age_s": _age_s(s["oldest"]), "last_error": s["last_error"]}
        for t, s in stats.items()
    }
    oldest = max((v["oldest_age_s"] or 0.0) for v in res.values())
    if oldest > 900:
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
        "postgres": lambda: postgres_probe(stack),
        "qdrant": lambda: vector_probe(stack),
        stack.store_names["graph"]: lambda: graph_probe(stack),
        "outbox": lambda: outbox_probe(stack),
        "runs": lambda: runs_probe(stack),
    }
    return probes


def check(stack: Stack, *, deadline_s: float = 1.8) -> HealthReport:
    return run_probes(default_probes(stack), deadline_s)


def prometheus(report: HealthReport) -> str:
    """Text exposition format for node_exporter's textfile collector."""
    lines = [
        "# HELP memoryctl_up 1 if the component answered ok.",
        "# TYPE memoryctl_up gauge",
    ]
    for name, comp in sorted(report.components.items()):
        lines.append(f'memoryctl_up{{component="{name}"}} {1 if comp["status"] in ("ok", "disabled") else 0}')
    lines += ["# HELP memoryctl_probe_latency_seconds Probe latency.", "# TYPE memoryctl_probe_latency_seconds gauge"]
    for name, comp in sorted(report.components.items()):
        lines.append(f'memoryctl_probe_latency_seconds{{component="{name}"}} {comp["latency_ms"] / 1000:.4f}')
    outbox = report.components.get("outbox", {})
    lines += ["# HELP memoryctl_outbox_pending Outbox rows awaiting delivery.", "# TYPE memoryctl_outbox_pending gauge"]
    for target in ("vector", "graph"):
        if isinstance(outbox.get(target), dict):
            lines.append(f'memoryctl_outbox_pending{{target="{target}"}} {outbox[target]["pending"]}')
    lines += [
        "# HELP memoryctl_healthy 1 healthy, 0 otherwise.",
        "# TYPE memoryctl_healthy gauge",
        f"memoryctl_healthy {1 if report.status == 'healthy' else 0}",
    ]
    return "\n".join(lines) + "\n"
