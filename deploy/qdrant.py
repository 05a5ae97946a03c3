"""Qdrant from its release archive: config with API key, systemd unit, bound to the mesh address.

With ``cluster_mode: true`` every ``index`` node runs a peer on port 6335 over the mesh; the first
one bootstraps the cluster, the others join it with ``--bootstrap``. The source of the release
archive is configurable (:mod:`deploy.artefacts`); with ``source: null`` nothing is installed.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, server, systemd

from deploy.artefacts import fetch, validate
from deploy.common import component, inventory, secrets, template

PREFIX = "/opt/qdrant"
CONFIG = "/etc/qdrant/config.yaml"
DATA_DIR = "/var/lib/qdrant"
UNIT = "/etc/systemd/system/qdrant.service"


def unit_context() -> dict[str, object]:
    """Template variables shared by the config and the unit."""
    settings = component("qdrant")
    index_nodes = inventory().group("index")
    cluster_mode = bool(settings.get("cluster_mode", False)) and len(index_nodes) > 1
    first = inventory().nodes[index_nodes[0]]["mesh"]
    bootstrap = f"http://{first}:6335" if cluster_mode and host.name != index_nodes[0] else None
    return {
        "mesh_address": host.data.mesh_address,
        "interface": host.data.mesh.get("interface", "wg0"),
        "data_dir": DATA_DIR,
        "config_path": CONFIG,
        "binary": f"{PREFIX}/qdrant",
        "cluster_mode": cluster_mode,
        "bootstrap": bootstrap,
    }


@deploy("Qdrant")
def qdrant() -> None:
    settings = component("qdrant")
    source = validate("qdrant", settings.get("source"))
    if source is None:
        host.noop("qdrant: source is null, nothing to install (configs are validated by the unit tests)")
        return
    context = unit_context()
    server.group(name="Group qdrant", group="qdrant", system=True)
    server.user(
        name="User qdrant",
        user="qdrant",
        group="qdrant",
        system=True,
        home=DATA_DIR,
        shell="/usr/sbin/nologin",
    )
    files.directory(name="Data directory", path=DATA_DIR, user="qdrant", group="qdrant", mode="750")
    files.directory(name="Install prefix", path=PREFIX, mode="755")
    archive = fetch("qdrant", source, archive_path(settings))
    unpacked = server.shell(
        name="Unpack qdrant",
        commands=[f"tar -xzf {archive_path(settings)} -C {PREFIX} qdrant"],
        _if=archive.did_change,
    )
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
    systemd.service(name="qdrant running and enabled", service="qdrant", running=True, enabled=True)
    systemd.service(
        name="Restart qdrant (config, unit or binary changed)",
        service="qdrant",
        restarted=True,
        _if=lambda: config.did_change() or unit.did_change() or unpacked.did_change(),
    )


def archive_path(settings: dict[str, object]) -> str:
    return f"{PREFIX}/qdrant-{settings.get('version', 'release')}.tar.gz"
