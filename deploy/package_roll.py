"""The held cluster packages upgraded in a roll: patroni, etcd and PostgreSQL, never a failover.

These packages are kept from unattended-upgrades (templates/base/50unattended-upgrades-memoryctl.j2):
Debian's maintainer scripts restart what they ship, and on the primary's node that is a failover
(patroni's postinst) or binaries replaced under a running postmaster (postgresql-N). With
``components.upgrades.held: roll`` a deploy run upgrades them to their candidates the way
docs/ha.md's manual procedure does, with Patroni's and etcd's own commands:

1. every node that is not the Patroni leader, one at a time (``_serial``): the packages installed
   with ``policy-rc.d`` refusing the maintainer scripts' restarts, then etcd restarted and healthy,
   Patroni restarted (a replica: its PostgreSQL stops and starts on the new binaries) and the member
   streaming again before the next node;
2. the leader, when its own packages wait: one switchover (``patronictl switchover``) to the
   synchronous standby, which already runs the new version;
3. the former leader, now a replica, as in 1.

Each step is decided when it runs (``memoryctl-package-roll pending``), so a run with nothing to
upgrade changes nothing, and a roll interrupted half-way is finished by the next run. The default,
``held: hold``, leaves them as they are (``apt list --upgradable`` and health's pending restarts
say what waits). A paused cluster or the maintenance marker holds the roll back like every other
Patroni step. The lists are the ones apt has (the base refreshes them hourly): an operator who
wants a just-published version run ``apt-get update`` first, or waits for that hour.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.operations import server

from deploy import etcd, patroni
from deploy.common import barrier, components, exits_zero, template
from deploy.postgres import major

ROLL = "/usr/local/sbin/memoryctl-package-roll"
# A replica that clones again or replays a long WAL backlog is not a restart: stop and say so.
WAIT_S = 600


def mode() -> str:
    return components().upgrades.held


def rolled_packages() -> list[str]:
    """apt package names (anchored regular expressions) the roll upgrades: what the unattended
    upgrades' blacklist keeps back, except TimescaleDB (its version is the inventory's pin,
    upgraded by its own step, deploy/postgres.py)."""
    version = major()
    return [
        "patroni",
        "etcd-server",
        "etcd-client",
        f"postgresql-{version}",
        f"postgresql-client-{version}",
        "postgresql-common",
        "postgresql-client-common",
    ]


def roll() -> None:
    """Called by every node at the same point of the run, after Patroni's own roll."""
    if mode() != "roll" or not patroni.enabled():
        return
    involved = etcd.is_member() or patroni.is_member()
    if involved and not (patroni.is_member() and patroni.held_back("upgrading the held packages")):
        template(
            "patroni/package-roll.py.j2",
            ROLL,
            rolled=rolled_packages(),
            postgres=major(),
            patroni_url=f"http://{host.data.mesh_address}:{patroni.REST_PORT}" if patroni.is_member() else None,
            config=patroni.CONFIG,
            scope=patroni.scope(),
            etcd_health=etcd.health_command() if etcd.is_member() else None,
            marker=patroni.MAINTENANCE_MARKER,
            wait_s=WAIT_S,
            settle_s=2,
            policy_rc_d="/usr/sbin/policy-rc.d",
            mode="755",
        )
    _upgrade("Upgrade the held packages, one node at a time, the Patroni leader's node last", involved)
    barrier("the package roll's replicas are done")
    server.shell(
        name="Switch over from the Patroni leader when its own packages wait",
        commands=[f"{ROLL} hand-over"] if involved and patroni.is_member() else [],
        _if=lambda: _roll_says(f"{ROLL} pending --role leader"),
    )
    barrier("the package roll's switchover is done")
    _upgrade("Upgrade the held packages on the former leader's node", involved)


def _upgrade(name: str, involved: bool) -> None:
    server.shell(
        name=name,
        commands=[f"{ROLL} upgrade"] if involved else [],
        _serial=True,
        _if=lambda: _roll_says(f"{ROLL} pending --role replica"),
    )


def _roll_says(command: str) -> bool:
    """``command`` of the roll script exits 0 here (a node where the script is not installed: no)."""
    return exits_zero(f"test -x {ROLL} && {command}")
