"""PostgreSQL as a Patroni cluster: a primary and a synchronous standby, the leader lock in etcd.

Replicated when ``components.postgres.members`` names two or more nodes (the first is the ``db``
node); one member (the default) is the single server of :mod:`deploy.postgres`, unchanged. Which
second node and why: docs/ha.md (the ``index`` node on the reference setup).

**One path.** Every member installs PostgreSQL exactly as the single server does (Debian's
``postgresql-<major>``, TimescaleDB, ``conf.d/memoryctl.conf``, ``pg_hba.conf``); Patroni then
takes the Debian cluster over in place: ``start.conf`` says ``manual`` and ``postgresql@<major>-main``
is stopped and disabled, so only Patroni starts the server, with Debian's data and config
directories. Patroni renames Debian's ``postgresql.conf`` to ``postgresql.base.conf`` and includes
it, so ``conf.d`` (memoryctl's settings, WAL archiving) still applies. So a fresh install and the
conversion of an existing single server are the same steps: the first member's data survives (it
becomes the leader with the data it has), and the others are cloned from it.

**Ordering.** The first member is converted and holds the leader lock before any other member's
Patroni starts (a barrier between the two, every run): a Patroni that found no leader and no
``initialize`` key would otherwise bootstrap a second, empty cluster. A standby's own fresh Debian
cluster (nothing but the template databases) is emptied before its first start, so Patroni clones
the primary with ``pg_basebackup``; a data directory that holds anything else is never touched
(the run stops with what to do).

**Tuning.** ``loop_wait`` 3 s, ``retry_timeout`` 7 s and ``ttl`` 20 s, the smallest ``ttl`` Patroni 4
accepts (its defaults are 10/10/30): a lost primary's lock expires at most 20 s after its last
renewal and the standby acts within a loop (3 s) and a probe of the lost member's REST API (~2 s).
With ``loop_wait`` 5 the drills measured the leader change 21-28 s after the cut; ``retry_timeout``
stays 7 s because a primary that cannot reach etcd for that long demotes itself, and etcd on two
shared, busy cores can stall for seconds. The values
reach etcd when the cluster is formed (``bootstrap.dcs``); later changes are applied by
:func:`cluster_settings` (``patronictl edit-config``) on the next run. ``synchronous_mode`` on, not strict:
with the standby lost the primary keeps accepting writes alone (and the alert says so) rather than
stopping every write; ``maximum_lag_on_failover`` keeps a lagging standby from being promoted.
"""

from __future__ import annotations

import shlex
from typing import Any

from pyinfra import host, state
from pyinfra.api import deploy
from pyinfra.facts.files import File
from pyinfra.facts.server import Users
from pyinfra.facts.systemd import SystemdStatus
from pyinfra.operations import apt, files, server, systemd

from deploy import etcd, patroni_settings, ports
from deploy.common import after_mesh, components, inventory, secrets, template
from deploy.facts import MaintenanceMarker, PatroniCluster, PatroniDynamicConfig
from deploy.scram import scram_verifier
from deploy.topology import PatroniSettingsError as PatroniSettingsError
from deploy.topology import patroni_enabled as enabled
from deploy.topology import postgres_members as members

REST_PORT = ports.PATRONI
PKI_DIR = "/etc/patroni/pki"
LEADER_AWAY = "/usr/local/sbin/memoryctl-etcd-leader-away"
LEADER_AWAY_PERIOD_S = 10
CONFIG = "/etc/patroni/config.yml"
REPLICATION_USER = "replicator"
REWIND_USER = "rewinder"
AS_POSTGRES = {"_sudo": True, "_sudo_user": "postgres"}
LOOP_WAIT, RETRY_TIMEOUT = 3, 7
# Patroni 4's smallest lock ttl: it raises a smaller one to 20 ("ttl=17 can't be smaller than 20,
# adjusting...") and stores the raised value when it forms the cluster, which the next run's
# comparison below then took for a drift (the CI rehearsal of this change). 20 >= 3 + 2 x 7.
MIN_TTL = 20
DCS = {
    "ttl": max(MIN_TTL, LOOP_WAIT + 2 * RETRY_TIMEOUT),
    "loop_wait": LOOP_WAIT,
    "retry_timeout": RETRY_TIMEOUT,
    "maximum_lag_on_failover": 1048576,
}


def is_member() -> bool:
    return enabled() and host.name in members()


def is_standby_member() -> bool:
    return is_member() and host.name != members()[0]


def mesh_ports() -> list[int]:
    return [ports.POSTGRES, REST_PORT] if is_member() else []


def leader() -> str | None:
    """The member that leads the running cluster, as the other members' Patroni says (asked of each
    member node while the run is planned; a node being installed or recreated does not answer);
    None when no member answers with a leader (a new cluster, or Patroni down everywhere)."""
    for name in members():
        if name == host.name:
            continue
        node = state.inventory.get_host(name)
        view = node.get_fact(PatroniCluster, addresses=[inventory().nodes[name]["mesh"]], port=REST_PORT)
        for member in (view or {}).get("members", []):
            if member.get("role") == "leader" and member.get("state") == "running":
                return str(member["name"])
    return None


def joins_as_replica() -> bool:
    """The ``db`` node (the first member) recreated blank, or installed, while another member leads:
    it is cloned from the leader like any standby (its own fresh cluster would hold another system
    identifier, which Patroni refuses), never initialised with a database of its own."""
    return is_member() and host.name == members()[0] and not handed_over() and leader() not in (None, host.name)


def handed_over() -> bool:
    """Whether this member's server was handed to Patroni (its configuration is there): from then
    on only Patroni starts, stops and restarts it, even while Patroni itself is down."""
    return host.get_fact(File, path=CONFIG) is not None


def scope() -> str:
    return f"memoryctl-{inventory().name}"


def member_addresses() -> list[str]:
    """``HOST:PORT`` of every member, the first member first (memoryctl's ``[postgres] hosts``)."""
    nodes = inventory().nodes
    return [f"{nodes[name]['mesh']}:{ports.POSTGRES}" for name in members()]


def rest_password() -> str:
    return secrets().token("patroni/rest")


def config(version: int) -> Any:
    """Patroni's configuration file (0600 postgres: it holds the replication and REST passwords)."""
    return template(
        "patroni/config.yml.j2",
        CONFIG,
        scope=scope(),
        member=host.name,
        mesh_address=host.data.mesh_address,
        pg_port=ports.POSTGRES,
        rest_port=REST_PORT,
        rest_password=rest_password(),
        etcd_hosts=[f"{inventory().nodes[name]['mesh']}:{etcd.CLIENT_PORT}" for name in etcd.members()],
        pki_dir=PKI_DIR,
        dcs=DCS,
        parameters=patroni_settings.dcs_parameters(components().postgres),
        version=version,
        replication_user=REPLICATION_USER,
        replication_password=secrets().token("postgres/replicator"),
        rewind_user=REWIND_USER,
        rewind_password=secrets().token("postgres/rewinder"),
        leader_away=LEADER_AWAY,
        user="postgres",
        group="postgres",
        mode="600",
    )


def prepare(version: int) -> list[Any]:
    """Patroni's package, certificates and configuration, and the Debian unit handed over to it.

    Called on every member after PostgreSQL's packages and files are in place. The package is
    installed before its configuration exists, so its unit (which needs the file) cannot start a
    Patroni before the ordering below allows it.
    """
    apt.packages(name="Patroni", packages=["patroni", "python3-etcd"], no_recommends=True)
    dropin = after_mesh("patroni", "Patroni")
    systemd.daemon_reload(name="Reload systemd units (patroni drop-in)", _if=dropin.did_change)
    changes = etcd.certificate_files(PKI_DIR, "postgres")
    changes.append(config(version))
    etcd_leader_away()
    files.put(
        name="start.conf: only Patroni starts this cluster",
        src=_manual(),
        dest=f"/etc/postgresql/{version}/main/start.conf",
        user="postgres",
        group="postgres",
        mode="644",
    )
    return changes


def etcd_leader_away() -> None:
    """Keep etcd's leader off the primary's node: Patroni's ``on_role_change`` callback and a timer.

    A new etcd leader grants every lease its whole TTL again (etcd keeps lease deadlines on its
    leader only), so losing the node that led both etcd and PostgreSQL cost an etcd election plus a
    fresh ``ttl`` before the standby could take the lock: 28.6 s in the CI drill, 20.7 s with the
    two apart. The script (templates/patroni/etcd-leader-away.py.j2) moves etcd's leadership to
    another answering member when this member is the primary and leads etcd.
    """
    template(
        "patroni/etcd-leader-away.py.j2",
        LEADER_AWAY,
        mesh_address=host.data.mesh_address,
        client_port=etcd.CLIENT_PORT,
        endpoints=etcd.client_urls(),
        rest_port=REST_PORT,
        pki_dir=PKI_DIR,
        period_s=LEADER_AWAY_PERIOD_S,
        mode="755",
    )
    units = [
        template(
            f"patroni/etcd-leader-away.{kind}.j2",
            f"/etc/systemd/system/etcd-leader-away.{kind}",
            script=LEADER_AWAY,
            period_s=LEADER_AWAY_PERIOD_S,
            mode="644",
        )
        for kind in ("service", "timer")
    ]
    systemd.daemon_reload(
        name="Reload systemd units (etcd-leader-away)", _if=lambda: any(op.did_change() for op in units)
    )
    systemd.service(
        name="etcd-leader-away timer running and enabled",
        service="etcd-leader-away.timer",
        running=True,
        enabled=True,
    )


def _manual() -> Any:
    from io import StringIO

    return StringIO("# Managed by the memoryctl pyinfra deploy (deploy/patroni.py): Patroni starts it.\nmanual\n")


def replication_roles() -> None:
    """The replication and pg_rewind roles, created on the primary before Patroni first needs them."""
    from pyinfra.facts.postgres import PostgresRoles

    from deploy.common import with_secret_file

    installed = "postgres" in host.get_fact(Users)
    roles = host.get_fact(PostgresRoles, **AS_POSTGRES) if installed else {}
    statements = []
    if REPLICATION_USER not in roles:
        verifier = scram_verifier(secrets().token("postgres/replicator"))
        statements.append(f"CREATE ROLE \"{REPLICATION_USER}\" LOGIN REPLICATION PASSWORD '{verifier}';")
    if REWIND_USER not in roles:
        verifier = scram_verifier(secrets().token("postgres/rewinder"))
        statements.append(f"CREATE ROLE \"{REWIND_USER}\" LOGIN PASSWORD '{verifier}';")
        # What pg_rewind needs of a non-superuser (PostgreSQL docs, pg_rewind; Patroni's docs).
        for function in (
            "pg_ls_dir(text, boolean, boolean)",
            "pg_stat_file(text, boolean)",
            "pg_read_binary_file(text)",
            "pg_read_binary_file(text, bigint, bigint, boolean)",
        ):
            statements.append(f'GRANT EXECUTE ON FUNCTION pg_catalog.{function} TO "{REWIND_USER}";')
    if statements:
        with_secret_file(
            "Replication and pg_rewind roles (SCRAM verifiers read from a file)",
            "\n".join(statements) + "\n",
            "psql -v ON_ERROR_STOP=1 -Xq -f {file}",
            user="postgres",
        )


def take_over(version: int, changes: list[Any]) -> None:
    """The first member: Patroni takes the running Debian cluster over (or, later, keeps it)."""
    if held_back("starting or restarting Patroni"):
        return
    service = f"postgresql@{version}-main"
    running = host.get_fact(SystemdStatus).get("patroni.service", False)
    if not running:
        server.shell(
            name=f"Hand {service} over to Patroni (stop and disable the Debian unit)",
            commands=[f"systemctl disable --now {service}.service"],
        )
    _patroni_running(running, changes)
    wait_for_leader(_if=lambda: not running or any(op.did_change() for op in changes))
    cluster_settings()


def cluster_settings() -> None:
    """Patroni's cluster-wide settings in etcd as declared: the timing (``DCS``) and the
    PostgreSQL parameters Patroni owns (:mod:`deploy.patroni_settings`). ``bootstrap.dcs`` is
    written only when the cluster is formed, so a later change (a release that tunes it, an
    inventory that raises ``max_connections``) would never reach a running cluster. Patroni applies
    an edit on every member within a loop; a postmaster option leaves each member
    ``pending_restart``, which :func:`rolling_restart` then clears, one member at a time."""
    current = host.get_fact(PatroniDynamicConfig, address=host.data.mesh_address, port=REST_PORT)
    if current is None:
        return  # Patroni not answering yet: the cluster is formed from bootstrap.dcs, as declared
    differ = patroni_settings.differences(declared_dcs(), current)
    if differ:
        sets = " ".join(f"-s {shlex.quote(f'{key}={value}')}" for key, value in sorted(differ.items()))
        _settings_edits[host.name] = (
            server.shell(
                name="Patroni's cluster settings as declared (patronictl edit-config)",
                commands=[f"patronictl -c {CONFIG} edit-config {scope()} --force --quiet {sets}"],
            ),
            patroni_settings.needs_restart(list(differ)),
        )


def declared_dcs() -> dict[str, Any]:
    """The dynamic configuration this bundle owns: the timing and ``postgresql.parameters``."""
    return {**DCS, "postgresql": {"parameters": patroni_settings.dcs_parameters(components().postgres)}}


def start_standby(version: int, changes: list[Any]) -> None:
    """A standby member: its fresh Debian cluster emptied once, then Patroni clones the primary."""
    if held_back("starting or restarting Patroni"):
        return
    data = f"/var/lib/postgresql/{version}/main"
    service = f"postgresql@{version}-main"
    running = host.get_fact(SystemdStatus).get("patroni.service", False)
    if not running:
        fresh = (
            f"[ ! -f {data}/PG_VERSION ] ||"
            f" {{ [ ! -f {data}/patroni.dynamic.json ] && [ $(ls {data}/base | wc -l) -le 3 ]; }}"
        )
        server.shell(
            name=f"Hand {service} over to Patroni (its fresh cluster emptied: Patroni clones the primary)",
            commands=[
                # A member with nothing of its own starts only once another member leads: its
                # Patroni would otherwise form a cluster of its own (a first member that failed
                # earlier in this run passes the barrier too).
                f"if {fresh}; then for i in $(seq 120); do leader=$({_leader()});"
                f' [ -n "$leader" ] && [ "$leader" != {host.name} ] && break; sleep 1; done;'
                f' if [ -z "$leader" ] || [ "$leader" = {host.name} ]; then echo "no other member leads {scope()}:'
                f" not starting this member's Patroni (it would form a cluster of its own); deploy again once"
                f' {members()[0]} leads" >&2; exit 1; fi; fi',
                f"systemctl disable --now {service}.service",
                # Only a cluster that holds nothing but template0/template1/postgres is emptied,
                # and only before this member's first Patroni start (a former primary keeps its
                # data: Patroni rewinds it).
                f"if [ -f {data}/PG_VERSION ] && [ ! -f {data}/patroni.dynamic.json ]; then"
                f' n=$(ls {data}/base | wc -l); if [ "$n" -le 3 ]; then find {data} -mindepth 1 -delete;'
                f" else echo '{data} holds databases of its own: move them away before it joins the cluster"
                " (docs/ha.md)' >&2; exit 1; fi; fi",
            ],
        )
    _patroni_running(running, changes)
    wait_for_standby(_if=lambda: not running or any(op.did_change() for op in changes))


def _leader() -> str:
    """The shell that prints the member holding the leader lock in etcd (empty: none)."""
    return f"{_etcdctl()} get --print-value-only /memoryctl/{scope()}/leader"


def _etcdctl() -> str:
    """etcdctl against the etcd members, with this member's Patroni certificate (root reads it)."""
    return (
        f"etcdctl --endpoints={','.join(etcd.client_urls())} --cacert={PKI_DIR}/ca.crt"
        f" --cert={PKI_DIR}/node.crt --key={PKI_DIR}/node.key"
    )


def _patroni_running(running: bool, changes: list[Any]) -> None:
    systemd.service(name="Patroni running and enabled", service="patroni", running=True, enabled=True)
    if running:
        # Patroni reads its file again on reload; what needs a PostgreSQL restart it reports as
        # pending (docs/ha.md: `patronictl restart --pending`).
        systemd.service(
            name="Reload Patroni (its files changed)",
            service="patroni",
            reloaded=True,
            _if=lambda: any(op.did_change() for op in changes),
        )


def _rest(path: str) -> str:
    return f"curl -s -o /dev/null -w '%{{http_code}}' http://{host.data.mesh_address}:{REST_PORT}{path}"


def wait_for_leader(seconds: int = 120, **kwargs: Any) -> None:
    """Only after this run started or reloaded Patroni (``_if``): a wait is not a change."""
    # A member that runs (primary, or a replica after a failover) and a leader in etcd: a
    # taken-over server first starts read-only, before Patroni takes the lock.
    running = f'[ "$({_rest("/primary")})" = 200 ] || [ "$({_rest("/replica")})" = 200 ]'
    _wait_until(
        "Wait until this member leads the cluster (Patroni /primary answers 200)",
        f'[ -n "$({_leader()})" ] && {{ {running}; }}',
        seconds,
        f"Patroni reported no leader within {seconds} s",
        **kwargs,
    )


def wait_for_standby(seconds: int = 600, **kwargs: Any) -> None:
    _wait_until(
        "Wait until this member streams from the primary (Patroni /replica answers 200)",
        f'[ "$({_rest("/replica")})" = 200 ] || [ "$({_rest("/primary")})" = 200 ]',
        seconds,
        f"this member did not become a streaming replica in {seconds} s",
        **kwargs,
    )


def _wait_until(name: str, condition: str, seconds: int, failure: str, **kwargs: Any) -> None:
    """A step that polls a shell ``condition`` once a second and fails the run with ``failure``."""
    server.shell(
        name=name,
        commands=[
            f"for i in $(seq {seconds}); do if {condition}; then exit 0; fi; sleep 1; done;"
            f" echo '{failure}: journalctl -u patroni' >&2; exit 1"
        ],
        **kwargs,
    )


@deploy("Patroni standby")
def standby(version: int, changes: list[Any]) -> None:
    start_standby(version, changes)


# --- Maintenance guard and rolled restarts (issue 39, items 4 and 5) ---------------------------

MAINTENANCE_MARKER = "/etc/memoryctl/maintenance"
RESTART_PENDING = "/usr/local/sbin/memoryctl-patroni-restart-pending"
# How long a member may take to come back from its restart before the roll stops (a clone or a
# long crash recovery is not a restart: better stop and say so than restart the next member).
RESTART_WAIT_S = 300
# The first member's cluster-settings edit, and whether it leaves members pending a restart.
_settings_edits: dict[str, tuple[Any, bool]] = {}


def rest_addresses() -> list[str]:
    """Every member's mesh address, the first member first (their REST APIs, port ``REST_PORT``)."""
    nodes = inventory().nodes
    return [nodes[name]["mesh"] for name in members()]


def cluster_view() -> dict[str, Any] | None:
    """``GET /cluster`` from the first member whose Patroni answers (plan time)."""
    found: dict[str, Any] | None = host.get_fact(PatroniCluster, addresses=rest_addresses(), port=REST_PORT)
    return found


def held_back(doing: str) -> bool:
    """Whether this run must leave Patroni alone here, and if so a no-op that says why.

    Checked at plan time, before anything starts or restarts Patroni or its PostgreSQL: a paused
    cluster (``patronictl pause``: an operator is working on it and Patroni itself holds back) or
    the maintenance marker on this member (docs/ha.md, "Maintenance": set by procedures that stop
    Patroni, such as the point-in-time restore, where a started standby could take the leader lock
    with data newer than the restore target). The rest of the run goes on.
    """
    marker = host.get_fact(MaintenanceMarker, path=MAINTENANCE_MARKER)
    if marker is not None:
        host.noop(f"maintenance marker {MAINTENANCE_MARKER} set by {marker or '(no reason written)'}: not {doing}")
        return True
    if (cluster_view() or {}).get("pause"):
        host.noop(f"{scope()} is paused (patronictl pause; resume it to let the deploy act): not {doing}")
        return True
    return False


def rolling_restart() -> None:
    """Members pending a restart restarted one at a time: replicas, the leader, replicas again.

    Called by every host at the same point of the run, after every member's Patroni was started
    (deploy/roles.py): one step of the run, ordered after every host's earlier steps, whose
    commands only the first member runs (the roll is the cluster's, not a member's). It runs when
    Patroni reported a member ``pending_restart`` when the run began, or when this run's
    ``edit-config`` changed a postmaster option (it waits for the members to take the edit up).

    The leader is restarted in place, not switched over (docs/ha.md, "Settings Patroni owns"):
    a lowered value reaches a replica only after the primary runs with it (a replica's shared
    memory may not be smaller than its primary's, so Patroni starts it with the primary's value
    and leaves it pending), which a switchover alone would not give; hence the replicas' second pass.
    """
    edit, needs_restart = _settings_edits.pop(host.name, (None, False))
    commands: list[str] = []
    conditions: dict[str, Any] = {}
    if is_member() and host.name == members()[0] and not held_back("restarting members pending a restart"):
        template(
            "patroni/restart-pending.py.j2",
            RESTART_PENDING,
            cluster_urls=[f"http://{address}:{REST_PORT}/cluster" for address in rest_addresses()],
            config=CONFIG,
            scope=scope(),
            wait_s=RESTART_WAIT_S,
            loop_s=2 * LOOP_WAIT + 1,
            mode="755",
        )
        pending = [m["name"] for m in (cluster_view() or {}).get("members", []) if m.get("pending_restart")]
        if pending or needs_restart:
            # An edit reaches every member within a loop; then each reports pending_restart.
            commands = [f"{RESTART_PENDING} --settle {DCS['ttl']}" if needs_restart else RESTART_PENDING]
        if not pending and needs_restart:
            conditions["_if"] = edit.did_change
    server.shell(
        name="Restart members pending a restart, one at a time, the leader last", commands=commands, **conditions
    )
