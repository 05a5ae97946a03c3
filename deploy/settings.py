"""Inventory files: one YAML document describes a cluster; this module turns it into pyinfra groups.

The YAML (``inventory/local.yaml``, ``inventory/hetzner.example.yaml``) holds addresses, roles and
component settings, never secrets: passwords, API keys and WireGuard private keys are generated on
the controller into ``secrets_dir`` (outside git, mode 0600) and reused on every later run.

Roles are inventory groups, so an operator re-maps them by editing ``roles:`` of a node:
``db`` (PostgreSQL/TimescaleDB + memoryctl and its cron), ``index`` (Neo4j + the Qdrant peer that
bootstraps the cluster), ``gpu`` (vLLM); ``components.qdrant.peers`` names the nodes that run a
Qdrant peer (default: the ``index`` nodes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from deploy.components import Components, InventoryError, parse
from wireguard import MeshNode, MeshPlan
from wireguard.keys import KeyStore, SecretDir, generate_token

ROLES = ("db", "index", "gpu")
REPO = Path(__file__).resolve().parent.parent


def resolve_path(path: str) -> Path:
    """A controller path from an inventory: ``~`` and ``$VARS`` expanded, relative to the repository."""
    expanded = Path(os.path.expandvars(os.path.expanduser(path)))
    return expanded if expanded.is_absolute() else REPO / expanded


def _ssh_data(ssh: dict[str, Any]) -> dict[str, Any]:
    """``ssh:`` settings as pyinfra host data (``key: path`` -> ``ssh_key``, resolved)."""
    return {f"ssh_{k}": (str(resolve_path(v)) if k == "key" else v) for k, v in ssh.items()}


def merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """``overlay`` deep-merged over ``base`` (mappings merged key by key, anything else replaced)."""
    merged = dict(base)
    for key, value in overlay.items():
        both = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = merge(merged[key], value) if both else value
    return merged


class ClusterInventory:
    def __init__(self, path: Path) -> None:
        self.path = path
        doc = yaml.safe_load(path.read_text())
        where = str(path)
        # A change of data for one run (an upgrade rehearsed on the local nodes, a setting tried):
        # $MEMORYCTL_INVENTORY_OVERLAY names YAML files merged over the inventory whose
        # `cluster:` they name (never over another cluster's).
        # Several files: separated by ":", merged in order.
        for overlay_path in filter(None, os.environ.get("MEMORYCTL_INVENTORY_OVERLAY", "").split(os.pathsep)):
            overlay = yaml.safe_load(resolve_path(overlay_path).read_text())
            if overlay and overlay.get("cluster") == doc.get("cluster"):
                doc = merge(doc, overlay)
                where += f" + {overlay_path}"
        try:
            self.name: str = doc["cluster"]
            self.mesh: dict[str, Any] = doc["mesh"]
            self.nodes: dict[str, dict[str, Any]] = doc["nodes"]
            raw_components = doc.get("components")
            self.sources: dict[str, Any] = doc.get("sources", {})
            ssh: dict[str, Any] = doc.get("ssh", {})
            self.extra_data: dict[str, Any] = doc.get("pyinfra_data", {})
        except (KeyError, TypeError) as exc:
            raise InventoryError(f"{path}: missing {exc}") from None
        # Merged as dictionaries above, validated once here: a misspelt setting stops the run now.
        self.components: Components = parse(raw_components, where)
        secrets = (
            os.environ.get("MEMORYCTL_SECRETS_DIR") or doc.get("secrets_dir") or f"~/.config/memoryctl/{self.name}"
        )
        self.secrets_dir = resolve_path(secrets)
        self.ssh = _ssh_data(ssh)
        for name, node in self.nodes.items():
            unknown = set(node.get("roles", [])) - set(ROLES)
            if unknown:
                raise InventoryError(f"{path}: node {name} has unknown roles {sorted(unknown)}; known: {ROLES}")
        self.plan = MeshPlan(
            self.mesh["subnet"],
            [
                MeshNode(name, node["public"], node["mesh"], int(self.mesh.get("port", 51820)))
                for name, node in self.nodes.items()
            ],
        )
        for role in ROLES:
            if not self.group(role):
                raise InventoryError(f"{path}: no node has the role {role!r}")
        strangers = set(self.qdrant_peers()) - set(self.nodes)
        if strangers:
            raise InventoryError(f"{path}: components.qdrant.peers names unknown nodes {sorted(strangers)}")
        self.etcd_members()  # refused now, before anything is planned

    def etcd_members(self) -> list[str]:
        """Nodes running an etcd member: ``components.etcd.members``, else the first three nodes (the
        first one when there are fewer than three: etcd needs an odd count, and two members would
        make either node's loss stop the cluster).

        Only used when PostgreSQL is replicated (deploy/etcd.py). A node added later is no member
        unless declared: etcd stays three members as the cluster grows.
        """
        stated = self.components.etcd.members
        names = list(self.nodes)
        members = list(stated) if stated else (names[:3] if len(names) >= 3 else names[:1])
        unknown = sorted(set(members) - set(self.nodes))
        if unknown:
            raise InventoryError(f"{self.path}: components.etcd.members names unknown nodes {unknown}")
        if len(set(members)) != len(members) or len(members) % 2 == 0:
            raise InventoryError(
                f"{self.path}: components.etcd.members must name an odd number of distinct nodes (3 keeps a"
                f" quorum with any one lost), not {members}"
            )
        return members

    def group(self, role: str) -> list[str]:
        return [name for name, node in self.nodes.items() if role in node.get("roles", [])]

    def first(self, role: str) -> str:
        """The mesh address of the first node with a role (the endpoint memoryctl is pointed at)."""
        return str(self.nodes[self.group(role)[0]]["mesh"])

    def qdrant_peers(self) -> list[str]:
        """Nodes running a Qdrant peer: ``components.qdrant.peers``, else the ``index`` nodes.

        With more than one, they form one Qdrant cluster over the mesh; the first ``index`` node
        among them bootstraps it (it must be up when the others first join).
        """
        peers = list(self.components.qdrant.peers or self.group("index"))
        index = [name for name in self.group("index") if name in peers]
        return index[:1] + [name for name in peers if name not in index[:1]]

    def qdrant_endpoint(self) -> str:
        """The peer memoryctl talks to: the ``db`` node's own when it runs one, else the bootstrap peer.

        Any peer answers for the whole cluster (it forwards to the shards' replicas), so the nearest
        one saves a hop; losing another node's peer then costs memoryctl nothing.
        """
        db = self.group("db")[0]
        peers = self.qdrant_peers()
        return str(self.nodes[db if db in peers else peers[0]]["mesh"])

    def host_data(self, name: str) -> dict[str, Any]:
        node = self.nodes[name]
        return {
            "ssh_hostname": node["public"],
            **self.ssh,
            **_ssh_data(node.get("ssh", {})),  # per-node overrides (e.g. one Vagrant key per VM)
            "public_address": node["public"],
            "mesh_address": node["mesh"],
            "roles": list(node.get("roles", [])),
        }

    def global_data(self) -> dict[str, Any]:
        return {
            "cluster_name": self.name,
            "inventory_path": str(self.path),
            "secrets_dir": str(self.secrets_dir),
            "mesh": self.mesh,
            "components": self.components,
            "sources": self.sources,
            "endpoints": {**{role: self.first(role) for role in ROLES}, "qdrant": self.qdrant_endpoint()},
            "mesh_addresses": {name: node["mesh"] for name, node in self.nodes.items()},
            # Extra pyinfra data for every host, e.g. `_sudo: true` when logging in as a non-root user.
            **self.extra_data,
        }

    def pyinfra_all(self) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]:
        """The ``all`` group: every host with its own data, plus the data they share."""
        return [(name, self.host_data(name)) for name in self.nodes], self.global_data()


def load_inventory(path: str | Path) -> ClusterInventory:
    return ClusterInventory(Path(path))


class Secrets:
    """Generated secrets of one cluster (controller side)."""

    def __init__(self, secrets_dir: str | Path) -> None:
        self.dir = SecretDir(Path(secrets_dir))
        self.wireguard = KeyStore(self.dir)

    def token(self, name: str) -> str:
        return self.dir.get_or_create(name, generate_token)
