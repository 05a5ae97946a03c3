"""WireGuard full mesh: keys from the controller, ``wg syncconf`` on changes (the tunnel stays up).

The private key is rendered into ``/etc/wireguard/<iface>.conf`` (0600 root). A changed peer table
is applied with ``wg syncconf <iface> <(wg-quick strip <iface>)``, which keeps established
sessions; only the first run starts ``wg-quick@<iface>``. A changed interface Address needs a
``systemctl restart wg-quick@<iface>`` by the operator (syncconf does not touch addresses).
With ``mesh.userspace: true`` (no kernel module) wg-quick runs wireguard-go.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, server, systemd

from deploy.common import START_RETRIES, inventory, secrets, template


@deploy("WireGuard mesh")
def wireguard() -> None:
    mesh = host.data.mesh
    interface = mesh.get("interface", "wg0")
    userspace = bool(mesh.get("userspace", False))
    plan = inventory().plan
    keys = secrets().wireguard
    node = host.name

    apt.packages(
        name="WireGuard tools",
        packages=["wireguard-tools", *(["wireguard-go"] if userspace else [])],
        no_recommends=True,
    )

    dropin_path = "/etc/systemd/system/wg-quick@.service.d/userspace.conf"
    # One operation on both paths: what the drop-in says is data (mesh.userspace).
    dropin = template("wireguard/userspace.conf.j2", dropin_path, userspace=userspace)
    # A reboot is not held by the interface's removal (the drop-in says why).
    stop = template("wireguard/stop.conf.j2", "/etc/systemd/system/wg-quick@.service.d/stop.conf")
    systemd.daemon_reload(name="Reload systemd units", _if=lambda: dropin.did_change() or stop.did_change())

    config = template(
        "wireguard/wg.conf.j2",
        f"/etc/wireguard/{interface}.conf",
        node=node,
        address=plan.interface_address(node),
        port=plan.nodes[node].port,
        private_key=keys.pair(node).private,
        peers=plan.peers(node, keys),
        user="root",
        group="root",
        mode="600",
    )
    systemd.service(
        name=f"wg-quick@{interface} running and enabled",
        service=f"wg-quick@{interface}",
        running=True,
        **START_RETRIES,
        enabled=True,
    )
    server.shell(
        name=f"Apply the peer table to {interface} without dropping it",
        commands=[f"wg syncconf {interface} <(wg-quick strip {interface})"],
        _shell_executable="bash",
        _if=config.did_change,
    )
