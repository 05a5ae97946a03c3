"""Neo4j Community from its release tarball, bound to the mesh.

``components.neo4j.source`` is the tarball's URL and sha256 (:mod:`deploy.artefacts`): Neo4j's
official ``neo4j-community-<version>-unix.tar.gz`` in production; on the local nodes the archive
``scripts/neo4j-artefact`` assembles from Maven Central in the same layout
(``neo4j-community-<version>/{bin,lib}``), served by the controller's stand-in. Either way it is
unpacked into ``/opt/neo4j/<version>`` (keyed on the version), linked as ``/usr/share/neo4j``,
and run by one unit as the ``neo4j`` user on the release's Java (:mod:`deploy.osrelease`) with
``NEO4J_HOME`` = the install and ``NEO4J_CONF=/etc/neo4j``; every writable directory is named in
``/etc/neo4j/neo4j.conf`` (under ``/var/lib/neo4j`` and ``/var/log/neo4j``), rendered whole from
one template (listen addresses on the mesh, heap, page cache). A drop-in orders the service after
the mesh. The initial password of the ``neo4j`` user is set from the controller's secrets while
the system database does not exist yet — checked on every run, so a run that failed after the
install still sets it before the first start — read from a file, never a command line.
``enabled: false`` installs nothing.
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host, state
from pyinfra.api import Host, deploy
from pyinfra.api.command import StringCommand
from pyinfra.facts.files import Directory, File
from pyinfra.operations import apt, files, python, server, systemd

from deploy import ports, versions
from deploy.artefacts import ArtefactSourceError, install_archive, resolve
from deploy.common import (
    after_mesh,
    components,
    inventory,
    keep_running,
    secrets,
    service_account,
    service_config,
    template,
    with_secret_file,
)
from deploy.osrelease import release

PREFIX = "/opt/neo4j"
INSTALL_DIR = "/usr/share/neo4j"  # a link to the installed version
HOME = "/var/lib/neo4j"
CONF_DIR = "/etc/neo4j"
LOG_DIR = "/var/log/neo4j"
RUN_DIR = "/run/neo4j"  # the PID file: gone at every boot (tmpfs)
TMPFILES = "/etc/tmpfiles.d/neo4j-memoryctl.conf"
# Written before a new store's first start, removed by the db node once the graph was rebuilt from
# PostgreSQL (or found nothing to rebuild): :func:`rebuild_where_blank`.
REBUILD_MARKER = f"{HOME}/.memoryctl-graph-rebuild-pending"


def conf_context(version: str) -> dict[str, object]:
    settings = components().neo4j
    return {
        "run_dir": RUN_DIR,
        "mesh_address": host.data.mesh_address,
        "heap": settings.heap,
        "pagecache": settings.pagecache,
        "jvm_additional": list(settings.jvm_additional),
        "home": HOME,
        "log_dir": LOG_DIR,
        "install_dir": INSTALL_DIR,
        "conf_dir": CONF_DIR,
        "version": version,
        "bolt_port": ports.NEO4J_BOLT,
        "http_port": ports.NEO4J_HTTP,
    }


def admin_command(args: str) -> str:
    """``neo4j-admin ARGS`` as the service runs Neo4j (same home and config)."""
    return f"NEO4J_CONF={CONF_DIR} NEO4J_HOME={INSTALL_DIR} {INSTALL_DIR}/bin/neo4j-admin {args}"


@deploy("Neo4j")
def neo4j() -> None:
    settings = components().neo4j
    if not settings.enabled:
        host.noop("neo4j: disabled in the inventory")
        return
    version = versions.version("neo4j", settings.version)
    context = conf_context(version)
    artefact = resolve("neo4j", settings.source, version=version)
    if artefact is None:
        raise ArtefactSourceError("neo4j.source: give the release tarball's url and sha256 (docs/deploy.md)")
    apt.packages(
        name="Java, tools to unpack release archives", packages=[release().java, "tar", "gzip"], no_recommends=True
    )
    service_account("neo4j", HOME, {HOME: "750", **{f"{HOME}/{sub}": "750" for sub in ("data", "plugins", "import")}})
    files.directory(name=f"Directory {LOG_DIR}", path=LOG_DIR, user="neo4j", group="neo4j", mode="750")
    # The PID file on a tmpfs (/run), made again at every boot: after a power loss the stale one on
    # disk named a PID some other process held after the reboot, and Neo4j refused to start ("Neo4j
    # is already running (pid:151)"; found by the failover drill, tests/deploy/test_ha.py).
    tmpfiles = files.put(
        name="tmpfiles.d: Neo4j's run directory",
        src=StringIO(f"d {RUN_DIR} 0750 neo4j neo4j -\n"),
        dest=TMPFILES,
        mode="644",
    )
    server.shell(name=f"Create {RUN_DIR}", commands=[f"systemd-tmpfiles --create {TMPFILES}"], _if=tmpfiles.did_change)
    files.directory(name="Config directory", path=CONF_DIR, user="root", group="neo4j", mode="750")
    files.directory(name="Install prefix", path=PREFIX, mode="755")
    install_archive(artefact, f"{PREFIX}/{version}", strip=1)
    link = files.link(name=f"{INSTALL_DIR} is Neo4j {version}", path=INSTALL_DIR, target=f"{PREFIX}/{version}")
    unit = template("neo4j/neo4j.service.j2", "/etc/systemd/system/neo4j.service", **context)
    dropin = after_mesh("neo4j", "Neo4j")
    systemd.daemon_reload(name="Reload systemd units (neo4j)", _if=lambda: unit.did_change() or dropin.did_change())
    conf = service_config("neo4j/neo4j.conf.j2", f"{CONF_DIR}/neo4j.conf", "neo4j", **context)
    if not has_store(host):
        files.put(
            name="Graph rebuild pending (a new store: the db node rebuilds it from PostgreSQL)",
            src=StringIO("written by the memoryctl deploy before this Neo4j's first start (deploy/neo4j.py)\n"),
            dest=REBUILD_MARKER,
            mode="644",
        )
        # Only before the first start does the password take effect (the system database records it).
        with_secret_file(
            "Initial neo4j password (the system database does not exist yet)",
            secrets().token("neo4j/password"),
            admin_command('dbms set-initial-password -- "$(cat {file})"'),
            user="neo4j",
        )
    keep_running("neo4j", [conf, dropin, link, unit])


def has_store(node: Host) -> bool:
    """Whether ``node``'s Neo4j has started before (its system database exists): a node installed
    or recreated blank in this run has none."""
    return node.get_fact(Directory, path=f"{HOME}/data/databases/system") is not None


def needs_rebuild(node: Host) -> bool:
    """A Neo4j without a store yet, or one whose rebuild from PostgreSQL has not happened since its
    store was made (the marker is written before its first start, cleared once the graph is whole:
    a run that failed in between rebuilds on the next run)."""
    return not has_store(node) or node.get_fact(File, path=REBUILD_MARKER) is not None


def rebuild_where_blank() -> None:
    """On the ``db`` node (memoryctl's): the graph rebuilt from PostgreSQL when an ``index`` node's
    Neo4j started blank (a replaced node, docs/operations.md) and PostgreSQL holds memories; a new
    stack (no memories yet) only clears the markers. Called after a barrier: every index node's
    Neo4j runs by then. Writes go on meanwhile: the rebuild is idempotent and the outbox delivers
    what is written during it."""
    index = [state.inventory.get_host(name) for name in inventory().group("index")]
    blank = [node for node in index if needs_rebuild(node)]
    if not components().neo4j.enabled or not blank:
        return
    has_memories = "sudo -u postgres psql -d memoryctl -XAtc 'SELECT 1 FROM memories LIMIT 1' 2>/dev/null | grep -q 1"
    memories = lambda: bool(host.run_shell_command(StringCommand(has_memories))[0])  # noqa: E731
    rebuild = server.shell(
        name="Rebuild the graph from PostgreSQL (an index node's Neo4j started blank)",
        commands=[
            # The JVM of a new Neo4j may still be starting: rebuild retries until the graph answers.
            "cd /var/lib/memoryctl && for i in $(seq 30); do sudo -u memoryctl memoryctl rebuild graph && exit 0;"
            " sleep 10; done; exit 1"
        ],
        _if=memories,
    )
    python.call(
        name="The graph is whole: clear the index nodes' rebuild markers",
        function=_clear_markers,
        nodes=blank,
        _if=lambda: rebuild.did_change() or not memories(),
    )


def _clear_markers(nodes: list[Host]) -> None:
    for node in nodes:
        ok, output = node.run_shell_command(StringCommand(f"rm -f {REBUILD_MARKER}"), _sudo=True)
        if not ok:
            raise RuntimeError(f"{node.name}: could not remove {REBUILD_MARKER}: {output.stderr}")
