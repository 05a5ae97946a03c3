"""Monitoring: Prometheus and Alertmanager on two nodes (a pair), exporters everywhere, all on the mesh.

- Every node: ``prometheus-node-exporter`` (Debian) on its mesh address, with the textfile
  collector; cron jobs write each WireGuard peer's latest handshake there (node_exporter has no
  WireGuard collector), whether a server runs a replaced executable or the node waits for a
  reboot (an upgrade under a running PostgreSQL, etcd, Patroni or Qdrant; ``/run/reboot-required``),
  and, where PostgreSQL archives WAL, the archive queue's bytes and limit.
- The ``db`` node: ``prometheus-postgres-exporter`` (peer-authenticated as a ``prometheus`` role in
  ``pg_monitor``), and memoryctl's own metrics through the textfile collector: ``memoryctl health
  --prometheus`` every minute and ``memoryctl backup status --prometheus`` every five. A textfile
  rather than an endpoint: it works whether or not a memoryctl service is running, and a hung probe
  delays one file instead of failing the scrape (a stale file has its own alert).
- Every Qdrant peer: its ``/metrics``, scraped with the API key.
- The monitoring nodes (``components.monitoring.nodes``, :func:`deploy.opsnode.monitoring_nodes`:
  by default the first two without the gpu role): on each, ``prometheus`` and
  ``prometheus-alertmanager`` from Debian. Each Prometheus scrapes every target and evaluates every
  rule (``templates/prometheus/memoryctl.rules.yml``, each alert given a ``runbook_url``) and sends
  to every Alertmanager; the Alertmanagers form one cluster (their gossip on the mesh, port
  ``alertmanager-cluster``, admitted from the other monitoring node only), which deduplicates: one
  notification per alert whichever Prometheus sent it, and either node may die. Two Alertmanager
  receivers: ``operator`` (``components.monitoring.receiver``: email, webhook or both), which gets
  every alert, and ``heartbeat`` (``components.monitoring.heartbeat``), which gets only the
  always-firing ``Watchdog``: an outside service that pages when those pings stop is the one
  witness of both monitoring nodes dead. A cluster other than ``local``
  without either stops at plan time: an alert nobody receives is no alert.

Receiver secrets (SMTP password, bearer token, a URL carrying a token) live in the controller's
secret store; the inventory names the file (``auth_password_secret: alertmanager/smtp_password``),
never the value. Where Alertmanager reads a setting from a file (``auth_password_file``,
``credentials_file``, ``password_file``) the secret is uploaded as that file (0640 root:prometheus);
a URL has no such setting in Debian's Alertmanager, so ``url_secret`` is rendered into
alertmanager.yml, itself 0640 root:prometheus.

Ports (mesh only, firewalled to ``wg0``): 9100 node_exporter, 9187 postgres_exporter, 9090
Prometheus, 9093 Alertmanager, 9094 Alertmanager's gossip (TCP and UDP, from the peer only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from io import StringIO
from typing import Any

import yaml
from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server, systemd

from deploy import backup, embedding_slots, etcd, patroni, ports, vllm
from deploy.common import TEMPLATES, after_mesh, components, has_role, inventory, keep_running, secrets, template
from deploy.components import RUNBOOK_BASE, Monitoring
from deploy.facts import PostgresRoleNames
from deploy.opsnode import monitoring_nodes
from wireguard.keys import SecretDir

NODE_EXPORTER_PORT = ports.NODE_EXPORTER
POSTGRES_EXPORTER_PORT = ports.POSTGRES_EXPORTER
PROMETHEUS_PORT = ports.PROMETHEUS
ALERTMANAGER_PORT = ports.ALERTMANAGER
ALERTMANAGER_CLUSTER_PORT = ports.ALERTMANAGER_CLUSTER
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
WIREGUARD_SCRIPT = "/usr/local/sbin/memoryctl-wireguard-metrics"
RESTART_SCRIPT = "/usr/local/sbin/memoryctl-restart-metrics"
# Servers whose replaced executable shows as memoryctl_restart_pending{service}: by systemd unit
# (PostgreSQL's postmaster is found by name: under Patroni it is not a unit's main process).
RESTART_WATCHED = {"patroni": "patroni.service", "etcd": "etcd.service", "qdrant": "qdrant.service"}
WAL_SCRIPT = "/usr/local/sbin/memoryctl-wal-metrics"
GPU_SCRIPT = "/usr/local/sbin/memoryctl-gpu-metrics"
# Where there is no GPU (vllm.mode standin): nvidia-smi's query interface, STAND-IN (named so).
NVIDIA_SMI_STANDIN = "/usr/local/sbin/memoryctl-nvidia-smi-standin"
RULES_DIR = "/etc/prometheus/rules"
QDRANT_KEY_FILE = "/etc/prometheus/qdrant-api-key"
RECEIVER_SECRETS_DIR = "/etc/prometheus/alertmanager-secrets"
# A receiver setting given as ``<setting>_secret: <name in the secret store>`` -> the Alertmanager
# setting that reads it from a file. ``url`` has no file form in Debian's Alertmanager: inlined.
SECRET_FILE_SETTINGS = {
    "auth_password": "auth_password_file",
    "credentials": "credentials_file",
    "password": "password_file",
}
INLINE_SECRET_SETTINGS = ("url",)
# Settings that hold a secret: refused as literal values in the inventory.
LITERAL_SECRETS = frozenset(
    {"auth_password", "auth_secret", "credentials", "password", "bearer_token", "api_key", "routing_key", "service_key"}
)
PLACEHOLDER = "REPLACE-WITH-"
# memoryctl's textfile jobs on the db node: file name, command, schedule.
MEMORYCTL_JOBS = [
    {"name": "memoryctl-health", "command": "health", "schedule": "* * * * *"},
    {"name": "memoryctl-backup", "command": "backup status", "schedule": "*/5 * * * *"},
]


def enabled() -> bool:
    return components().monitoring.enabled


def monitor_nodes() -> list[str]:
    return monitoring_nodes(inventory(), components().monitoring.nodes)


def prometheus_urls() -> list[str]:
    """Every Prometheus, in the order ``memoryctl health`` asks them (the first that answers)."""
    return [f"http://{host.data.mesh_addresses[name]}:{PROMETHEUS_PORT}" for name in monitor_nodes()]


def duration_s(value: str) -> float:
    """A Prometheus duration as the inventory writes one (``90s``, ``1m``, ``1h30m``) in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w)", str(value))
    if not parts or "".join(n + u for n, u in parts) != str(value):
        raise ValueError(f"components.monitoring: {value!r} is not a duration like 90s, 1m or 1h30m")
    return float(sum(int(n) * units[u] for n, u in parts))


def memoryctl_alerting() -> dict[str, Any] | None:
    """``[alerting]`` of memoryctl.toml: the Prometheus ``memoryctl health`` asks whether alerts are
    delivered, and whether a dead-man's switch is there to be heard from (docs/monitoring.md)."""
    if not enabled():
        return None
    settings = components().monitoring
    return {
        "prometheus_url": prometheus_urls(),
        "heartbeat": bool(settings.heartbeat),
        "heartbeat_interval_s": duration_s(settings.heartbeat_interval),
    }


def qdrant_peers() -> list[str]:
    return inventory().qdrant_peers()


def vllm_targets() -> dict[str, dict[str, str]]:
    """Every vLLM instance's ``/metrics`` (not behind the API key, as in vLLM), by node: the
    ``generate`` instance and the embedding one on each gpu node, or on the node that runs the night
    with embedding slots, both slots (deploy/roles.py decides the same); ``rerank`` where it runs."""
    if vllm.mode() == "off":
        return {}
    cluster = inventory()
    gpu = cluster.group("gpu")
    found: dict[str, dict[str, str]] = {}
    for name in gpu:
        address = cluster.nodes[name]["mesh"]
        slots = embedding_slots.enabled() and name == gpu[0]
        embedding = dict(embedding_slots.SLOTS) if slots else {"embed": ports.VLLM_EMBED}
        rerank = {"rerank": ports.VLLM_RERANK} if vllm.rerank_served() else {}
        units = {"generate": ports.VLLM_GENERATE, **embedding, **rerank}
        found[name] = {unit: f"{address}:{port}" for unit, port in units.items()}
    return found


def etcd_targets() -> dict[str, str]:
    """Every etcd member's metrics listener (plain HTTP on the mesh, deploy/etcd.py), when etcd runs."""
    if not patroni.enabled():
        return {}
    mesh = {name: node["mesh"] for name, node in inventory().nodes.items()}
    return {name: f"{mesh[name]}:{etcd.METRICS_PORT}" for name in etcd.members()}


def mesh_ports() -> list[int]:
    """What this host serves over the mesh for monitoring (the firewall opens these on ``wg0``)."""
    if not enabled():
        return []
    ports = [NODE_EXPORTER_PORT]
    if has_role("db"):
        ports.append(POSTGRES_EXPORTER_PORT)
    if host.name in monitor_nodes():
        ports += [PROMETHEUS_PORT, ALERTMANAGER_PORT]
    return sorted(ports)


def gossip_peers() -> list[str]:
    """The mesh addresses of the other Alertmanagers of the cluster this host's one joins (none: a
    single instance, or not a monitoring node): the only sources the firewall admits to its gossip."""
    names = monitor_nodes()
    if not enabled() or host.name not in names:
        return []
    return [host.data.mesh_addresses[name] for name in names if name != host.name]


class MonitoringSettingsError(ValueError):
    """``components.monitoring`` that would leave alerts undelivered or put a secret in the inventory."""


@dataclass
class Receivers:
    """Alertmanager's two receivers as rendered, and the secret files they read (path -> content)."""

    operator: dict[str, Any]
    heartbeat: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)

    def yaml(self) -> str:
        """The ``receivers:`` list of alertmanager.yml."""
        listed = [{"name": "operator", **self.operator}, {"name": "heartbeat", **self.heartbeat}]
        return yaml.safe_dump({"receivers": listed}, default_flow_style=False, sort_keys=False).rstrip("\n")


def _sends(receiver: dict[str, Any]) -> bool:
    """Whether receiver settings name at least one integration (``email_configs``, ``webhook_configs`` ...)."""
    return any(key.endswith("_configs") and value for key, value in receiver.items())


def _secret(store: SecretDir, name: Any, where: str) -> str:
    """A receiver secret from the controller's store: issued by a mail provider or a heartbeat service,
    so never generated; a missing file stops the plan with its path."""
    if not isinstance(name, str) or not name or name.startswith("/") or ".." in name.split("/"):
        raise MonitoringSettingsError(f"{where}: name a file inside the secret store, e.g. alertmanager/smtp_password")
    path = store.path / name
    value = path.read_text().strip() if path.is_file() else ""
    if not value:
        raise MonitoringSettingsError(
            f"{where}: put the secret into {path} (mode 0600): it is issued by the receiving service, "
            "so the deploy cannot generate it (docs/monitoring.md)"
        )
    return value


def _resolve(value: Any, where: str, store: SecretDir, files: dict[str, str]) -> Any:
    """Receiver settings with ``<setting>_secret`` references resolved, literal secrets and
    ``REPLACE-WITH-`` placeholders refused (``where`` names the setting in errors)."""
    if isinstance(value, list):
        return [_resolve(item, f"{where}[{i}]", store, files) for i, item in enumerate(value)]
    if isinstance(value, str) and value.startswith(PLACEHOLDER):
        raise MonitoringSettingsError(f"{where}: {value!r} is a placeholder of the example inventory: fill it in")
    if not isinstance(value, dict):
        return value
    resolved: dict[str, Any] = {}
    for key, item in value.items():
        here = f"{where}.{key}"
        if key in LITERAL_SECRETS:
            raise MonitoringSettingsError(
                f"{here}: a secret does not belong in the inventory; put it into a file of the secret store "
                f"and name that file with {key}_secret (docs/monitoring.md)"
            )
        setting = key.removesuffix("_secret")
        if setting == key:
            resolved[key] = _resolve(item, here, store, files)
        elif setting in SECRET_FILE_SETTINGS:
            path = f"{RECEIVER_SECRETS_DIR}/{str(item).replace('/', '-')}"
            files[path] = _secret(store, item, here)
            resolved[SECRET_FILE_SETTINGS[setting]] = path
        elif setting in INLINE_SECRET_SETTINGS:
            resolved[setting] = _secret(store, item, here)
        else:
            known = sorted([*SECRET_FILE_SETTINGS, *INLINE_SECRET_SETTINGS])
            raise MonitoringSettingsError(f"{here}: no secret form for {setting!r}; known: {known}")
    return resolved


def receivers(settings: Monitoring, cluster: str, store: SecretDir) -> Receivers:
    """The operator's and the heartbeat's receiver from ``components.monitoring``, checked at plan time.

    Off the local nodes both are required: without the operator's, alerts fire into the void; without
    the heartbeat, a dead monitoring node is silent. The local nodes may go without (the deploy tests
    run a webhook for both)."""
    files: dict[str, str] = {}
    where = "components.monitoring.receiver"
    operator = _resolve(settings.receiver or {}, where, store, files)
    if "name" in operator:
        raise MonitoringSettingsError(f"{where}: give the receiver's settings without a name")
    if cluster != "local" and not _sends(operator):
        raise MonitoringSettingsError(
            f"{where}: cluster {cluster!r} has no receiver, so no alert would reach anyone; configure "
            "email_configs (SMTP), webhook_configs, or both (docs/monitoring.md)"
        )
    where = "components.monitoring.heartbeat"
    heartbeat = _resolve(settings.heartbeat or {}, where, store, files)
    unknown = set(heartbeat) - {"url"}
    if unknown:
        raise MonitoringSettingsError(f"{where}: unknown settings {sorted(unknown)}; give url_secret (or url)")
    if cluster != "local" and not heartbeat.get("url"):
        raise MonitoringSettingsError(
            f"{where}.url_secret: cluster {cluster!r} has no dead-man's switch, so a dead monitoring node "
            "would be silent; name the secret file holding a heartbeat service's ping URL (docs/monitoring.md)"
        )
    pings = {"webhook_configs": [{"url": heartbeat["url"], "send_resolved": False}]} if heartbeat else {}
    return Receivers(operator, pings, files)


def rules_text(runbook_base: str) -> str:
    """The rule file as Prometheus gets it: each alert's ``runbook_url`` (written in the file against
    the default base, so that ``promtool test rules`` checks it) pointing at ``runbook_base``."""
    text = (TEMPLATES / "prometheus" / "memoryctl.rules.yml").read_text()
    return text.replace(f'runbook_url: "{RUNBOOK_BASE}#', f'runbook_url: "{runbook_base}#')


def monitoring_receivers() -> Receivers:
    return receivers(components().monitoring, inventory().name, secrets().dir)


@deploy("Monitoring")
def monitoring() -> None:
    if not enabled():
        host.noop("monitoring: disabled in the inventory")
        return
    routes = monitoring_receivers()  # checked on every node: a plan without a receiver stops anywhere
    exporters()
    if has_role("db"):
        postgres_exporter()
    if host.name in monitor_nodes():
        prometheus(routes)


def _defaults_file(src: str, dest: str, service: str, changes: list[Any], **context: Any) -> None:
    """A Debian ``/etc/default`` file for a packaged exporter/server, which restarts when it (or one
    of ``changes``) changed."""
    rendered = template(src, dest, mode="644", **context)
    _running(service, [*changes, rendered])


def _running(service: str, changes: list[Any]) -> None:
    """Debian's packages start their service with its defaults on install: a change always restarts.
    Each binds the mesh address, so it starts after the tunnel (at boot too)."""
    dropin = after_mesh(service, service)
    systemd.daemon_reload(name=f"Reload systemd units ({service} drop-in)", _if=dropin.did_change)
    keep_running(service, [*changes, dropin], package_starts_it=True)


def _checked_server(
    service: str, defaults_src: str, config: Any, check: str, port: int, changes: list[Any], **defaults: Any
) -> None:
    """A packaged server of the monitoring node (Prometheus, Alertmanager): its config checked with
    its own tool whenever it changed, its ``/etc/default`` file (mesh address, port, ``defaults``),
    and a restart when any of them changed."""
    server.shell(name=f"Check the {service} config", commands=[check], _if=config.did_change)
    _defaults_file(
        defaults_src,
        f"/etc/default/{service}",
        service,
        [*changes, config],
        mesh_address=host.data.mesh_address,
        port=port,
        **defaults,
    )


def exporters() -> None:
    apt.packages(name="node_exporter", packages=["prometheus-node-exporter"], no_recommends=True)
    db = has_role("db")
    files.directory(
        name="Textfile collector directory",
        path=TEXTFILE_DIR,
        user="root",
        group="memoryctl" if db else "root",
        mode="775" if db else "755",
    )
    _defaults_file(
        "node-exporter/default.j2",
        "/etc/default/prometheus-node-exporter",
        "prometheus-node-exporter",
        [],
        mesh_address=host.data.mesh_address,
        port=NODE_EXPORTER_PORT,
        textfile_dir=TEXTFILE_DIR,
    )
    keys = secrets().wireguard
    template(
        "node-exporter/wireguard-metrics.j2",
        WIREGUARD_SCRIPT,
        textfile_dir=TEXTFILE_DIR,
        interface=host.data.mesh.get("interface", "wg0"),
        peers={keys.pair(name).public: name for name in inventory().nodes if name != host.name},
        mode="755",
    )
    # Where PostgreSQL archives WAL (the db node, a standby member once promoted): its archive queue.
    archives = backup.enabled() and (db or patroni.is_standby_member())
    if archives:
        template(
            "node-exporter/wal-metrics.j2",
            WAL_SCRIPT,
            textfile_dir=TEXTFILE_DIR,
            pg_wal=f"{backup.pg_data()}/pg_wal",
            queue_max=backup.archive_push_queue_max(),
            mode="755",
        )
    template(
        "node-exporter/restart-metrics.j2",
        RESTART_SCRIPT,
        textfile_dir=TEXTFILE_DIR,
        units=RESTART_WATCHED,
        mode="755",
    )
    gpu = has_role("gpu") and vllm.mode() != "off"
    if gpu:
        smi = "/usr/bin/nvidia-smi"
        if vllm.mode() == "standin":
            template("node-exporter/nvidia-smi-standin.j2", NVIDIA_SMI_STANDIN, mode="755")
            smi = NVIDIA_SMI_STANDIN
        template("node-exporter/gpu-metrics.j2", GPU_SCRIPT, textfile_dir=TEXTFILE_DIR, nvidia_smi=smi, mode="755")
    template(
        "node-exporter/cron.j2",
        "/etc/cron.d/memoryctl-metrics",
        textfile_dir=TEXTFILE_DIR,
        wireguard_script=WIREGUARD_SCRIPT,
        restart_script=RESTART_SCRIPT,
        wal_script=WAL_SCRIPT if archives else None,
        gpu_script=GPU_SCRIPT if gpu else None,
        memoryctl_jobs=MEMORYCTL_JOBS if db else [],
        run_as="memoryctl",
        config_path="/etc/memoryctl/memoryctl.toml",
        memoryctl="/usr/local/bin/memoryctl",
        mode="644",
    )


def postgres_exporter() -> None:
    apt.packages(name="postgres_exporter", packages=["prometheus-postgres-exporter"], no_recommends=True)
    # None: the server did not answer when the run began (Patroni started it since): the statement
    # below is idempotent, so it runs rather than guess.
    roles = host.get_fact(PostgresRoleNames, _sudo=True, _sudo_user="postgres")
    if roles is None or "prometheus" not in roles:
        server.shell(
            name="PostgreSQL role prometheus (pg_monitor, peer authentication)",
            commands=[
                'psql -v ON_ERROR_STOP=1 -Ac "DO \\$\\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '
                "'prometheus') THEN CREATE ROLE prometheus LOGIN IN ROLE pg_monitor; END IF; END \\$\\$\""
            ],
            _sudo=True,
            _sudo_user="postgres",
        )
    _defaults_file(
        "prometheus/postgres-exporter.default.j2",
        "/etc/default/prometheus-postgres-exporter",
        "prometheus-postgres-exporter",
        [],
        mesh_address=host.data.mesh_address,
        port=POSTGRES_EXPORTER_PORT,
    )


def prometheus(routes: Receivers) -> None:
    settings = components().monitoring
    cluster = inventory()
    apt.packages(
        name="Prometheus, Alertmanager", packages=["prometheus", "prometheus-alertmanager"], no_recommends=True
    )
    files.directory(name="Rules directory", path=RULES_DIR, mode="755")
    rules = files.put(
        name=f"Upload {RULES_DIR}/memoryctl.yml",
        src=StringIO(rules_text(settings.runbook_base)),
        dest=f"{RULES_DIR}/memoryctl.yml",
        mode="644",
    )
    key = template(
        "prometheus/credentials.j2",
        QDRANT_KEY_FILE,
        credentials=secrets().token("qdrant/api_key"),
        user="root",
        group="prometheus",
        mode="640",
        create_remote_dir=False,  # else pyinfra would chgrp /etc/prometheus
    )
    mesh = {name: node["mesh"] for name, node in cluster.nodes.items()}
    monitors = {name: mesh[name] for name in monitor_nodes()}
    config = template(
        "prometheus/prometheus.yml.j2",
        "/etc/prometheus/prometheus.yml",
        cluster=cluster.name,
        monitors=monitors,
        port=PROMETHEUS_PORT,
        alertmanager_port=ALERTMANAGER_PORT,
        node_exporter_port=NODE_EXPORTER_PORT,
        postgres_exporter_port=POSTGRES_EXPORTER_PORT,
        scrape_interval=settings.scrape_interval,
        evaluation_interval=settings.evaluation_interval,
        rules_dir=RULES_DIR,
        nodes=mesh,
        db_nodes={name: mesh[name] for name in cluster.group("db")},
        patroni_members={name: mesh[name] for name in patroni.members()} if patroni.enabled() else {},
        patroni_port=patroni.REST_PORT,
        qdrant_peers={name: mesh[name] for name in qdrant_peers()} if components().qdrant.source else {},
        qdrant_key_file=QDRANT_KEY_FILE,
        qdrant_port=ports.QDRANT_HTTP,
        vllm_targets=vllm_targets(),
        etcd_targets=etcd_targets(),
        mode="644",
    )
    _checked_server(
        "prometheus",
        "prometheus/prometheus.default.j2",
        config,
        "promtool check config /etc/prometheus/prometheus.yml",
        PROMETHEUS_PORT,
        [rules, key],
        retention=settings.retention,
    )
    files.directory(
        name=f"Directory {RECEIVER_SECRETS_DIR} (receiver secrets)",
        path=RECEIVER_SECRETS_DIR,
        user="root",
        group="prometheus",
        mode="750",
    )
    secret_files = [
        # No trailing newline: Alertmanager sent a password file's newline with the password until
        # prometheus/alertmanager#3680 (issue #3710), and a token with a newline is no token either.
        files.put(
            name=f"Receiver secret {path}",
            src=StringIO(content),
            dest=path,
            user="root",
            group="prometheus",
            mode="640",
        )
        for path, content in sorted(routes.files.items())
    ]
    alertmanager = template(
        "alertmanager/alertmanager.yml.j2",
        "/etc/prometheus/alertmanager.yml",
        receivers=routes.yaml(),
        heartbeat_interval=settings.heartbeat_interval,
        # How long Alertmanager gathers a group's first alerts, waits between notifications of a
        # group (also what a resolved alert waits for) and repeats a firing one.
        group_wait=settings.group_wait,
        group_interval=settings.group_interval,
        repeat_interval=settings.repeat_interval,
        user="root",
        group="prometheus",
        mode="640",
        create_remote_dir=False,
    )
    _checked_server(
        "prometheus-alertmanager",
        "alertmanager/default.j2",
        alertmanager,
        "amtool check-config /etc/prometheus/alertmanager.yml",
        ALERTMANAGER_PORT,
        secret_files,
        cluster_port=ALERTMANAGER_CLUSTER_PORT,
        cluster_peers=gossip_peers(),
    )
