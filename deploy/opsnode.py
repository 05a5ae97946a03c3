"""Which node holds the backups and runs the monitoring: never the database's node.

A backup on the machine it protects is lost with it, and a monitor on a failed node cannot say so.
``components.backup.node`` / ``components.monitoring.node`` name the node; the default is the first
node that serves neither PostgreSQL nor the index stores (the ``gpu`` node of the three-node
layout), else the first that does not serve PostgreSQL.
"""

from __future__ import annotations

from deploy.settings import ClusterInventory


class OpsNodeError(ValueError):
    """A backup or monitoring node that is not in the inventory or is the database's node."""


def ops_node(cluster: ClusterInventory, component: str, named: str | None) -> str:
    """``named`` (the component's ``node`` setting) checked, or the default node when it is None."""
    db_nodes = set(cluster.group("db"))
    if named is not None:
        if named not in cluster.nodes:
            raise OpsNodeError(f"components.{component}.node: {named!r} is not a node of the inventory")
        if component == "backup" and named in db_nodes:
            raise OpsNodeError(
                f"components.backup.node: {named!r} runs PostgreSQL; the backup repository must be on another node"
            )
        return str(named)
    index_nodes = set(cluster.group("index"))
    candidates = [n for n in cluster.nodes if n not in db_nodes and n not in index_nodes]
    candidates += [n for n in cluster.nodes if n not in db_nodes]
    if not candidates:
        raise OpsNodeError(f"components.{component}: every node runs PostgreSQL; name a node for it")
    return candidates[0]


def monitoring_nodes(cluster: ClusterInventory, named: list[str] | None) -> list[str]:
    """Where Prometheus and Alertmanager run: ``named`` (``components.monitoring.nodes``) checked, or
    the first two nodes without the ``gpu`` role (the node the deploy reboots after a driver install
    and that trains all night), topped up with the others where fewer than two are left.

    Two: each Prometheus scrapes everything and evaluates every rule, each sends to both
    Alertmanagers, which gossip so that one notification goes out; losing either node silences
    nothing (docs/monitoring.md). The db node may be one of them: the other still sees it fail."""
    if named is not None:
        unknown = [name for name in named if name not in cluster.nodes]
        if unknown:
            raise OpsNodeError(f"components.monitoring.nodes: {unknown} not nodes of the inventory")
        if len(set(named)) != len(named):
            raise OpsNodeError(f"components.monitoring.nodes: {named} names a node twice")
        return list(named)
    gpu = set(cluster.group("gpu"))
    ordered = [n for n in cluster.nodes if n not in gpu] + [n for n in cluster.nodes if n in gpu]
    return ordered[:2]
