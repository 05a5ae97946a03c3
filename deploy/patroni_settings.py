"""PostgreSQL settings that Patroni owns: declared in the inventory, carried in the DCS.

Patroni takes some postmaster options from its dynamic configuration (the DCS) only and passes
them to ``postgres`` on the command line, above every file (Patroni's docs, "PostgreSQL
parameters controlled by Patroni"): they must hold the same values on every member, because a
hot standby refuses to run with less shared memory for them than its primary. A value in
``conf.d/memoryctl.conf`` would be ignored under Patroni and the file would lie, so with Patroni
these settings go into ``bootstrap.dcs`` (a cluster being formed) and through ``patronictl
edit-config`` into a running cluster (deploy/patroni.py, ``cluster_settings``); a single server
keeps them in its ``conf.d`` file.

From the inventory (``components.postgres``): ``max_connections`` (default 100), and optionally
``max_worker_processes`` and ``max_locks_per_transaction``: TimescaleDB's background workers
(compression, retention, continuous aggregates) need worker slots, and a query or policy that
touches every chunk of a hypertable takes a lock per chunk, so both grow with the data. Their
defaults are PostgreSQL's and Patroni's own (8 and 64), so carrying them changes no running value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Declared by the inventory; the values are the defaults of PostgreSQL and of Patroni alike.
INVENTORY_DEFAULTS = {"max_connections": 100, "max_worker_processes": 8, "max_locks_per_transaction": 64}
# What replication and pg_rewind need of every member (Patroni restricts them to the DCS too).
REPLICATION = {
    "wal_level": "replica",
    "hot_standby": "on",
    "wal_log_hints": "on",
    "max_wal_senders": 10,
    "max_replication_slots": 10,
    "wal_keep_size": "256MB",
}
# Patroni's smallest accepted values (it raises a smaller one, and the raised value would then
# read as a drift on every run).
PATRONI_MINIMUM = {"max_connections": 25, "max_worker_processes": 2, "max_locks_per_transaction": 32}


class PostmasterSettingsError(ValueError):
    """``components.postgres`` postmaster settings that cannot be deployed as written."""


def declared(settings: Mapping[str, Any]) -> dict[str, int]:
    """The inventory's postmaster settings, defaults filled in, each a whole number Patroni accepts."""
    values: dict[str, int] = {}
    for name, default in INVENTORY_DEFAULTS.items():
        value = settings.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < PATRONI_MINIMUM[name]:
            raise PostmasterSettingsError(
                f"postgres.{name}: {value!r} must be a whole number of at least {PATRONI_MINIMUM[name]}"
            )
        values[name] = value
    return values


def single_server(settings: Mapping[str, Any]) -> dict[str, int]:
    """What ``conf.d/memoryctl.conf`` sets on a server without Patroni: ``max_connections`` always
    (as it always did), the optional ones only when the inventory names them, so that removing one
    from the inventory returns the server to PostgreSQL's default."""
    values = declared(settings)
    return {name: value for name, value in values.items() if name == "max_connections" or name in settings}


def dcs_parameters(settings: Mapping[str, Any]) -> dict[str, Any]:
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
