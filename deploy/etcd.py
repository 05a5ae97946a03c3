"""etcd, the consensus store Patroni keeps the PostgreSQL leader lock in (docs/ha.md).

Only deployed when PostgreSQL is replicated (``components.postgres.members`` names two or more
nodes, :func:`deploy.topology.patroni_enabled`), on the nodes ``components.etcd.members`` declares (default:
the inventory's first three): three members keep a quorum with any one node lost; a node added
later (a Qdrant peer, an agent host) is not a member unless declared.

**Membership is declared state** (docs/operations.md, "Replace a node"), reconciled through etcd's
own runtime reconfiguration (``/usr/local/sbin/memoryctl-etcd-membership``): a member without data
of its own joins a cluster that exists (its dead predecessor under the same peer URL removed,
``member add``, started with ``initial-cluster-state=existing``), one node at a time; members the
inventory dropped are removed (``member remove``) and their etcd stopped. A new cluster's members
still start in the same step (a member reports itself ready only once a quorum has formed).
**Restarts roll**: a changed configuration restarts one member at a time, each waited for
(``etcdctl endpoint health``) before the next, so the cluster never loses its quorum and Patroni
never its leader lock.

- Debian's ``etcd-server`` (3.5 on Debian 13), its own data directory (``/var/lib/etcd/memoryctl``:
  the package's first start with its defaults, a one-member "default" cluster, never meets ours).
- Peer (2380) and client (2379) traffic on the mesh address only, both TLS with client
  certificates from the controller's CA (:mod:`deploy.pki`, ``<secrets>/etcd``): a peer or client
  without a certificate of that CA is refused, the firewall admits the mesh subnet only.
- Started after ``wg-quick@wg0`` (it binds the mesh address).
- Election timing a little slower than etcd's defaults (heartbeat 250 ms, election 2.5 s): the
  defaults assume an idle machine; a node busy with a JVM start or a training night must not
  cost the cluster its leader.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import Directory
from pyinfra.facts.systemd import SystemdStatus
from pyinfra.operations import apt, files, server, systemd

from deploy import ports
from deploy.common import START_RETRIES, after_mesh, exits_zero, inventory, secrets, template
from deploy.pki import CertificateAuthority
from deploy.topology import patroni_enabled

CLIENT_PORT = ports.ETCD_CLIENT
PEER_PORT = ports.ETCD_PEER
METRICS_PORT = ports.ETCD_METRICS  # /metrics and /health, plain HTTP on the mesh address (Prometheus scrapes it)
PKI_DIR = "/etc/etcd/pki"
DATA_DIR = "/var/lib/etcd/memoryctl"
JOIN_ENV = "/var/lib/etcd/memoryctl-join.env"
MEMBERSHIP = "/usr/local/sbin/memoryctl-etcd-membership"
HEARTBEAT_MS = 250
ELECTION_MS = 2500


def members() -> list[str]:
    return inventory().etcd_members()


def is_member() -> bool:
    return patroni_enabled() and host.name in members()


def mesh_ports() -> list[int]:
    return [CLIENT_PORT, PEER_PORT, METRICS_PORT] if is_member() else []


def _mesh(name: str) -> str:
    return str(inventory().nodes[name]["mesh"])


def client_urls(names: list[str] | None = None) -> list[str]:
    """Every member's client URL (what Patroni and operators connect to)."""
    return [f"https://{_mesh(name)}:{CLIENT_PORT}" for name in (members() if names is None else names)]


def peer_url(name: str) -> str:
    return f"https://{_mesh(name)}:{PEER_PORT}"


def initial_cluster() -> str:
    return ",".join(f"{name}={peer_url(name)}" for name in members())


def certificate_files(directory: str, owner: str) -> list[Any]:
    """This node's certificate, key and the CA, owned by ``owner`` (etcd, or postgres for Patroni)."""
    cert = CertificateAuthority(secrets().dir, "etcd").node(host.name, host.data.mesh_address)
    files.directory(name=f"Directory {directory}", path=directory, user=owner, group=owner, mode="750")
    wanted = (("ca.crt", cert.ca, "644"), ("node.crt", cert.cert, "644"), ("node.key", cert.key, "600"))
    return [
        template("pgbackrest/pem.j2", f"{directory}/{name}", pem=content, user=owner, group=owner, mode=mode)
        for name, content, mode in wanted
    ]


def has_data() -> bool:
    """Whether this member has run before with its data (a fresh or recreated node has none)."""
    return host.get_fact(Directory, path=f"{DATA_DIR}/member") is not None


@deploy("etcd")
def etcd() -> None:
    """A declared member: installed, configured, joined (or started with a new cluster), rolled."""
    apt.packages(name="etcd", packages=["etcd-server", "etcd-client"], no_recommends=True)
    pki = certificate_files(PKI_DIR, "etcd")
    config = template(
        "etcd/etcd.default.j2",
        "/etc/default/etcd",
        member=host.name,
        mesh_address=host.data.mesh_address,
        client_port=CLIENT_PORT,
        peer_port=PEER_PORT,
        metrics_port=METRICS_PORT,
        initial_cluster=initial_cluster(),
        token=f"memoryctl-{inventory().name}",
        pki_dir=PKI_DIR,
        data_dir=DATA_DIR,
        heartbeat_ms=HEARTBEAT_MS,
        election_ms=ELECTION_MS,
        mode="644",
    )
    membership_script()
    dropins = [
        after_mesh("etcd", "etcd"),
        template("etcd/join.conf.j2", "/etc/systemd/system/etcd.service.d/join.conf", join_env=JOIN_ENV, mode="644"),
    ]
    systemd.daemon_reload(
        name="Reload systemd units (etcd drop-ins)", _if=lambda: any(op.did_change() for op in dropins)
    )
    files.directory(name=f"Directory {DATA_DIR}", path=DATA_DIR, user="etcd", group="etcd", mode="700")
    changes = [config, *dropins, *pki]
    if has_data():
        # A running cluster: one member at a time, each healthy again before the next.
        server.shell(
            name="Restart etcd, one member at a time (each healthy before the next)",
            commands=["systemctl reset-failed etcd.service", "systemctl restart etcd.service", _wait_healthy()],
            _if=lambda: any(op.did_change() for op in changes),
            _serial=True,
            **START_RETRIES,
        )
    else:
        # No data: join the cluster that exists, one node at a time (etcd adds one member at a time:
        # two added at once would need both to start before the quorum holds again) ...
        server.shell(
            name="Join the etcd cluster when it exists (member add; one node at a time)",
            commands=[f"{MEMBERSHIP} join"],
            _serial=True,
        )
        # ... or, when none answered, start a new cluster: every member in this same step.
        server.shell(
            name="Start etcd with a new cluster (every member in the same step)",
            commands=[
                f"[ -d {DATA_DIR}/member ] || {{ systemctl reset-failed etcd.service;"
                " systemctl restart etcd.service; }"
            ],
            **START_RETRIES,
        )
    systemd.service(name="etcd running and enabled", service="etcd", running=True, enabled=True, **START_RETRIES)


def membership_script() -> Any:
    return template(
        "etcd/membership.py.j2",
        MEMBERSHIP,
        member=host.name,
        peer_url=peer_url(host.name),
        client_url=f"https://{host.data.mesh_address}:{CLIENT_PORT}",
        other_client_urls=client_urls([name for name in members() if name != host.name]),
        declared_peer_urls=[peer_url(name) for name in members()],
        declared_client_urls=client_urls(),
        data_dir=DATA_DIR,
        join_env=JOIN_ENV,
        pki_dir=PKI_DIR,
        mode="755",
    )


def health_command() -> str:
    """One ``endpoint health`` of this node's member (exit 0: healthy), with its own certificate."""
    tls = f"--cacert={PKI_DIR}/ca.crt --cert={PKI_DIR}/node.crt --key={PKI_DIR}/node.key"
    local = f"https://{host.data.mesh_address}:{CLIENT_PORT}"
    return f"etcdctl --endpoints={local} {tls} --dial-timeout=1s endpoint health >/dev/null 2>&1"


def _wait_healthy(seconds: int = 120) -> str:
    return (
        f"for i in $(seq {seconds}); do {health_command()} && exit 0; sleep 1; done; echo 'etcd on {host.name}"
        f" not healthy {seconds} s after its restart: journalctl -u etcd' >&2; exit 1"
    )


def prune_members() -> None:
    """Members the inventory no longer declares removed from etcd (on the first declared member,
    once every member has had its turn); decided when the step runs, so a run with nothing to remove
    changes nothing."""
    if host.name != members()[0]:
        return
    server.shell(
        name="Remove etcd members the inventory no longer declares (member remove)",
        commands=[f"{MEMBERSHIP} prune"],
        _if=lambda: exits_zero(f"{MEMBERSHIP} prune --check"),
    )


def stop_former_member() -> None:
    """A node that is no longer a declared member: its etcd (removed from the cluster by
    :func:`prune_members`) stopped and disabled, its data moved aside."""
    if host.name in members() or not host.get_fact(SystemdStatus).get("etcd.service", False):
        return
    server.shell(
        name="Stop etcd: this node is no longer a declared member",
        commands=[
            "systemctl disable --now etcd.service",
            f"[ ! -d {DATA_DIR} ] || mv {DATA_DIR} {DATA_DIR}.removed-$(date +%Y%m%d%H%M%S)",
        ],
    )
