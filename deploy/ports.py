"""Every port the stack listens on, once: which service, where it runs, and who may reach it.

The firewall's mesh ports (deploy/firewall.py), the Prometheus scrape targets (deploy/monitoring.py)
and the operation modules that bind or connect (etcd, Patroni, pgBackRest, Qdrant, vLLM, the
embedding slots) take their numbers from here; tests/deploy/unit/test_ports.py checks that every
port the firewall opens, Prometheus scrapes or a template under ``templates/`` names is in this
table. A port that is an inventory setting (``components.memoryctl.serve_port``,
``components.firewall.ssh_port``) has its default in deploy/components.py, read from there.

``reach``: ``mesh`` (over ``wg0`` from the mesh subnet only: the service binds the node's mesh
address and nftables admits the mesh), ``public`` (every address), ``peers`` (the other nodes'
public addresses only: WireGuard), ``monitoring-peer`` (over ``wg0`` from the other monitoring
node's mesh address only: Alertmanager's gossip). Pure: no pyinfra state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from deploy.components import Firewall, Memoryctl


@dataclass(frozen=True)
class Service:
    name: str
    port: int
    runs_on: str  # a role, or what decides the nodes (said in words)
    reach: Literal["mesh", "public", "peers", "monitoring-peer"]
    setting: str | None = None  # the inventory setting that may change the port
    role: str | None = None  # the inventory role whose every node runs it (the firewall opens it there)


def _default(model: type[Firewall] | type[Memoryctl], name: str) -> int:
    return int(model.model_fields[name].default)


SERVICES = (
    Service("ssh", _default(Firewall, "ssh_port"), "every node", "public", "components.firewall.ssh_port"),
    Service("wireguard", 51820, "every node", "peers", "mesh.port"),
    Service("postgres", 5432, "db, and every PostgreSQL member (components.postgres.members)", "mesh", role="db"),
    Service("patroni", 8008, "every PostgreSQL member when replicated (its REST API)", "mesh"),
    Service("etcd-client", 2379, "every etcd member (components.etcd.members) when replicated", "mesh"),
    Service("etcd-peer", 2380, "every etcd member when replicated", "mesh"),
    Service("etcd-metrics", 2381, "every etcd member when replicated (/metrics, /health)", "mesh"),
    Service("neo4j-http", 7474, "index", "mesh", role="index"),
    Service("neo4j-bolt", 7687, "index", "mesh", role="index"),
    Service("qdrant-http", 6333, "every Qdrant peer (components.qdrant.peers)", "mesh"),
    Service("qdrant-grpc", 6334, "every Qdrant peer", "mesh"),
    Service("qdrant-p2p", 6335, "every Qdrant peer (the cluster's consensus)", "mesh"),
    Service("vllm-generate", 8000, "gpu (vllm@generate)", "mesh", role="gpu"),
    Service("vllm-embed", 8001, "gpu (vllm@embed, or embedding slot a)", "mesh", role="gpu"),
    Service("vllm-embed-b", 8002, "the gpu node that runs the night with embedding slots (slot b)", "mesh"),
    Service("vllm-rerank", 8003, "gpu (vllm@rerank, when components.vllm.rerank)", "mesh", role="gpu"),
    Service("memoryctl-serve", _default(Memoryctl, "serve_port"), "db", "mesh", "components.memoryctl.serve_port"),
    Service("pgbackrest-tls", 8432, "db, standby members, and the backup node", "mesh"),
    Service("rsync", 873, "the backup node (Qdrant snapshots)", "mesh"),
    Service("node-exporter", 9100, "every node", "mesh"),
    Service("postgres-exporter", 9187, "db", "mesh"),
    Service("prometheus", 9090, "the monitoring nodes (components.monitoring.nodes)", "mesh"),
    Service("alertmanager", 9093, "the monitoring nodes", "mesh"),
    Service("alertmanager-cluster", 9094, "the monitoring nodes when two (gossip, TCP and UDP)", "monitoring-peer"),
)
_BY_NAME = {service.name: service for service in SERVICES}


def port(name: str) -> int:
    """The port of the service ``name`` (its default, where it is an inventory setting)."""
    return _BY_NAME[name].port


def ports(*names: str) -> list[int]:
    return [port(name) for name in names]


def for_role(role: str) -> list[int]:
    """What every node of ``role`` serves whatever else it runs."""
    return [service.port for service in SERVICES if service.role == role]


def ports_table() -> str:
    """docs/deploy.md's table of ports (tests/deploy/unit/test_ports.py keeps them equal)."""
    lines = ["| service | port | runs on | reached from |", "|---|---|---|---|"]
    reach = {
        "mesh": "the mesh (wg0)",
        "public": "anywhere",
        "peers": "the other nodes' public addresses",
        "monitoring-peer": "the other monitoring node's mesh address (wg0)",
    }
    for s in SERVICES:
        port = f"{s.port} (`{s.setting}`)" if s.setting else str(s.port)
        lines.append(f"| {s.name} | {port} | {s.runs_on} | {reach[s.reach]} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(ports_table())


POSTGRES = port("postgres")
PATRONI = port("patroni")
ETCD_CLIENT, ETCD_PEER, ETCD_METRICS = ports("etcd-client", "etcd-peer", "etcd-metrics")
NEO4J = ports("neo4j-http", "neo4j-bolt")
NEO4J_HTTP, NEO4J_BOLT = NEO4J
QDRANT_HTTP, QDRANT_GRPC, QDRANT_P2P = ports("qdrant-http", "qdrant-grpc", "qdrant-p2p")
VLLM_GENERATE, VLLM_EMBED, VLLM_EMBED_B, VLLM_RERANK = ports(
    "vllm-generate", "vllm-embed", "vllm-embed-b", "vllm-rerank"
)
PGBACKREST_TLS, RSYNC = ports("pgbackrest-tls", "rsync")
NODE_EXPORTER, POSTGRES_EXPORTER, PROMETHEUS, ALERTMANAGER, ALERTMANAGER_CLUSTER = ports(
    "node-exporter", "postgres-exporter", "prometheus", "alertmanager", "alertmanager-cluster"
)
# What memoryctl.toml points memoryctl at (templates/memoryctl/memoryctl.toml.j2).
CLIENT_PORTS = {
    "postgres": POSTGRES,
    "qdrant_http": QDRANT_HTTP,
    "neo4j_bolt": NEO4J_BOLT,
    "vllm_generate": VLLM_GENERATE,
    "vllm_embed": VLLM_EMBED,
    "vllm_rerank": VLLM_RERANK,
}
