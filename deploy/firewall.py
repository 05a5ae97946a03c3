"""nftables: the public side accepts SSH and WireGuard only; services only from the mesh.

The node's service ports follow its roles, so every service is reachable over ``wg0`` from the
mesh subnet and from nowhere else (the services also bind to the mesh address themselves).
WireGuard's UDP port answers only the other nodes' public addresses: WireGuard already drops
unauthenticated packets, but an open port still costs a handshake computation per packet and tells a
scanner a mesh is there. SSH stays open to all (the operator's address is not the inventory's). Alertmanager's gossip
(deploy/monitoring.py) answers only the other monitoring node's mesh address.
A changed ruleset is checked with ``nft -c`` before it is loaded atomically with ``nft -f``.
"""

from __future__ import annotations

import ipaddress
import socket

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, server, systemd

from deploy import backup, embedding_slots, etcd, monitoring, night, patroni, ports
from deploy.common import START_RETRIES, components, has_role, inventory, template
from deploy.memoryctl import serve_port
from deploy.settings import ROLES

# What each role serves over the mesh (deploy/ports.py); every Qdrant peer (components.qdrant.peers)
# serves QDRANT_PORTS.
ROLE_PORTS = {role: ports.for_role(role) for role in ROLES}
QDRANT_PORTS = [ports.QDRANT_HTTP, ports.QDRANT_GRPC, ports.QDRANT_P2P]


class FirewallSettingsError(ValueError):
    """A node's ``public`` address that the firewall cannot admit by address."""


def peer_addresses() -> dict[int, list[str]]:
    """The other nodes' public addresses by IP version (4, 6): the sources WireGuard accepts.

    A hostname is resolved on the controller at plan time (nftables would resolve it once at load
    time anyway, and a name that does not resolve is better refused before anything runs).
    """
    by_version: dict[int, set[str]] = {4: set(), 6: set()}
    for name, node in inventory().nodes.items():
        if name == host.name:
            continue
        public = str(node["public"])
        try:
            addresses = [ipaddress.ip_address(public)]
        except ValueError:
            try:
                infos = socket.getaddrinfo(public, None, proto=socket.IPPROTO_UDP)
            except OSError as exc:
                raise FirewallSettingsError(
                    f"nodes.{name}.public: {public!r} does not resolve on the controller ({exc}); "
                    "the firewall admits WireGuard from peers' addresses: give an IP address"
                ) from None
            addresses = [ipaddress.ip_address(info[4][0]) for info in infos]
        for address in addresses:
            by_version[address.version].add(str(address))
    return {version: sorted(found, key=ipaddress.ip_address) for version, found in by_version.items()}


def mesh_ports() -> list[int]:
    opened = {port for role, listed in ROLE_PORTS.items() if has_role(role) for port in listed}
    if host.name in inventory().qdrant_peers():
        opened.update(QDRANT_PORTS)
    if has_role("db"):
        opened.add(serve_port())  # memoryctl serve's HTTP side, for agents on the mesh
    if embedding_slots.enabled() and night.on_this_host():
        opened.update(embedding_slots.SLOTS.values())  # the second embedding slot (8002)
    opened.update(etcd.mesh_ports(), patroni.mesh_ports())  # replicated PostgreSQL (docs/ha.md)
    opened.update(backup.mesh_ports(), monitoring.mesh_ports())  # day two: pgBackRest, rsync, exporters
    return sorted(opened)


@deploy("Firewall (nftables)")
def firewall() -> None:
    mesh = host.data.mesh
    apt.packages(name="nftables", packages=["nftables"], no_recommends=True)
    rules = template(
        "firewall/nftables.conf.j2",
        "/etc/nftables.conf",
        interface=mesh.get("interface", "wg0"),
        mesh_subnet=mesh["subnet"],
        mesh_ports=mesh_ports(),
        ssh_port=components().firewall.ssh_port,
        wireguard_port=mesh.get("port", ports.port("wireguard")),
        wireguard_peers=peer_addresses(),
        gossip_peers=monitoring.gossip_peers(),
        gossip_port=ports.ALERTMANAGER_CLUSTER,
        mode="755",
    )
    server.shell(name="Check the ruleset", commands=["nft -c -f /etc/nftables.conf"], _if=rules.did_change)
    systemd.service(
        name="nftables enabled (loads /etc/nftables.conf at boot)",
        service="nftables",
        running=True,
        **START_RETRIES,
        enabled=True,
    )
    server.shell(
        name="Load the changed ruleset",
        commands=["nft -f /etc/nftables.conf"],
        _if=rules.did_change,
    )
