"""Qdrant from its release archive, one peer per node of ``components.qdrant.peers``, over the mesh.

With more than one peer they form one cluster (Raft consensus, p2p port 6335 on the mesh address
only, firewalled to the mesh): the first ``index`` node bootstraps a new one (``--uri``), the others
join it (``--bootstrap``; ignored once a peer has its own Raft state, so restarts are plain).
Collections are sharded and replicated by memoryctl when it creates them (``[qdrant] shard_number``
/ ``replication_factor`` in memoryctl.toml), so losing one node loses no data and no answers.

**The peers are declared state** (docs/operations.md, "Replace a node", "Add a node"): a peer
without Raft state of its own joins the cluster that exists through any answering peer, after the
lost peer registered under its URI is removed from the consensus (``memoryctl-qdrant-start``, the
unit's ExecStart: Qdrant's node-failure-recovery procedure); then, once every peer runs, one peer
places the replicas (``memoryctl-qdrant-replicas``): shards re-replicated up to each collection's
replication factor, replicas moved off peers the inventory dropped (which are then removed from
the cluster and stopped), and the declared peers evened out per collection within one replica.

The archive (``source: {url, sha256}``) is unpacked into ``/opt/qdrant/<version>`` (keyed on that
directory's marker, see :mod:`deploy.artefacts`). Its glibc floor is checked twice: at plan time
from data (the archive's target, :data:`deploy.versions.QDRANT_GLIBC_FLOOR`, against the node's
release), and on the node before the new directory is marked installed, from the binary's own
symbol versions (``GLIBC_x.y``) against the node's glibc. The unit names the versioned binary, so a
version change is a unit change.

A change that needs a restart (binary, config, unit) restarts the peers **one at a time**: each
peer is restarted and the run waits, on that node, until it answers and every replica of every
collection is ``Active`` again (``/usr/local/sbin/memoryctl-qdrant-wait-active``), before the
next peer's restart — the cluster keeps answering throughout. Snapshots go to
``/var/lib/qdrant/snapshots`` (where a backup job picks them up).
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.command import StringCommand
from pyinfra.facts.systemd import SystemdStatus
from pyinfra.operations import apt, files, server, systemd

from deploy import ports, versions
from deploy.artefacts import install_archive, resolve
from deploy.common import START_RETRIES, components, inventory, secrets, service_account, service_config, template
from deploy.osrelease import release

PREFIX = "/opt/qdrant"
CONFIG = "/etc/qdrant/config.yaml"
DATA_DIR = "/var/lib/qdrant"
UNIT = "/etc/systemd/system/qdrant.service"
WAIT_ACTIVE = "/usr/local/sbin/memoryctl-qdrant-wait-active"
START = "/usr/local/sbin/memoryctl-qdrant-start"
REPLICAS = "/usr/local/sbin/memoryctl-qdrant-replicas"
P2P_PORT = ports.QDRANT_P2P
# Run in the unpacked directory before it is marked installed: the binary's newest GLIBC_x.y
# symbol version must not be newer than the node's glibc (none at all: a static musl binary).
GLIBC_CHECK = (
    "need=$(grep -aoE 'GLIBC_[0-9]+[.][0-9]+' qdrant | cut -d_ -f2 | sort -uV | tail -n1);"
    " have=$(getconf GNU_LIBC_VERSION | cut -d' ' -f2);"
    ' if [ -n "$need" ] && [ "$(printf "%s\\n%s\\n" "$need" "$have" | sort -V | tail -n1)" != "$have" ];'
    ' then echo "qdrant: this binary needs glibc $need, the node has $have: take the -musl archive" >&2; exit 1; fi'
)


def peers() -> list[str]:
    return inventory().qdrant_peers()


def collection_layout() -> dict[str, int] | None:
    """How memoryctl creates collections on a cluster (``[qdrant]`` in memoryctl.toml), None on one peer.

    Defaults: one shard per peer, each held by 2 peers, a write acknowledged by 1 of them; losing
    any one peer then loses no shard, and writes keep landing. The inventory may override each.
    """
    count = len(peers())
    if count < 2:
        return None
    settings = components().qdrant
    return {
        "shard_number": count if settings.shard_number is None else settings.shard_number,
        "replication_factor": settings.replication_factor,
        "write_consistency_factor": settings.write_consistency_factor,
    }


def unit_context(version: str) -> dict[str, object]:
    """Template variables shared by the config and the unit."""
    all_peers = peers()
    cluster_mode = len(all_peers) > 1
    nodes = inventory().nodes
    first = nodes[all_peers[0]]["mesh"]
    return {
        "mesh_address": host.data.mesh_address,
        "interface": host.data.mesh.get("interface", "wg0"),
        "data_dir": DATA_DIR,
        "config_path": CONFIG,
        "binary": f"{PREFIX}/{version}/qdrant",
        "version": version,
        "http_port": ports.QDRANT_HTTP,
        "grpc_port": ports.QDRANT_GRPC,
        "cluster_mode": cluster_mode,
        "p2p_port": P2P_PORT,
        "bootstrap": f"http://{first}:{P2P_PORT}" if cluster_mode and host.name != all_peers[0] else None,
        "start": START,
        "other_peers": [
            [f"http://{nodes[name]['mesh']}:{ports.QDRANT_HTTP}", f"http://{nodes[name]['mesh']}:{P2P_PORT}"]
            for name in all_peers
            if name != host.name
        ],
        "log_level": components().qdrant.log_level,
    }


@deploy("Qdrant")
def qdrant() -> None:
    settings = components().qdrant
    version = versions.version("qdrant", settings.version)
    source = settings.source
    artefact = resolve("qdrant", source, version=version)
    if artefact is None or source is None:
        host.noop("qdrant: source is null, nothing to install (configs are validated by the unit tests)")
        return
    versions.check_glibc(release(), artefact.url, source.glibc_floor)
    context = unit_context(version)
    apt.packages(name="Tools to unpack release archives", packages=["tar", "xz-utils"], no_recommends=True)
    service_account("qdrant", DATA_DIR)
    files.directory(name="Install prefix", path=PREFIX, mode="755")
    install_archive(artefact, f"{PREFIX}/{version}", check=GLIBC_CHECK)
    config = service_config(
        "qdrant/config.yaml.j2", CONFIG, "qdrant", api_key=secrets().token("qdrant/api_key"), **context
    )
    unit = template("qdrant/qdrant.service.j2", UNIT, **context)
    template(
        "qdrant/wait-active.py.j2", WAIT_ACTIVE, config_path=CONFIG, mesh_address=host.data.mesh_address, mode="755"
    )
    if context["cluster_mode"]:
        template("qdrant/start.py.j2", START, mode="755", **context)
        template(
            "qdrant/replicas.py.j2",
            REPLICAS,
            config_path=CONFIG,
            mesh_address=host.data.mesh_address,
            declared_uris=[f"http://{inventory().nodes[name]['mesh']}:{P2P_PORT}" for name in peers()],
            mode="755",
        )
    systemd.daemon_reload(name="Reload systemd units", _if=unit.did_change)
    running = host.get_fact(SystemdStatus).get("qdrant.service", False)
    systemd.service(name="qdrant running and enabled", service="qdrant", running=True, enabled=True, **START_RETRIES)
    if not running:
        # A unit that starts is not a peer that works (Type=simple; the launcher may also refuse):
        # the run fails here, naming the journal, rather than reporting success.
        server.shell(
            name="Wait until this peer answers as a cluster member", commands=[f"{WAIT_ACTIVE} --joined --timeout 300"]
        )
    if running:
        server.shell(
            name="Restart qdrant, one peer at a time (every replica Active before the next)",
            commands=["systemctl restart qdrant.service", f"{WAIT_ACTIVE} --timeout 600"],
            _if=lambda: config.did_change() or unit.did_change(),
            _serial=True,
        )


def place_replicas() -> None:
    """Shard replicas as the declared peers need them, on the peer memoryctl talks to, once every
    peer runs (called after a barrier); decided when the step runs (``--check``), so a run with
    every replica placed changes nothing."""
    if len(peers()) < 2 or host.name != _placing_peer():
        return
    server.shell(
        name="Qdrant: shard replicas on the declared peers (re-replicate, drain, even out)",
        commands=[f"{REPLICAS} --timeout 1800"],
        _if=lambda: host.run_shell_command(StringCommand(f"{REPLICAS} --check"))[0],
    )


def _placing_peer() -> str:
    endpoint = inventory().qdrant_endpoint()
    return next(name for name in peers() if inventory().nodes[name]["mesh"] == endpoint)


def stop_former_peer() -> None:
    """A node that is no longer a declared peer: its Qdrant (drained and removed from the cluster by
    :func:`place_replicas`) stopped and disabled; its data stays where it was."""
    if host.name in peers() or not host.get_fact(SystemdStatus).get("qdrant.service", False):
        return
    systemd.service(
        name="Stop qdrant: this node is no longer a declared peer", service="qdrant", running=False, enabled=False
    )
