"""Monitoring: Prometheus and Alertmanager on one node, exporters everywhere, all on the mesh.

- Every node: ``prometheus-node-exporter`` (Debian) on its mesh address, with the textfile
  collector; cron jobs write each WireGuard peer's latest handshake there (node_exporter has no
  WireGuard collector), and whether a server runs a replaced executable or the node waits for a
  reboot (an upgrade under a running PostgreSQL, etcd, Patroni or Qdrant; ``/run/reboot-required``).
- The ``db`` node: ``prometheus-postgres-exporter`` (peer-authenticated as a ``prometheus`` role in
  ``pg_monitor``), and memoryctl's own metrics through the textfile collector: ``memoryctl health
  --prometheus`` every minute and ``memoryctl backup status --prometheus`` every five. A textfile
  rather than an endpoint: it works whether or not a memoryctl service is running, and a hung probe
  delays one file instead of failing the scrape (a stale file has its own alert).
- Every Qdrant peer: its ``/metrics``, scraped with the API key.
- The monitoring node (:mod:`deploy.opsnode`): ``prometheus`` and ``prometheus-alertmanager`` from
  Debian, the rules in ``templates/prometheus/memoryctl.rules.yml``, and one Alertmanager receiver
  that sends nothing until the inventory configures it (``components.monitoring.receiver``).

Ports (mesh only, firewalled to ``wg0``): 9100 node_exporter, 9187 postgres_exporter, 9090
Prometheus, 9093 Alertmanager.
"""

from __future__ import annotations

from typing import Any

import yaml
from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server, systemd

from deploy import patroni
from deploy.common import TEMPLATES, after_mesh, component, has_role, inventory, keep_running, secrets, template
from deploy.facts import PostgresRoleNames
from deploy.opsnode import ops_node

NODE_EXPORTER_PORT = 9100
POSTGRES_EXPORTER_PORT = 9187
PROMETHEUS_PORT = 9090
ALERTMANAGER_PORT = 9093
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
WIREGUARD_SCRIPT = "/usr/local/sbin/memoryctl-wireguard-metrics"
RESTART_SCRIPT = "/usr/local/sbin/memoryctl-restart-metrics"
# Servers whose replaced executable shows as memoryctl_restart_pending{service}: by systemd unit
# (PostgreSQL's postmaster is found by name: under Patroni it is not a unit's main process).
RESTART_WATCHED = {"patroni": "patroni.service", "etcd": "etcd.service", "qdrant": "qdrant.service"}
RULES_DIR = "/etc/prometheus/rules"
QDRANT_KEY_FILE = "/etc/prometheus/qdrant-api-key"
# memoryctl's textfile jobs on the db node: file name, command, schedule.
MEMORYCTL_JOBS = [
    {"name": "memoryctl-health", "command": "health", "schedule": "* * * * *"},
    {"name": "memoryctl-backup", "command": "backup status", "schedule": "*/5 * * * *"},
]


def enabled() -> bool:
    return bool(component("monitoring").get("enabled", True))


def monitor_node() -> str:
    return ops_node(inventory(), "monitoring", component("monitoring"))


def qdrant_peers() -> list[str]:
    return inventory().qdrant_peers()


def mesh_ports() -> list[int]:
    """What this host serves over the mesh for monitoring (the firewall opens these on ``wg0``)."""
    if not enabled():
        return []
    ports = [NODE_EXPORTER_PORT]
    if has_role("db"):
        ports.append(POSTGRES_EXPORTER_PORT)
    if host.name == monitor_node():
        ports += [PROMETHEUS_PORT, ALERTMANAGER_PORT]
    return sorted(ports)


def receiver_yaml(receiver: dict[str, Any] | None) -> str:
    """The operator's receiver settings, indented under ``- name: operator`` (empty = sends nothing)."""
    if not receiver:
        return "    # (none configured: nothing is sent)"
    if "name" in receiver:
        raise ValueError("components.monitoring.receiver: give the receiver's settings without a name")
    dumped = yaml.safe_dump(receiver, default_flow_style=False, sort_keys=True).rstrip("\n")
    return "\n".join(f"    {line}" for line in dumped.splitlines())


@deploy("Monitoring")
def monitoring() -> None:
    if not enabled():
        host.noop("monitoring: disabled in the inventory")
        return
    exporters()
    if has_role("db"):
        postgres_exporter()
    if host.name == monitor_node():
        prometheus()


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
    template(
        "node-exporter/restart-metrics.j2",
        RESTART_SCRIPT,
        textfile_dir=TEXTFILE_DIR,
        units=RESTART_WATCHED,
        mode="755",
    )
    template(
        "node-exporter/cron.j2",
        "/etc/cron.d/memoryctl-metrics",
        textfile_dir=TEXTFILE_DIR,
        wireguard_script=WIREGUARD_SCRIPT,
        restart_script=RESTART_SCRIPT,
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


def prometheus() -> None:
    settings = component("monitoring")
    cluster = inventory()
    apt.packages(
        name="Prometheus, Alertmanager", packages=["prometheus", "prometheus-alertmanager"], no_recommends=True
    )
    files.directory(name="Rules directory", path=RULES_DIR, mode="755")
    rules = files.put(
        name=f"Upload {RULES_DIR}/memoryctl.yml",
        src=str(TEMPLATES / "prometheus" / "memoryctl.rules.yml"),
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
    config = template(
        "prometheus/prometheus.yml.j2",
        "/etc/prometheus/prometheus.yml",
        cluster=cluster.name,
        node=host.name,
        mesh_address=host.data.mesh_address,
        port=PROMETHEUS_PORT,
        alertmanager_port=ALERTMANAGER_PORT,
        node_exporter_port=NODE_EXPORTER_PORT,
        postgres_exporter_port=POSTGRES_EXPORTER_PORT,
        scrape_interval=settings.get("scrape_interval", "15s"),
        evaluation_interval=settings.get("evaluation_interval", "15s"),
        rules_dir=RULES_DIR,
        nodes=mesh,
        db_nodes={name: mesh[name] for name in cluster.group("db")},
        patroni_members={name: mesh[name] for name in patroni.members()} if patroni.enabled() else {},
        patroni_port=patroni.REST_PORT,
        qdrant_peers={name: mesh[name] for name in qdrant_peers()} if component("qdrant").get("source") else {},
        qdrant_key_file=QDRANT_KEY_FILE,
        mode="644",
    )
    _checked_server(
        "prometheus",
        "prometheus/prometheus.default.j2",
        config,
        "promtool check config /etc/prometheus/prometheus.yml",
        PROMETHEUS_PORT,
        [rules, key],
        retention=settings.get("retention", "30d"),
    )
    alertmanager = template(
        "alertmanager/alertmanager.yml.j2",
        "/etc/prometheus/alertmanager.yml",
        receiver=receiver_yaml(settings.get("receiver")),
        # How long Alertmanager gathers a group's first alerts, waits between notifications of a
        # group (also what a resolved alert waits for) and repeats a firing one.
        group_wait=settings.get("group_wait", "30s"),
        group_interval=settings.get("group_interval", "5m"),
        repeat_interval=settings.get("repeat_interval", "4h"),
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
        [],
    )
