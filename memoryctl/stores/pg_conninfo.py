"""The connection string for a replicated PostgreSQL: libpq's multi-host form, built from settings.

With Patroni (docs/ha.md) the primary moves between members. libpq already follows it: given
``host=a,b port=5432,5432 target_session_attrs=read-write`` it tries the members in order and keeps
the first one that accepts writes (it asks ``SHOW transaction_read_only`` after connecting), so a
standby or a demoted former primary is skipped and every new connection lands on the current
primary (PostgreSQL docs, libpq "Specifying Multiple Hosts"; psycopg 3 tries the hosts one by one
with the same attributes). No extra hop (HAProxy, a Patroni-aware proxy) sits in the path.

This module has no psycopg import at module level: ``memoryctl.config`` validates ``hosts`` when
the configuration is read, on the CLI's fast path too.
"""

from __future__ import annotations

from memoryctl.errors import ConfigError

DEFAULT_PORT = 5432
FORM = 'is not "HOST" or "HOST:PORT" (IPv6 in brackets: "[::1]:5432")'


def split_host(entry: str) -> tuple[str, int]:
    """``"10.77.0.1:5432"`` -> ``("10.77.0.1", 5432)``; ``"[::1]:5433"``, ``"db1"`` too.

    ``ValueError`` otherwise: the settings' validator turns it into the config error that names
    ``postgres.hosts`` and the file.
    """
    text = entry.strip()
    host, port = text, str(DEFAULT_PORT)
    if text.startswith("["):
        inside, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"{entry!r} {FORM}")
        host, port = inside, rest[1:] if rest else port
    elif text.count(":") == 1:
        host, port = text.split(":")
    elif ":" in text:
        raise ValueError(f"{entry!r} {FORM}")
    if not host or any(c in host for c in " ,=/'\"\\@?") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{entry!r} {FORM}")
    return host, int(port)


def multi_host_conninfo(dsn: str, hosts: list[str], target_session_attrs: str | None) -> str:
    """``dsn`` with its host/port replaced by ``hosts`` (when given) and ``target_session_attrs``.

    With two or more hosts the attribute defaults to ``read-write``: without it libpq would keep
    the first member that answers, a standby included, and every write would fail there.
    """
    if not hosts and target_session_attrs is None:
        return dsn
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        params = conninfo_to_dict(dsn)
    except Exception as exc:  # psycopg.ProgrammingError: libpq could not parse it
        raise ConfigError(
            f"postgres.dsn is not a libpq connection string: {exc}",
            hint="e.g. dsn = 'postgresql://memoryctl@10.77.0.1:5432/memoryctl'",
        ) from None
    if hosts:
        pairs = [split_host(entry) for entry in hosts]
        params.pop("hostaddr", None)  # it would pin every attempt to one address
        params["host"] = ",".join(host for host, _ in pairs)
        params["port"] = ",".join(str(port) for _, port in pairs)
    attrs = target_session_attrs or ("read-write" if len(hosts) > 1 else None)
    if attrs:
        params["target_session_attrs"] = attrs
    return make_conninfo("", **params)
