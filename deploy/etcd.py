"""etcd on every node, the consensus store Patroni keeps the PostgreSQL leader lock in (docs/ha.md).

Only deployed when PostgreSQL is replicated (``components.postgres.members`` names two or more
nodes, :func:`deploy.patroni.enabled`). Three members, one per node, so the cluster keeps a quorum
with any one node lost; the third node holds no PostgreSQL, only its vote.

- Debian's ``etcd-server`` (3.5 on Debian 13), its own data directory (``/var/lib/etcd/memoryctl``:
  the package's first start with its defaults, a one-member "default" cluster, never meets ours).
- Peer (2380) and client (2379) traffic on the mesh address only, both TLS with client
  certificates from the controller's CA (:mod:`deploy.pki`, ``<secrets>/etcd``): a peer or client
  without a certificate of that CA is refused, the firewall admits the mesh subnet only.
- Started after ``wg-quick@wg0`` (it binds the mesh address). The three start in the same step of
  the run (pyinfra runs one step on every node at once), which a new cluster needs: a member
  reports itself ready only once a quorum has formed.
- Election timing a little slower than etcd's defaults (heartbeat 250 ms, election 2.5 s): the
  defaults assume an idle machine; a node busy with a JVM start or a training night must not
  cost the cluster its leader.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, systemd

from deploy.common import START_RETRIES, after_mesh, inventory, keep_running, secrets, template
from deploy.pki import CertificateAuthority

CLIENT_PORT = 2379
PEER_PORT = 2380
PKI_DIR = "/etc/etcd/pki"
DATA_DIR = "/var/lib/etcd/memoryctl"
HEARTBEAT_MS = 250
ELECTION_MS = 2500


def mesh_ports() -> list[int]:
    from deploy import patroni

    return [CLIENT_PORT, PEER_PORT] if patroni.enabled() else []


def client_urls() -> list[str]:
    """Every member's client URL (what Patroni and operators connect to)."""
    return [f"https://{node['mesh']}:{CLIENT_PORT}" for node in inventory().nodes.values()]


def initial_cluster() -> str:
    return ",".join(f"{name}=https://{node['mesh']}:{PEER_PORT}" for name, node in inventory().nodes.items())


def certificate_files(directory: str, owner: str) -> list[Any]:
    """This node's certificate, key and the CA, owned by ``owner`` (etcd, or postgres for Patroni)."""
    cert = CertificateAuthority(secrets().dir, "etcd").node(host.name, host.data.mesh_address)
    files.directory(name=f"Directory {directory}", path=directory, user=owner, group=owner, mode="750")
    wanted = (("ca.crt", cert.ca, "644"), ("node.crt", cert.cert, "644"), ("node.key", cert.key, "600"))
    return [
        template("pgbackrest/pem.j2", f"{directory}/{name}", pem=content, user=owner, group=owner, mode=mode)
        for name, content, mode in wanted
    ]


@deploy("etcd")
def etcd() -> None:
    pki = certificate_files(PKI_DIR, "etcd") if _user_exists("etcd") else None
    config = template(
        "etcd/etcd.default.j2",
        "/etc/default/etcd",
        member=host.name,
        mesh_address=host.data.mesh_address,
        client_port=CLIENT_PORT,
        peer_port=PEER_PORT,
        initial_cluster=initial_cluster(),
        token=f"memoryctl-{inventory().name}",
        pki_dir=PKI_DIR,
        data_dir=DATA_DIR,
        heartbeat_ms=HEARTBEAT_MS,
        election_ms=ELECTION_MS,
        mode="644",
    )
    dropin = after_mesh("etcd", "etcd")
    systemd.daemon_reload(name="Reload systemd units (etcd drop-in)", _if=dropin.did_change)
    apt.packages(name="etcd", packages=["etcd-server", "etcd-client"], no_recommends=True)
    if pki is None:  # the package created the etcd user just now: its files follow in this run
        pki = certificate_files(PKI_DIR, "etcd")
    files.directory(name=f"Directory {DATA_DIR}", path=DATA_DIR, user="etcd", group="etcd", mode="700")
    keep_running("etcd", [config, dropin, *pki], package_starts_it=True)
    systemd.service(name="etcd enabled", service="etcd", enabled=True, **START_RETRIES)


def _user_exists(name: str) -> bool:
    from pyinfra.facts.server import Users

    return name in host.get_fact(Users)
