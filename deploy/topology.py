"""Who runs what, from the inventory alone: pure functions the operation modules share.

Below every operation module (deploy/etcd.py, deploy/patroni.py, deploy/postgres.py, …), so that
two of them that need the same membership answer read it here instead of importing each other
(etcd's members ask whether Patroni runs; Patroni's members must be etcd members): no import
cycle in deploy/ (tests/unit/test_import_graph.py).
"""

from __future__ import annotations

from deploy.common import components, inventory


class PatroniSettingsError(ValueError):
    """``components.postgres.members`` that cannot be deployed as written."""


def postgres_members() -> list[str]:
    """The PostgreSQL members, the ``db`` node first; ``[db node]`` unless the inventory names more."""
    inv = inventory()
    db = inv.group("db")[0]
    stated = list(components().postgres.members or [db])
    unknown = [name for name in stated if name not in inv.nodes]
    if unknown:
        raise PatroniSettingsError(f"postgres.members names unknown nodes {unknown}; known: {sorted(inv.nodes)}")
    if stated[0] != db:
        raise PatroniSettingsError(
            f"postgres.members must start with the db node ({db}): it holds the data the cluster starts from"
        )
    if len(set(stated)) != len(stated):
        raise PatroniSettingsError(f"postgres.members names a node twice: {stated}")
    outside = [name for name in stated if name not in inv.etcd_members()] if len(stated) > 1 else []
    if outside:
        raise PatroniSettingsError(
            f"postgres.members {outside} must be etcd members too (components.etcd.members): a primary moves"
            " etcd's leader off its own node (etcd-leader-away), which needs an etcd member there"
        )
    return stated


def patroni_enabled() -> bool:
    """PostgreSQL is a Patroni cluster (two members or more), not the single server."""
    return len(postgres_members()) > 1
