"""The mesh address plan and the peer table each node gets.

Every node has a public endpoint (what the other nodes dial over UDP) and one address in the mesh
subnet. The mesh is full: each node lists every other node as a peer with AllowedIPs = that
peer's /32, so a mesh of N nodes gives each node N-1 peers.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wireguard.keys import KeyStore

DEFAULT_PORT = 51820
DEFAULT_KEEPALIVE = 25


@dataclass(frozen=True)
class MeshNode:
    name: str
    endpoint: str  # the address other nodes reach this one at (public IP or hostname)
    address: str  # the mesh address, e.g. 10.77.0.1
    port: int = DEFAULT_PORT


@dataclass(frozen=True)
class Peer:
    name: str
    public_key: str
    endpoint: str
    allowed_ips: str
    keepalive: int = DEFAULT_KEEPALIVE


class MeshPlan:
    """Validated address plan of a full mesh."""

    def __init__(self, subnet: str, nodes: Iterable[MeshNode]) -> None:
        self.subnet = ipaddress.ip_network(subnet)
        self.nodes = {node.name: node for node in nodes}
        self._validate()

    def _validate(self) -> None:
        seen: dict[str, str] = {}
        for node in self.nodes.values():
            address = ipaddress.ip_address(node.address)
            if address not in self.subnet:
                raise ValueError(f"{node.name}: mesh address {address} is outside {self.subnet}")
            if address in (self.subnet.network_address, self.subnet.broadcast_address):
                raise ValueError(f"{node.name}: {address} is the network or broadcast address of {self.subnet}")
            if str(address) in seen:
                raise ValueError(f"{node.name} and {seen[str(address)]} share mesh address {address}")
            seen[str(address)] = node.name

    @property
    def prefixlen(self) -> int:
        return self.subnet.prefixlen

    def interface_address(self, name: str) -> str:
        """``Address =`` for the node's interface: its address with the mesh prefix."""
        return f"{self.nodes[name].address}/{self.prefixlen}"

    def peers(self, name: str, keys: KeyStore) -> list[Peer]:
        """The peer table of one node: every other node, sorted by name for stable configs."""
        return [
            Peer(
                name=other.name,
                public_key=keys.pair(other.name).public,
                endpoint=f"{other.endpoint}:{other.port}",
                allowed_ips=f"{other.address}/32",
            )
            for other in sorted(self.nodes.values(), key=lambda n: n.name)
            if other.name != name
        ]
