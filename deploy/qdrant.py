"""Qdrant from its release archive, one peer per node of ``components.qdrant.peers``, over the mesh.

With more than one peer they form one cluster (Raft consensus, p2p port 6335 on the mesh address
only, firewalled to the mesh): the first ``index`` node bootstraps it (``--uri``), the others join
it (``--bootstrap``; ignored once a peer has its own Raft state, so restarts are plain). Collections
are sharded and replicated by memoryctl when it creates them (``[qdrant] shard_number`` /
``replication_factor`` in memoryctl.toml), so losing one node loses no data and no answers.

The binary is unpacked into ``/opt/qdrant/<version>`` (keyed on that directory's marker, see
:mod:`deploy.artefacts`); the unit names the versioned binary, so a version change is a unit change
and restarts the peer. Snapshots go to ``/var/lib/qdrant/snapshots`` (Qdrant's snapshot API; where a
backup job picks them up). ``source: null`` installs nothing.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server, systemd

from deploy import versions
from deploy.artefacts import install_archive, resolve
from deploy.common import component, inventory, keep_running, secrets, template

PREFIX = "/opt/qdrant"
CONFIG = "/etc/qdrant/config.yaml"
DATA_DIR = "/var/lib/qdrant"
UNIT = "/etc/systemd/system/qdrant.service"
P2P_PORT = 6335


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
    settings = component("qdrant")
    return {
        "shard_number": int(settings.get("shard_number", count)),
        "replication_factor": int(settings.get("replication_factor", 2)),
        "write_consistency_factor": int(settings.get("write_consistency_factor", 1)),
    }


def unit_context(version: str) -> dict[str, object]:
    """Template variables shared by the config and the unit."""
    all_peers = peers()
    cluster_mode = len(all_peers) > 1
    first = inventory().nodes[all_peers[0]]["mesh"]
    return {
        "mesh_address": host.data.mesh_address,
        "interface": host.data.mesh.get("interface", "wg0"),
        "data_dir": DATA_DIR,
        "config_path": CONFIG,
        "binary": f"{PREFIX}/{version}/qdrant",
        "version": version,
        "cluster_mode": cluster_mode,
        "p2p_port": P2P_PORT,
        "bootstrap": f"http://{first}:{P2P_PORT}" if cluster_mode and host.name != all_peers[0] else None,
    }


@deploy("Qdrant")
def qdrant() -> None:
    settings = component("qdrant")
    version = versions.version("qdrant", settings)
    artefact = resolve("qdrant", settings.get("source"), version=version)
    if artefact is None:
        host.noop("qdrant: source is null, nothing to install (configs are validated by the unit tests)")
        return
    context = unit_context(version)
    apt.packages(name="Tools to unpack release archives", packages=["tar", "xz-utils"], no_recommends=True)
    server.group(name="Group qdrant", group="qdrant", system=True)
    server.user(
        name="User qdrant",
        user="qdrant",
        group="qdrant",
        system=True,
        home=DATA_DIR,
        shell="/usr/sbin/nologin",
        create_home=False,
    )
    files.directory(name="Data directory", path=DATA_DIR, user="qdrant", group="qdrant", mode="750")
    files.directory(name="Install prefix", path=PREFIX, mode="755")
    install_archive(artefact, f"{PREFIX}/{version}")
    config = template(
        "qdrant/config.yaml.j2",
        CONFIG,
        api_key=secrets().token("qdrant/api_key"),
        user="root",
        group="qdrant",
        mode="640",
        **context,
    )
    unit = template("qdrant/qdrant.service.j2", UNIT, **context)
    systemd.daemon_reload(name="Reload systemd units", _if=unit.did_change)
    keep_running("qdrant", [config, unit])
