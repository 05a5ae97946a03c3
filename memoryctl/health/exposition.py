"""The Prometheus text format, written once: ``Exposition`` (families of gauges, HELP and TYPE once
per family, label values escaped) writes ``memoryctl health --prometheus``'s file
(``prometheus(report)``) and ``memoryctl backup status --prometheus``'s (``backup.status``), both
read by node_exporter's textfile collector.

The alert rules (templates/prometheus/memoryctl.rules.yml) are written against these names:
``memoryctl_up`` / ``memoryctl_degraded`` / ``memoryctl_probe_latency_seconds`` per component,
``memoryctl_healthy``, ``memoryctl_outbox_pending``, ``memoryctl_outbox_oldest_age_seconds``,
``memoryctl_outbox_set_aside`` (rows delivery set aside after they failed alone),
``memoryctl_last_run_timestamp_seconds`` / ``memoryctl_last_run_success`` per maintenance command,
``memoryctl_reconcile_drift`` per store (what the last reconcile found and did not repair), and
backup status's ``memoryctl_backup_*`` family. With a replicated PostgreSQL (``[postgres] hosts``,
2+ members) also ``memoryctl_postgres_sync_standbys``, ``memoryctl_postgres_replication_lag_bytes``
per standby and ``memoryctl_postgres_timeline`` (it goes up at every promotion: a failover or
switchover); a single server gives none of the three.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memoryctl.health.probes import HealthReport


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Exposition:
    """Families of gauges in the text format, HELP/TYPE once per family."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.name = ""

    def family(self, name: str, help_text: str) -> None:
        self.name = name
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]

    def sample(self, labels: dict[str, str], value: float, *, digits: int = 3) -> None:
        """One sample of the current family: an int as it is, a float with ``digits`` decimals."""
        rendered = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        number = f"{value:.{digits}f}" if isinstance(value, float) else str(value)
        self.lines.append(f"{self.name}{{{rendered}}} {number}" if rendered else f"{self.name} {number}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _unrepaired(counts: dict[str, Any]) -> dict[str, int]:
    """Per store: orphan + missing + stale findings of a reconcile run, minus what it repaired."""
    stores = {key.rsplit("_", 1)[0] for key in counts if key.endswith("_scanned") and key != "postgres_scanned"}
    return {
        store: max(
            0,
            sum(int(counts.get(f"{store}_{c}", 0)) for c in ("orphan", "missing", "stale"))
            - int(counts.get(f"{store}_repaired", 0)),
        )
        for store in sorted(stores)
    }


def health_metrics(components: dict[str, dict[str, Any]]) -> list[str]:
    """The lines of the families the alert rules read from the components (``_components``)."""
    out = Exposition()
    _components(out, components)
    return out.lines


def _components(out: Exposition, components: dict[str, dict[str, Any]]) -> None:
    """The outbox's age and set-aside rows, the last runs, reconcile's drift, a PostgreSQL cluster."""
    outbox = components.get("outbox", {})
    out.family("memoryctl_outbox_oldest_age_seconds", "Age of the oldest undelivered outbox entry (0: none).")
    for target in ("vector", "graph"):
        if isinstance(outbox.get(target), dict):
            out.sample({"target": target}, float(outbox[target].get("oldest_age_s") or 0.0))
    out.family("memoryctl_outbox_set_aside", "Outbox rows set aside after failing alone (memoryctl outbox list).")
    for target in ("vector", "graph"):
        if isinstance(outbox.get(target), dict):
            out.sample({"target": target}, int(outbox[target].get("set_aside") or 0))
    last = components.get("runs", {}).get("last", {})
    out.family("memoryctl_last_run_timestamp_seconds", "Start of the last run of each maintenance command.")
    for command, run in sorted(last.items()):
        out.sample({"command": command}, datetime.fromisoformat(run["started_at"]).timestamp())
    out.family("memoryctl_last_run_success", "1 if the last run of the command did not fail.")
    for command, run in sorted(last.items()):
        out.sample({"command": command}, 0 if run["status"] == "failed" else 1)
    reconcile = last.get("reconcile")
    out.family("memoryctl_reconcile_drift", "Findings of the last reconcile left unrepaired, per store.")
    if reconcile is not None and isinstance(reconcile.get("counts"), dict):
        for store, drift in _unrepaired(reconcile["counts"]).items():
            out.sample({"store": store}, drift)
    cluster = components.get("postgres", {}).get("cluster")
    if isinstance(cluster, dict):
        _postgres_cluster(out, cluster)


def _postgres_cluster(out: Exposition, cluster: dict[str, Any]) -> None:
    from memoryctl.health.postgres import SYNCHRONOUS

    standbys = cluster.get("standbys") or []
    out.family("memoryctl_postgres_sync_standbys", "Standbys streaming in sync or quorum state (0: no sync standby).")
    out.sample({}, sum(1 for s in standbys if s.get("state") == "streaming" and s.get("sync_state") in SYNCHRONOUS))
    out.family("memoryctl_postgres_replication_lag_bytes", "WAL bytes a standby has still to replay.")
    for s in standbys:
        if s.get("lag_bytes") is not None:
            out.sample({"standby": str(s.get("name") or s.get("address"))}, int(s["lag_bytes"]))
    out.family("memoryctl_postgres_timeline", "The primary's timeline (goes up at every promotion).")
    if cluster.get("timeline") is not None:
        out.sample({}, int(cluster["timeline"]))


def prometheus(report: HealthReport) -> str:
    """``memoryctl health --prometheus``: the file node_exporter's textfile collector reads."""
    out = Exposition()
    components = sorted(report.components.items())
    out.family("memoryctl_up", "1 if the component answered ok.")
    for name, comp in components:
        out.sample({"component": name}, 1 if comp["status"] in ("ok", "disabled") else 0)
    # Degraded is not down: a PostgreSQL without its synchronous standby, a Qdrant cluster missing a
    # peer still serve every request. The alerts tell the two apart (StoreUnreachableFromMemoryctl
    # is for a store memoryctl cannot use; the store's own alerts say what is degraded).
    out.family("memoryctl_degraded", "1 if the component answered degraded.")
    for name, comp in components:
        out.sample({"component": name}, 1 if comp["status"] == "degraded" else 0)
    out.family("memoryctl_probe_latency_seconds", "Probe latency.")
    for name, comp in components:
        out.sample({"component": name}, comp["latency_ms"] / 1000, digits=4)
    outbox = report.components.get("outbox", {})
    out.family("memoryctl_outbox_pending", "Outbox rows awaiting delivery.")
    for target in ("vector", "graph"):
        if isinstance(outbox.get(target), dict):
            out.sample({"target": target}, outbox[target]["pending"])
    _components(out, report.components)
    out.family("memoryctl_healthy", "1 healthy, 0 otherwise.")
    out.sample({}, 1 if report.status == "healthy" else 0)
    return out.text()
