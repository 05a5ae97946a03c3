"""PostgreSQL settings that Patroni owns: declared in the inventory, carried in the DCS.

Patroni takes some postmaster options from its dynamic configuration (the DCS) only and passes
them to ``postgres`` on the command line, above every file (Patroni's docs, "PostgreSQL
parameters controlled by Patroni"): they must hold the same values on every member, because a
hot standby refuses to run with less shared memory for them than its primary. A value in
``conf.d/memoryctl.conf`` would be ignored under Patroni and the file would lie, so with Patroni
these settings go into ``bootstrap.dcs`` (a cluster being formed) and through ``patronictl
edit-config`` into a running cluster (deploy/patroni.py, ``cluster_settings``); a single server
keeps them in its ``conf.d`` file.

From the inventory (``components.postgres``, typed in deploy/components.py with their defaults and
Patroni's minimums): ``max_connections`` (default 100), and optionally ``max_worker_processes`` and
``max_locks_per_transaction``: TimescaleDB's background workers (compression, retention, continuous
aggregates) need worker slots, and a query or policy that touches every chunk of a hypertable takes
a lock per chunk, so both grow with the data. Their defaults are PostgreSQL's and Patroni's own (8
and 64), so carrying them changes no running value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deploy.components import PATRONI_MINIMUM, Postgres

# Declared by the inventory (deploy/components.py: defaults those of PostgreSQL and Patroni alike).
DECLARED = tuple(PATRONI_MINIMUM)
# What replication and pg_rewind need of every member (Patroni restricts them to the DCS too).
REPLICATION = {
    "wal_level": "replica",
    "hot_standby": "on",
    "wal_log_hints": "on",
    "max_wal_senders": 10,
    "max_replication_slots": 10,
    "wal_keep_size": "256MB",
}


def declared(settings: Postgres) -> dict[str, int]:
    """The inventory's postmaster settings, defaults filled in (each a whole number Patroni accepts:
    the inventory's parsing refused any other)."""
    return {name: getattr(settings, name) for name in DECLARED}


def single_server(settings: Postgres) -> dict[str, int]:
    """What ``conf.d/memoryctl.conf`` sets on a server without Patroni: ``max_connections`` always
    (as it always did), the optional ones only when the inventory names them, so that removing one
    from the inventory returns the server to PostgreSQL's default."""
    stated = settings.model_fields_set
    return {name: value for name, value in declared(settings).items() if name == "max_connections" or name in stated}


def dcs_parameters(settings: Postgres) -> dict[str, Any]:
    """``postgresql.parameters`` of Patroni's dynamic configuration: replication's and the inventory's."""
    return {**REPLICATION, **declared(settings)}


def as_patroni_returns(value: Any) -> str:
    """A value as Patroni's ``GET /config`` may return it, made comparable: ``patronictl edit-config
    -s`` parses values as YAML (``200`` an int, ``on`` a boolean), ``bootstrap.dcs`` keeps the
    template's strings, and PostgreSQL reads ``on``/``true`` and ``200``/``"200"`` alike."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def differences(wanted: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{dotted.key: wanted value}`` for every leaf of ``wanted`` that ``current`` (Patroni's
    ``GET /config``) lacks or holds another value for; keys ``current`` has beyond ``wanted`` are
    left alone (Patroni's own, or an operator's)."""
    found: dict[str, Any] = {}
    for key, value in wanted.items():
        here = current.get(key)
        if isinstance(value, Mapping):
            found.update(differences(value, here if isinstance(here, Mapping) else {}, f"{prefix}{key}."))
        elif here is None or as_patroni_returns(here) != as_patroni_returns(value):
            found[f"{prefix}{key}"] = value
    return found


def needs_restart(keys: list[str]) -> bool:
    """Whether changing these dotted keys leaves members ``pending_restart``: every parameter
    carried here is a postmaster option except ``wal_keep_size`` (reloaded)."""
    return any(key.startswith("postgresql.parameters.") and not key.endswith(".wal_keep_size") for key in keys)
