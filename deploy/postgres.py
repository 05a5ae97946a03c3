"""PostgreSQL (+ TimescaleDB), bound to the mesh. The major is the release's, the code is the same.

- The server is Debian's ``postgresql-<major>`` of the node's release (:mod:`deploy.osrelease`:
  17 on Debian 13), on both paths. A node that holds a cluster of another major (the release was
  upgraded under it) is refused at plan time with the upgrade to run first (``pg_upgradecluster``,
  docs/deploy.md "PostgreSQL major upgrade"): the deploy never creates a second, empty cluster
  beside the data.
- ``listen_addresses`` = localhost + the node's mesh address; ``pg_hba.conf`` admits the memoryctl
  role from loopback and the mesh subnet only (scram-sha-256). The server starts after
  ``wg-quick@wg0`` (a drop-in) so the mesh address exists when it binds.
- A changed ``conf.d/memoryctl.conf`` restarts the server, and so does a running server that has
  not loaded a library the file preloads (a run that failed between the two); a changed
  ``pg_hba.conf`` only reloads it.
- TimescaleDB (``components.timescaledb``): ``timescaledb-2-postgresql-<major>`` from the apt
  repository ``sources.apt.timescaledb`` (Timescale's in production, the controller's signed
  stand-in on the local nodes), pinned to :data:`deploy.versions.TIMESCALEDB` under the
  repository's version scheme. Preloaded; ``CREATE EXTENSION`` while the database lacks it; and
  after a version change the server is restarted and ``ALTER EXTENSION timescaledb UPDATE`` runs
  (the first statement of its own session, Timescale's documented step) — both asked of the
  database every run, so an upgrade killed half-way is finished by the next run.
- The memoryctl role is created with a SCRAM verifier computed on the controller, read by ``psql``
  from a 0600 file: the password is never on a command line (sudo logs those).
"""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import FactBase, deploy
from pyinfra.facts.postgres import PostgresRoles
from pyinfra.facts.server import Users
from pyinfra.operations import apt, postgres, server, systemd

from deploy import aptsources, patroni, patroni_settings, ports, versions
from deploy.common import START_RETRIES, after_mesh, components, secrets, template, with_secret_file
from deploy.facts import PostgresAnswers, PostgresExtensions, PostgresPreloaded, PostgresRoleMemberships
from deploy.osrelease import release
from deploy.scram import scram_verifier

DATABASE = "memoryctl"
ROLE = "memoryctl"
MONITOR = "pg_monitor"
AS_POSTGRES = {"_sudo": True, "_sudo_user": "postgres"}


class PostgresSettingsError(ValueError):
    """``components.postgres`` / ``components.timescaledb`` that cannot be deployed as written."""


class PostgresClusters(FactBase[dict[str, list[str]]]):
    """``{major: [cluster names]}`` from ``pg_lsclusters`` (empty before PostgreSQL is installed)."""

    def default(self) -> dict[str, list[str]]:
        return {}

    def requires_command(self, *args: object, **kwargs: object) -> str:
        return "pg_lsclusters"

    def command(self) -> str:
        return "pg_lsclusters -h 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, list[str]]:
        clusters: dict[str, list[str]] = {}
        for line in output:
            fields = line.split()
            if len(fields) >= 2:
                clusters.setdefault(fields[0], []).append(fields[1])
        return clusters


def major() -> int:
    """The release's PostgreSQL major; an inventory that states another one is refused."""
    value = release().postgres
    stated = components().postgres.version
    if stated is not None and stated != value:
        raise PostgresSettingsError(
            f"postgres.version {stated}: {release().label} ships PostgreSQL {value}, the one this bundle "
            "installs; remove postgres.version from the inventory"
        )
    return value


def check_no_other_major(version: int) -> None:
    """Refuse to plan beside a cluster of another major: its data would be left behind."""
    clusters = host.get_fact(PostgresClusters)
    others = {other: names for other, names in clusters.items() if other != str(version) and "main" in names}
    if others and "main" not in clusters.get(str(version), []):
        old = sorted(others)[0]
        raise PostgresSettingsError(
            f"{host.name}: PostgreSQL {old} cluster 'main' holds the data, and this deploy runs {version}. "
            f"Upgrade it first, on the node: `pg_upgradecluster {old} main` (then `pg_dropcluster {old} main` "
            "once checked), and deploy again (docs/deploy.md, 'PostgreSQL major upgrade')"
        )


def timescaledb_enabled() -> bool:
    return components().timescaledb.enabled


@deploy("PostgreSQL")
def postgresql() -> None:
    """The ``db`` node: the server, its role, database and extension; with Patroni, the first member."""
    version = major()
    check_no_other_major(version)
    under_patroni = patroni.enabled() and patroni.handed_over()
    conf, hba, package = server_files(version)
    service = f"postgresql@{version}-main"
    if not under_patroni:
        systemd.service(
            name=f"{service} running and enabled", service=service, running=True, enabled=True, **START_RETRIES
        )
    # The package starts the cluster with its default config before ours is written, so a changed
    # config always restarts, even on the first run. A server running without the library the
    # config preloads (the restart of an earlier run never happened) is restarted too, and so is
    # one whose TimescaleDB extension is older than the package (the upgrade's restart).
    timescale = timescaledb_enabled()
    preloaded = host.get_fact(PostgresPreloaded, **AS_POSTGRES)
    extensions = host.get_fact(PostgresExtensions, database=DATABASE, **AS_POSTGRES)
    wanted = versions.version("timescaledb", components().timescaledb.version)
    not_loaded = timescale and preloaded is not None and "timescaledb" not in preloaded
    outdated = timescale and extensions.get("timescaledb") not in (None, wanted)
    if outdated and versions.numeric(extensions["timescaledb"]) > versions.numeric(wanted):
        raise PostgresSettingsError(
            f"{host.name}: the memoryctl database has TimescaleDB {extensions['timescaledb']}, newer than {wanted}: "
            "TimescaleDB cannot be downgraded in place (restore a backup taken before the upgrade instead)"
        )
    reason = "timescaledb not loaded" if not_loaded else f"timescaledb {wanted} to load" if outdated else ""
    restart(
        version,
        f"config changed{', ' + reason if reason else ''}",
        [] if (not_loaded or outdated) else [op.did_change for op in (conf, package) if op is not None],
        under_patroni,
    )
    reload_hba(version, hba, conf, under_patroni)

    installed = "postgres" in host.get_fact(Users)
    if patroni.enabled() and installed and not host.get_fact(PostgresAnswers, **AS_POSTGRES):
        host.noop(
            "PostgreSQL does not answer yet (Patroni starts it below): its roles, database and extension next run"
        )
        patroni.take_over(version, patroni.prepare(version))
        return
    elsewhere = patroni.leader() if under_patroni else None
    if elsewhere not in (None, host.name) and (outdated or (timescale and "timescaledb" not in extensions)):
        # Database-level steps write: on a standby they fail half-way through the run.
        raise PostgresSettingsError(
            f"{host.name} is a standby and {elsewhere} leads the PostgreSQL cluster: the TimescaleDB extension"
            f" must be created or updated on the leader. Switch over first (on any member: `patronictl -c"
            f" {patroni.CONFIG} switchover --leader {elsewhere} --candidate {host.name}`), then deploy again"
        )
    role_and_database(password=secrets().token("postgres/memoryctl"))
    if MONITOR not in host.get_fact(PostgresRoleMemberships, **AS_POSTGRES).get(ROLE, []):
        # Read-only views of settings and statistics: memoryctl checks that TimescaleDB is preloaded
        # (shared_preload_libraries is hidden from other roles) and health / monitoring read stats.
        server.shell(
            name=f"Grant {MONITOR} to {ROLE} (it reads settings and statistics)",
            commands=[f"psql -v ON_ERROR_STOP=1 -XAtc 'GRANT {MONITOR} TO \"{ROLE}\"'"],
            **AS_POSTGRES,
        )
    if timescale and "timescaledb" not in extensions:
        server.shell(
            name="TimescaleDB extension in the memoryctl database",
            commands=[f"psql -v ON_ERROR_STOP=1 -d {DATABASE} -XAtc 'CREATE EXTENSION IF NOT EXISTS timescaledb'"],
            **AS_POSTGRES,
        )
    elif outdated:
        server.shell(
            name=f"ALTER EXTENSION timescaledb UPDATE ({extensions['timescaledb']} -> {wanted})",
            # Timescale: the first statement of a session that has not loaded the old library (-X).
            commands=[f"psql -v ON_ERROR_STOP=1 -d {DATABASE} -XAtc 'ALTER EXTENSION timescaledb UPDATE'"],
            **AS_POSTGRES,
        )
    if patroni.enabled():
        patroni.replication_roles()
        patroni.take_over(version, patroni.prepare(version))


# The standby's Patroni files, by host: started after the barrier, reloaded when they changed.
_prepared: dict[str, list[Any]] = {}


@deploy("PostgreSQL standby")
def standby_member() -> None:
    """A Patroni member other than the ``db`` node: the same packages and files, no data of its own
    (Patroni clones the primary once the first member leads: :func:`standby_start`)."""
    version = major()
    check_no_other_major(version)
    under_patroni = patroni.handed_over()
    conf, hba, package = server_files(version)
    restart(version, "config changed", [op.did_change for op in (conf, package) if op is not None], under_patroni)
    reload_hba(version, hba, conf, under_patroni)
    _prepared[host.name] = patroni.prepare(version)


def standby_start() -> None:
    patroni.standby(major(), _prepared.get(host.name, []))


def server_files(version: int) -> tuple[Any, Any, Any]:
    """Packages and configuration files, the same on every member: the single server's, and with
    Patroni the standby's (which Patroni clones into, keeping Debian's layout)."""
    settings = components().postgres
    mesh = host.data.mesh
    config_dir = f"/etc/postgresql/{version}/main"
    service = f"postgresql@{version}-main"
    timescale = timescaledb_enabled()
    dropin = after_mesh(service, "PostgreSQL")
    systemd.daemon_reload(name="Reload systemd units", _if=dropin.did_change)
    apt.packages(name="PostgreSQL", packages=[f"postgresql-{version}"], no_recommends=True)
    package = install_timescaledb(version) if timescale else None
    conf = template(
        "postgres/memoryctl.conf.j2",
        f"{config_dir}/conf.d/memoryctl.conf",
        mesh_address=host.data.mesh_address,
        port=ports.POSTGRES,
        # Patroni takes these from its dynamic configuration only (deploy/patroni_settings.py).
        postmaster={} if patroni.enabled() else patroni_settings.single_server(settings),
        shared_buffers=settings.shared_buffers,
        effective_cache_size=settings.effective_cache_size,
        work_mem=settings.work_mem,
        maintenance_work_mem=settings.maintenance_work_mem,
        timescaledb=timescale,
        user="postgres",
        group="postgres",
        mode="644",
    )
    hba = template(
        "postgres/pg_hba.conf.j2",
        f"{config_dir}/pg_hba.conf",
        pg_database=DATABASE,
        pg_user=ROLE,
        mesh_subnet=mesh["subnet"],
        replication_user=patroni.REPLICATION_USER if patroni.enabled() else None,
        rewind_user=patroni.REWIND_USER if patroni.enabled() else None,
        user="postgres",
        group="postgres",
        mode="640",
    )
    return conf, hba, package


def restart(version: int, reason: str, conditions: Any, under_patroni: bool, name: str | None = None) -> None:
    """Restart the server: its Debian unit, or through Patroni once Patroni runs it (a standby
    and a primary alike; a primary's restart is seconds of refused connections, no failover).
    Members restart one at a time (``patronictl restart`` returns once the member runs again): two
    members restarting together would leave no server to connect to, and a synchronous primary
    waiting for a standby that is down."""
    if under_patroni:
        if patroni.held_back(f"restarting PostgreSQL, should it need it ({reason})"):
            return
        server.shell(
            name=name or f"Restart PostgreSQL through Patroni ({reason})",
            commands=[f"patronictl -c {patroni.CONFIG} restart {patroni.scope()} {host.name} --force"],
            _if=conditions,
            _serial=True,
        )
        return
    service = f"postgresql@{version}-main"
    systemd.service(name=name or f"Restart {service} ({reason})", service=service, restarted=True, _if=conditions)


def reload_hba(version: int, hba: Any, conf: Any, under_patroni: bool) -> None:
    condition = lambda: hba.did_change() and not conf.did_change()  # noqa: E731
    if under_patroni:
        server.shell(
            name="Reload PostgreSQL through Patroni (pg_hba changed)",
            commands=[f"patronictl -c {patroni.CONFIG} reload {patroni.scope()} {host.name} --force"],
            _if=condition,
        )
        return
    service = f"postgresql@{version}-main"
    systemd.service(name=f"Reload {service} (pg_hba changed)", service=service, reloaded=True, _if=condition)


def timescaledb_packages(pg_major: int) -> list[str]:
    return [f"timescaledb-2-postgresql-{pg_major}", f"timescaledb-2-loader-postgresql-{pg_major}"]


def install_timescaledb(pg_major: int) -> object:
    """The extension's package from its repository, pinned; the install operation."""
    settings = components().timescaledb
    wanted = versions.version("timescaledb", settings.version)
    scheme = settings.package_version
    pinned = scheme.format(version=wanted, release=release().major)
    package = timescaledb_packages(pg_major)[0]
    aptsources.pin("timescaledb", timescaledb_packages(pg_major), pinned)
    aptsources.repository("timescaledb", stale=aptsources.needs_install({package: pinned}))
    return apt.packages(name=f"TimescaleDB {wanted}", packages=[f"{package}={pinned}"], no_recommends=True)


def role_and_database(password: str) -> None:
    """The memoryctl role (created once, password from a file) and the database it owns.

    pyinfra gathers facts before anything runs, and the role/database facts need the ``postgres``
    OS user: on a node without PostgreSQL yet, the first run creates the database with plain SQL
    right after the install; from then on the fact-driven operation keeps it.
    """
    installed = "postgres" in host.get_fact(Users)
    roles = host.get_fact(PostgresRoles, **AS_POSTGRES) if installed else {}
    if ROLE not in roles:
        # Rotating it is an operator action (docs/deploy.md): a re-run never touches the password.
        with_secret_file(
            f"Role {ROLE} (its SCRAM verifier read from a file)",
            f"CREATE ROLE \"{ROLE}\" LOGIN PASSWORD '{scram_verifier(password)}';\n",
            "psql -v ON_ERROR_STOP=1 -Xq -f {file}",
            user="postgres",
        )
    if installed:
        postgres.database(name=f"Database {DATABASE}", database=DATABASE, owner=ROLE, encoding="UTF8", **AS_POSTGRES)
        return
    server.shell(
        name=f"Database {DATABASE} (first install)",
        commands=[f'createdb --owner="{ROLE}" --encoding=UTF8 "{DATABASE}"'],
        **AS_POSTGRES,
    )
