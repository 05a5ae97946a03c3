"""What each node runs, by its roles: the whole stack as one function (``deploy.py`` calls it).

Every node gets the base system, the WireGuard mesh and the firewall; then each role its
services (roles are inventory groups, see inventory/*.yaml):

- ``db``: PostgreSQL (+ TimescaleDB) and memoryctl with its cron jobs,
- ``index``: Neo4j and the Qdrant peer that bootstraps the Qdrant cluster,
- ``gpu``: vLLM (generation with LoRA, embeddings),

and every node of ``components.qdrant.peers`` (default: the ``index`` nodes) a Qdrant peer; then
backups (pgBackRest, Qdrant snapshots) and monitoring (Prometheus, Alertmanager, exporters), whose
repository and server live on a node other than the database's (``deploy/opsnode.py``).
memoryctl comes after the stores: by then every store it is configured for exists.
"""

from __future__ import annotations

from pyinfra import host

from deploy.backup import backup
from deploy.base import base
from deploy.common import has_role, inventory
from deploy.firewall import firewall
from deploy.memoryctl import memoryctl
from deploy.monitoring import monitoring
from deploy.neo4j import neo4j
from deploy.osrelease import release
from deploy.postgres import postgresql
from deploy.qdrant import qdrant
from deploy.vllm import vllm
from deploy.wireguard import wireguard


def everything() -> None:
    release()  # an unsupported OS release is refused here, before any operation is planned
    base()
    wireguard()
    firewall()
    if host.name in inventory().qdrant_peers():
        qdrant()
    if has_role("db"):
        postgresql()
    if has_role("index"):
        neo4j()
    if has_role("gpu"):
        vllm()
    if has_role("db"):
        memoryctl()
    backup()
    monitoring()
