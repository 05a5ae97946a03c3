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
