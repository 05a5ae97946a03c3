"""Neo4j Community, bound to the mesh: from its apt repository, or from a release-style archive.

- ``source: null`` (Hetzner): Neo4j's apt repository (dearmored keyring, ``signed-by``), the
  ``neo4j`` package pinned to :data:`deploy.versions.NEO4J`, Java 17 from Debian. The package brings
  its user, directories and unit.
- ``source: {file|artefact|url}`` (the local nodes: ``scripts/neo4j-artefact`` assembles it from
  Maven Central): unpacked into ``/opt/neo4j/<version>`` (keyed on the version, see
  :mod:`deploy.artefacts`), linked as ``/usr/share/neo4j`` where the package would put it, with the
  package's user, directories and an equivalent unit. The same ``neo4j console`` / ``neo4j-admin``
  command lines run it.

Either way ``/etc/neo4j/neo4j.conf`` is rendered whole from one template (listen addresses on the
mesh, heap, page cache), a drop-in orders the service after the mesh, and the initial password of
the ``neo4j`` user is set from the controller's secrets while the system database does not exist
yet — checked on every run, so a run that failed after the install still sets it before the first
start. ``enabled: false`` installs nothing.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import HiddenValue, StringCommand, deploy
from pyinfra.facts.files import Directory
from pyinfra.operations import apt, files, server, systemd

from deploy import versions
from deploy.artefacts import Artefact, install_archive, resolve
from deploy.common import apt_repository, component, keep_running, secrets, template

KEY_URL = "https://debian.neo4j.com/neotechnology.gpg.key"
REPO_URI = "https://debian.neo4j.com"
INSTALL_DIR = "/usr/share/neo4j"  # the Debian package's, reproduced by the archive install
HOME = "/var/lib/neo4j"
CONF_DIR = "/etc/neo4j"
LOG_DIR = "/var/log/neo4j"
JAVA = "openjdk-17-jre-headless"


def conf_context(version: str) -> dict[str, object]:
    settings = component("neo4j")
    return {
        "mesh_address": host.data.mesh_address,
        "heap": settings.get("heap", "2g"),
        "pagecache": settings.get("pagecache", "2g"),
        "jvm_additional": list(settings.get("jvm_additional", [])),
        "home": HOME,
        "install_dir": INSTALL_DIR,
        "conf_dir": CONF_DIR,
        "version": version,
    }


@deploy("Neo4j")
def neo4j() -> None:
    settings = component("neo4j")
    if not settings.get("enabled", True):
        host.noop("neo4j: disabled in the inventory, nothing to install")
        return
    version = versions.version("neo4j", settings)
    context = conf_context(version)
    artefact = resolve("neo4j", settings.get("source"), version=version)
    if artefact is None:
        apt_repository("neo4j", settings.get("key_url", KEY_URL), settings.get("repo_uri", REPO_URI), "stable", "5")
        pin = versions.NEO4J_APT.format(version=version)
        installed = [
            apt.packages(name=f"Neo4j {version} and Java 17", packages=[JAVA, f"neo4j={pin}"], no_recommends=True)
        ]
    else:
        installed = archive_install(artefact, version, context)
    dropin = template(
        "wireguard/after-mesh.conf.j2",
        "/etc/systemd/system/neo4j.service.d/memoryctl.conf",
        service="Neo4j",
        interface=host.data.mesh.get("interface", "wg0"),
    )
    systemd.daemon_reload(name="Reload systemd units (neo4j drop-in)", _if=dropin.did_change)
    conf = template("neo4j/neo4j.conf.j2", f"{CONF_DIR}/neo4j.conf", user="root", group="neo4j", mode="640", **context)
    if not host.get_fact(Directory, path=f"{HOME}/data/databases/system"):
        # Only before the first start does the password take effect (the system database records it).
        server.shell(
            name="Initial neo4j password (the system database does not exist yet)",
            commands=[
                StringCommand(
                    f"NEO4J_CONF={CONF_DIR} NEO4J_HOME={HOME} {INSTALL_DIR}/bin/neo4j-admin dbms set-initial-password",
                    StringCommand("'", HiddenValue(secrets().token("neo4j/password")), "'", _separator=""),
                )
            ],
            _sudo=True,
            _sudo_user="neo4j",
        )
    keep_running("neo4j", [conf, dropin, *installed], package_starts_it=artefact is None)


def archive_install(artefact: Artefact, version: str, context: dict[str, object]) -> list[Any]:
    """User, directories, the unpacked archive linked as INSTALL_DIR, and the unit: what the Debian
    package would have made. Returns the operations whose change needs a restart."""
    apt.packages(name="Java 17, tools to unpack release archives", packages=[JAVA, "tar", "gzip"], no_recommends=True)
    server.group(name="Group neo4j", group="neo4j", system=True)
    server.user(
        name="User neo4j",
        user="neo4j",
        group="neo4j",
        system=True,
        home=HOME,
        shell="/usr/sbin/nologin",
        create_home=False,
    )
    for path in (HOME, *(f"{HOME}/{sub}" for sub in ("data", "plugins", "import", "run")), LOG_DIR):
        files.directory(name=f"Directory {path}", path=path, user="neo4j", group="neo4j", mode="750")
    files.directory(name="Config directory", path=CONF_DIR, user="root", group="neo4j", mode="750")
    files.directory(name="Install prefix", path="/opt/neo4j", mode="755")
    install_archive(artefact, f"/opt/neo4j/{version}", strip=1)
    link = files.link(name=f"{INSTALL_DIR} is Neo4j {version}", path=INSTALL_DIR, target=f"/opt/neo4j/{version}")
    unit = template("neo4j/neo4j.service.j2", "/etc/systemd/system/neo4j.service", **context)
    systemd.daemon_reload(name="Reload systemd units (neo4j)", _if=unit.did_change)
    return [link, unit]
