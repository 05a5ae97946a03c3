"""PostgreSQL from Debian (+ TimescaleDB from its apt repository when enabled), bound to the mesh.

- ``listen_addresses`` = localhost + the node's mesh address; ``pg_hba.conf`` admits the memoryctl
  role from loopback and the mesh subnet only (scram-sha-256).
- The server starts after ``wg-quick@wg0`` (a drop-in) so the mesh address exists when it binds.
- A changed ``conf.d/memoryctl.conf`` restarts the server (listen addresses, preload libraries need
  it); a changed ``pg_hba.conf`` only reloads it.
- TimescaleDB (``components.timescaledb.enabled``): the packagecloud apt repository, the
  ``timescaledb-2-postgresql-<v>`` package, ``shared_preload_libraries`` and the extension in the
  memoryctl database. Off on the local nodes, whose network cannot reach that repository.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import HiddenValue, QuoteString, StringCommand, deploy
from pyinfra.facts.postgres import PostgresRoles
from pyinfra.facts.server import Users
from pyinfra.operations import apt, postgres, server, systemd

from deploy.common import apt_repository, component, secrets, template

DATABASE = "memoryctl"
ROLE = "memoryctl"
TIMESCALE_KEY = "https://packagecloud.io/timescale/timescaledb/gpgkey"
TIMESCALE_REPO = "https://packagecloud.io/timescale/timescaledb/debian/"


def timescaledb_enabled() -> bool:
    return bool(component("timescaledb").get("enabled", False))


@deploy("PostgreSQL")
def postgresql() -> None:
    settings = component("postgres")
    version = int(settings.get("version", 15))
    mesh = host.data.mesh
    config_dir = f"/etc/postgresql/{version}/main"
    service = f"postgresql@{version}-main"
    timescale = timescaledb_enabled()

    dropin = template(
        "postgres/after-wireguard.conf.j2",
        f"/etc/systemd/system/{service}.service.d/memoryctl.conf",
        interface=mesh.get("interface", "wg0"),
    )
    systemd.daemon_reload(name="Reload systemd units", _if=dropin.did_change)

    apt.packages(name="PostgreSQL", packages=[f"postgresql-{version}"], no_recommends=True)
    timescale_installed = None
    if timescale:
        timescale_settings = component("timescaledb")
        apt_repository(
            "timescaledb",
            timescale_settings.get("key_url", TIMESCALE_KEY),
            f"deb {timescale_settings.get('repo_url', TIMESCALE_REPO)} bookworm main",
        )
        timescale_installed = apt.packages(
            name="TimescaleDB", packages=[f"timescaledb-2-postgresql-{version}"], no_recommends=True
        )

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
    # config always restarts, even on the first run.
    systemd.service(name=f"Restart {service} (config changed)", service=service, restarted=True, _if=conf.did_change)
    systemd.service(
        name=f"Reload {service} (pg_hba changed)",
        service=service,
        reloaded=True,
        _if=lambda: hba.did_change() and not conf.did_change(),
    )

    role_and_database(password=secrets().token("postgres/memoryctl"))
    if timescale_installed is not None:
        server.shell(
            name="TimescaleDB extension in the memoryctl database",
            commands=[f"psql -d {DATABASE} -c 'CREATE EXTENSION IF NOT EXISTS timescaledb'"],
            _sudo=True,
            _sudo_user="postgres",
            _if=timescale_installed.did_change,
        )


def role_and_database(password: str) -> None:
    """The memoryctl role (password hidden from pyinfra's output) and the database it owns.

    pyinfra gathers facts before anything runs, and the role/database facts need the ``postgres``
    OS user: on a node without PostgreSQL yet, the first run creates both with plain SQL right
    after the install; from then on the fact-driven operations keep them (and report no change).
    """
    if "postgres" in host.get_fact(Users):
        roles = host.get_fact(PostgresRoles, _sudo=True, _sudo_user="postgres")
        # pyinfra ALTERs the password of an existing role on every run: pass it only to create the
        # role, so a re-run is a no-op. (Rotating it is an operator action, see docs/deploy.md.)
        postgres.role(
            name=f"Role {ROLE}",
            role=ROLE,
            password=None if ROLE in roles else password,
            login=True,
            _sudo=True,
            _sudo_user="postgres",
        )
        postgres.database(
            name=f"Database {DATABASE}",
            database=DATABASE,
            owner=ROLE,
            encoding="UTF8",
            _sudo=True,
            _sudo_user="postgres",
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
        _sudo=True,
        _sudo_user="postgres",
    )
