"""What each node runs, by its roles: the whole stack as one function (``deploy.py`` calls it).

Every node gets the base system, the WireGuard mesh and the firewall; then each role its
services (roles are inventory groups, see inventory/*.yaml):

- ``db``: PostgreSQL (+ TimescaleDB) and memoryctl with its cron jobs; with
  ``components.postgres.members`` naming two or more nodes, PostgreSQL is a Patroni cluster of those
  nodes (etcd on ``components.etcd.members``, deploy/patroni.py) whose first member is the ``db`` node,
- ``index``: Neo4j and the Qdrant peer that bootstraps the Qdrant cluster,
- ``gpu``: vLLM (generation with LoRA, embeddings) and the nightly LoRA cycle from its cron
  (deploy/nightly.py: memoryctl with its training distribution, the adapter registry),

and every node of ``components.qdrant.peers`` (default: the ``index`` nodes) a Qdrant peer; then
backups (pgBackRest, Qdrant snapshots) and monitoring (Prometheus, Alertmanager, exporters), whose
repository and server live on a node other than the database's (``deploy/opsnode.py``).
memoryctl comes after the stores: by then every store it is configured for exists.
"""

from __future__ import annotations

from pyinfra import host

from deploy import embedding_slots, etcd, night, nightly, package_roll, patroni, qdrant
from deploy.backup import backup
from deploy.base import base
from deploy.common import barrier, has_role, inventory
from deploy.firewall import firewall
from deploy.memoryctl import memoryctl
from deploy.monitoring import monitoring
from deploy.neo4j import neo4j, rebuild_where_blank
from deploy.osrelease import release
from deploy.postgres import postgresql, standby_member, standby_start
from deploy.vllm import vllm
from deploy.wireguard import wireguard


def everything() -> None:
    release()  # an unsupported OS release is refused here, before any operation is planned
    if embedding_slots.base_model_missing():  # the operator's download first (docs/nightly.md)
        return
    base()
    wireguard()
    firewall()
    if host.name in inventory().qdrant_peers():
        qdrant.qdrant()
    if len(inventory().qdrant_peers()) > 1:
        barrier("every Qdrant peer runs")
        qdrant.place_replicas()
        qdrant.stop_former_peer()
    if etcd.is_member():
        etcd.etcd()
    if patroni.enabled():
        barrier("every etcd member runs")
        etcd.prune_members()
        etcd.stop_former_member()
    # The db node recreated blank while another member leads joins as a standby (cloned).
    joins_as_replica = patroni.joins_as_replica()
    if patroni.is_standby_member() or joins_as_replica:
        standby_member()
    elif has_role("db"):
        postgresql()
    if patroni.enabled():
        # The first member leads before any other member's Patroni starts (deploy/patroni.py).
        barrier("the PostgreSQL primary runs under Patroni")
    if patroni.is_standby_member() or joins_as_replica:
        standby_start()
    if patroni.enabled():
        patroni.rolling_restart()  # every node calls it: the roll comes after every member started
        package_roll.roll()  # the held packages, when the inventory asks for a roll (every node calls it)
    if has_role("index"):
        neo4j()
    if has_role("gpu"):
        vllm(embed=not (embedding_slots.enabled() and night.on_this_host()))
    if has_role("db"):
        memoryctl()
    # The graph rebuilt from the db node once every index node's Neo4j runs (pyinfra orders one
    # host's steps only: without the barrier the rebuild waited for a Neo4j that started after it).
    barrier("Neo4j runs on every index node")
    if has_role("db"):
        rebuild_where_blank()
    if night.on_this_host():
        nightly.nightly()
        if embedding_slots.enabled():
            embedding_slots.embedding_slots()
    backup()
    monitoring()
