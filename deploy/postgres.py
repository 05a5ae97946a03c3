"""PostgreSQL (+ TimescaleDB), bound to the mesh. The major version is data, the code is the same.

- ``components.postgres.version`` is the major; ``repository: debian`` takes it from Debian (12
  ships 15: the local nodes), ``repository: pgdg`` from the PostgreSQL project's apt repository
  (any current major: the Hetzner example), with a dearmored keyring and ``signed-by``.
- ``listen_addresses`` = localhost + the node's mesh address; ``pg_hba.conf`` admits the memoryctl
  role from loopback and the mesh subnet only (scram-sha-256). The server starts after
  ``wg-quick@wg0`` (a drop-in) so the mesh address exists when it binds.
- A changed ``conf.d/memoryctl.conf`` restarts the server, and so does a running server that has
  not loaded a library the file preloads (a run that failed between the two); a changed
  ``pg_hba.conf`` only reloads it.
- TimescaleDB (``components.timescaledb``): ``source`` = a .deb release artefact (the local nodes),
  or null = the ``timescaledb-2-postgresql-<major>`` package from Timescale's apt repository pinned
  to :data:`deploy.versions.TIMESCALEDB`. Preloaded, and ``CREATE EXTENSION`` in the memoryctl
  database whenever the database lacks it (checked every run, not only after an install).
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import HiddenValue, QuoteString, StringCommand, deploy
from pyinfra.facts.postgres import PostgresRoles
from pyinfra.facts.server import Users
from pyinfra.operations import apt, postgres, server, systemd

from deploy import versions
from deploy.artefacts import install_deb, resolve
from deploy.common import apt_repository, component, secrets, template
from deploy.facts import PostgresExtensions, PostgresPreloaded, PostgresRoleMemberships

DATABASE = "memoryctl"
ROLE = "memoryctl"
MONITOR = "pg_monitor"
PGDG_KEY = "https://www.postgresql.org/media/keys/ACCC4CF8.asc"
PGDG_URI = "https://apt.postgresql.org/pub/repos/apt"
TIMESCALE_KEY = "https://packagecloud.io/timescale/timescaledb/gpgkey"
TIMESCALE_URI = "https://packagecloud.io/timescale/timescaledb/debian/"
AS_POSTGRES = {"_sudo": True, "_sudo_user": "postgres"}


class PostgresSettingsError(ValueError):
    """``components.postgres`` / ``components.timescaledb`` that cannot be deployed as written."""


def major() -> int:
    value = int(component("postgres").get("version", 15))
    if timescaledb_enabled() and value not in versions.POSTGRES_MAJORS:
        raise PostgresSettingsError(
            f"postgres.version {value}: TimescaleDB {versions.TIMESCALEDB} supports PostgreSQL "
            f"{', '.join(map(str, versions.POSTGRES_MAJORS))}"
        )
    return value


def timescaledb_enabled() -> bool:
    return bool(component("timescaledb").get("enabled", False))


@deploy("PostgreSQL")
def postgresql() -> None:
    settings = component("postgres")
    version = major()
    mesh = host.data.mesh
    config_dir = f"/etc/postgresql/{version}/main"
    service = f"postgresql@{version}-main"
    timescale = timescaledb_enabled()

    dropin = template(
        "wireguard/after-mesh.conf.j2",
        f"/etc/systemd/system/{service}.service.d/memoryctl.conf",
        service="PostgreSQL",
        interface=mesh.get("interface", "wg0"),
    )
    systemd.daemon_reload(name="Reload systemd units", _if=dropin.did_change)

    repository = settings.get("repository", "debian")
    if repository == "pgdg":
        apt_repository("pgdg", settings.get("key_url", PGDG_KEY), settings.get("repo_url", PGDG_URI), "bookworm-pgdg")
    elif repository != "debian":
        raise PostgresSettingsError(f"postgres.repository must be debian or pgdg, not {repository!r}")
    apt.packages(name="PostgreSQL", packages=[f"postgresql-{version}"], no_recommends=True)
    if timescale:
        install_timescaledb(version)

    conf = template(
        "postgres/memoryctl.conf.j2",
        f"{config_dir}/conf.d/memoryctl.conf",
        mesh_address=host.data.mesh_address,
        max_connections=settings.get("max_connections", 100),
        shared_buffers=settings.get("shared_buffers", "1GB"),
        effective_cache_size=settings.get("effective_cache_size", "3GB"),
        work_mem=settings.get("work_mem", "16MB"),
        maintenance_work_mem=settings.get("maintenance_work_mem", "256MB"),
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
        user="postgres",
        group="postgres",
        mode="640",
    )

    systemd.service(name=f"{service} running and enabled", service=service, running=True, enabled=True)
    # The package starts the cluster with its default config before ours is written, so a changed
    # config always restarts, even on the first run. A server running without the library the
    # config preloads (the restart of an earlier run never happened) is restarted too.
    preloaded = host.get_fact(PostgresPreloaded, **AS_POSTGRES)
    stale = timescale and preloaded is not None and "timescaledb" not in preloaded
    systemd.service(
        name=f"Restart {service} (config changed{', timescaledb not loaded' if stale else ''})",
        service=service,
        restarted=True,
        _if=[] if stale else [conf.did_change],
    )
    systemd.service(
        name=f"Reload {service} (pg_hba changed)",
        service=service,
        reloaded=True,
        _if=lambda: hba.did_change() and not conf.did_change(),
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
    if timescale and "timescaledb" not in host.get_fact(PostgresExtensions, database=DATABASE, **AS_POSTGRES):
        server.shell(
            name="TimescaleDB extension in the memoryctl database",
            commands=[f"psql -v ON_ERROR_STOP=1 -d {DATABASE} -XAtc 'CREATE EXTENSION IF NOT EXISTS timescaledb'"],
            **AS_POSTGRES,
        )


def install_timescaledb(pg_major: int) -> None:
    """The extension's package, from the inventory's artefact or Timescale's repository, pinned."""
    settings = component("timescaledb")
    wanted = versions.version("timescaledb", settings)
    package = f"timescaledb-2-postgresql-{pg_major}"
    artefact = resolve("timescaledb", settings.get("source"), version=wanted, pg=pg_major)
    if artefact is not None:
        install_deb(artefact, package, f"{wanted}~")
        return
    apt_repository(
        "timescaledb",
        settings.get("key_url", TIMESCALE_KEY),
        settings.get("repo_url", TIMESCALE_URI),
        "bookworm",
    )
    pin = versions.TIMESCALEDB_APT.format(version=wanted)
    apt.packages(
        name=f"TimescaleDB {wanted}",
        packages=[f"{package}={pin}", f"timescaledb-2-loader-postgresql-{pg_major}={pin}"],
        no_recommends=True,
    )


def role_and_database(password: str) -> None:
    """The memoryctl role (password hidden from pyinfra's output) and the database it owns.

    pyinfra gathers facts before anything runs, and the role/database facts need the ``postgres``
    OS user: on a node without PostgreSQL yet, the first run creates both with plain SQL right
    after the install; from then on the fact-driven operations keep them (and report no change).
    """
    if "postgres" in host.get_fact(Users):
        roles = host.get_fact(PostgresRoles, **AS_POSTGRES)
        # pyinfra ALTERs the password of an existing role on every run: pass it only to create the
        # role, so a re-run is a no-op. (Rotating it is an operator action, see docs/deploy.md.)
        postgres.role(
            name=f"Role {ROLE}",
            role=ROLE,
            password=None if ROLE in roles else password,
            login=True,
            **AS_POSTGRES,
        )
        postgres.database(
            name=f"Database {DATABASE}",
            database=DATABASE,
            owner=ROLE,
            encoding="UTF8",
            **AS_POSTGRES,
        )
        return
    create_role = StringCommand(
        f'CREATE ROLE "{ROLE}" LOGIN PASSWORD ', StringCommand("'", HiddenValue(password), "'", _separator="")
    )
    server.shell(
        name=f"Role {ROLE} and database {DATABASE} (first install)",
        commands=[
            StringCommand("psql -v ON_ERROR_STOP=1 -Ac", QuoteString(create_role)),
            f'createdb --owner="{ROLE}" --encoding=UTF8 "{DATABASE}"',
        ],
        **AS_POSTGRES,
    )
