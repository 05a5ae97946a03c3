"""Neo4j Community from its apt repository: Java, auth, memory settings, bound to the mesh.

``/etc/neo4j/neo4j.conf`` is rendered whole from the template (directories as the Debian package
lays them out, listen addresses on the mesh, heap and page cache). The initial password of the
``neo4j`` user is set once, right after the package is installed, from the controller's secrets.
``enabled: false`` (the local nodes: the repository is not reachable) installs nothing.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import HiddenValue, StringCommand, deploy
from pyinfra.operations import apt, server, systemd

from deploy.common import apt_repository, component, secrets, template

KEY_URL = "https://debian.neo4j.com/neotechnology.gpg.key"
REPO_LINE = "deb https://debian.neo4j.com stable 5"


def conf_context() -> dict[str, object]:
    settings = component("neo4j")
    return {
        "mesh_address": host.data.mesh_address,
        "heap": settings.get("heap", "2g"),
        "pagecache": settings.get("pagecache", "2g"),
    }


@deploy("Neo4j")
def neo4j() -> None:
    settings = component("neo4j")
    if not settings.get("enabled", True):
        host.noop("neo4j: disabled in the inventory, nothing to install")
        return
    apt_repository("neo4j", settings.get("key_url", KEY_URL), settings.get("repo", REPO_LINE))
    installed = apt.packages(name="Neo4j and Java", packages=["openjdk-17-jre-headless", "neo4j"], no_recommends=True)
    server.shell(
        name="Initial neo4j password",
        commands=[
            StringCommand(
                "neo4j-admin dbms set-initial-password",
                StringCommand("'", HiddenValue(secrets().token("neo4j/password")), "'", _separator=""),
            )
        ],
        _sudo=True,
        _sudo_user="neo4j",
        _if=installed.did_change,
    )
    conf = template(
        "neo4j/neo4j.conf.j2",
        "/etc/neo4j/neo4j.conf",
        user="neo4j",
        group="neo4j",
        mode="640",
        **conf_context(),
    )
    systemd.service(name="neo4j running and enabled", service="neo4j", running=True, enabled=True)
    systemd.service(
        name="Restart neo4j (config changed)",
        service="neo4j",
        restarted=True,
        _if=lambda: conf.did_change(),
    )
