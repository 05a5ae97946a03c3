"""The memoryctl stack: ``pyinfra inventory/<name>.py deploy.py``.

Every node gets the base system, the WireGuard mesh and the firewall; then each role its
services (roles are inventory groups, see inventory/*.yaml):

- ``db``: PostgreSQL (+ TimescaleDB) and memoryctl with its cron jobs,
- ``index``: Neo4j and the Qdrant peer that bootstraps the Qdrant cluster,
- ``gpu``: vLLM (generation with LoRA, embeddings),

and every node of ``components.qdrant.peers`` (default: the ``index`` nodes) a Qdrant peer.

A second run changes nothing. Never run it with ``--diff``: some rendered files hold secrets.
"""

from pyinfra import host, state

from deploy.base import base
from deploy.common import has_role, inventory
from deploy.firewall import firewall
from deploy.memoryctl import memoryctl
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
