"""The memoryctl stack: ``pyinfra inventory/<name>.py deploy.py``.

Every node gets the base system, the WireGuard mesh and the firewall; then each role its
services (roles are inventory groups, see inventory/*.yaml):

- ``db``: PostgreSQL (+ TimescaleDB) and memoryctl with its cron jobs,
- ``index``: Qdrant and Neo4j,
- ``gpu``: vLLM (generation with LoRA, embeddings),

then backups (pgBackRest, Qdrant snapshots) and monitoring (Prometheus, Alertmanager, exporters),
whose repository and server live on a node other than the database's (``deploy/opsnode.py``).

A second run changes nothing. Never run it with ``--diff``: some rendered files hold secrets.
"""

from pyinfra import state

from deploy.backup import backup
from deploy.base import base
from deploy.common import has_role
from deploy.firewall import firewall
from deploy.memoryctl import memoryctl
from deploy.monitoring import monitoring
from deploy.neo4j import neo4j
from deploy.postgres import postgresql
from deploy.qdrant import qdrant
from deploy.vllm import vllm
from deploy.wireguard import wireguard

if state.config.DIFF:
    raise SystemExit("deploy.py: --diff would print rendered secrets (WireGuard keys, passwords); run without it")

base()
wireguard()
firewall()
if has_role("db"):
    postgresql()
    memoryctl()
if has_role("index"):
    qdrant()
    neo4j()
if has_role("gpu"):
    vllm()
backup()
monitoring()
