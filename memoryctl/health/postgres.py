"""``memoryctl health``'s view of a replicated PostgreSQL (Patroni, docs/ha.md): the leader, each
standby with its sync state and replay lag, the timeline.

Read on the connection health already holds, which ``[postgres] hosts`` and
``target_session_attrs=read-write`` landed on the primary: ``pg_is_in_recovery()``, the timeline of
the WAL being written now (the first 8 hex digits of ``pg_walfile_name(pg_current_wal_lsn())``: it
changes at a promotion, before the next checkpoint would show it in ``pg_control_checkpoint()``) and
``pg_stat_replication``, whose columns past ``pid`` only a member of ``pg_monitor`` (through
``pg_read_all_stats``) or a superuser sees; the deploy grants ``pg_monitor`` to the memoryctl role.
And, on any server, the settings pending a restart (a note: the server runs on as it was).

Only asked when ``[postgres] hosts`` names two members or more: a single server shows nothing new.
The fixed queries take no input (no SQL is built from settings or user text).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

SYNCHRONOUS = ("sync", "quorum")  # pg_stat_replication.sync_state of a standby a commit waits for

NO_SYNC_STANDBY = "no synchronous standby: writes are acknowledged by the primary alone"

STANDBYS_SQL = (
    "SELECT application_name AS name, host(client_addr) AS address, state, sync_state, sync_priority,"
    " pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint AS lag_bytes,"
    " extract(epoch FROM replay_lag)::float8 AS replay_lag_s"
    " FROM pg_stat_replication ORDER BY application_name, pid"
)


PENDING_RESTART_SQL = "SELECT name FROM pg_settings WHERE pending_restart ORDER BY name"


def read_pending_restart(conn: Any) -> list[str]:
    """The settings the server on ``conn`` was given (a changed file, a Patroni ``edit-config``)
    but applies only after a restart (``pg_settings.pending_restart``: PostgreSQL sets it on
    reload). A single server or the primary the connection landed on: each member answers for
    itself only (Patroni's ``patronictl list`` and the ``PostgresRestartPending`` alert cover the
    others). ``conn`` is a psycopg connection with ``dict_row``."""
    return [row["name"] for row in conn.execute(PENDING_RESTART_SQL)]


def pending_restart_note(settings: Sequence[str], server: str) -> str:
    """A note, not a problem: the server runs as before, and the deploy restarts it (through
    Patroni: replicas first, the leader last, docs/ha.md "Rolled restart")."""
    return (
        f"restart pending on {server} for {', '.join(settings)}: the server runs with the old values"
        " until restarted (the deploy does it; with Patroni: patronictl restart <scope> <member> --pending)"
    )


def read_replication(conn: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The server's side (``in_recovery``, ``timeline``, the sync settings) and, on a primary, its
    ``pg_stat_replication`` rows. ``conn`` is a psycopg connection with ``dict_row``."""
    row = conn.execute(
        "SELECT pg_is_in_recovery() AS in_recovery,"
        " current_setting('synchronous_standby_names') AS synchronous_standby_names,"
        " current_setting('synchronous_commit') AS synchronous_commit"
    ).fetchone()
    server: dict[str, Any] = dict(row or {})
    server["connected_to"] = server_address(conn)
    if server.get("in_recovery"):
        # pg_current_wal_lsn() raises during recovery; the replayed timeline is what a standby has
        tli = conn.execute("SELECT received_tli AS tli FROM pg_stat_wal_receiver").fetchone()
        server["timeline"] = tli["tli"] if tli else None
        return server, []
    wal = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn()) AS walfile").fetchone()
    server["timeline"] = int(wal["walfile"][:8], 16) if wal and wal["walfile"] else None
    return server, list(conn.execute(STANDBYS_SQL))


def server_address(conn: Any) -> str:
    """``host:port`` of the server ``conn`` is connected to."""
    return _address(conn.info.host, conn.info.port)


def _address(host: str, port: int | str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def cluster_status(
    server: Mapping[str, Any],
    standbys: Sequence[Mapping[str, Any]],
    *,
    members: Sequence[str],
    max_lag_bytes: int,
) -> dict[str, Any]:
    """The ``cluster`` block of the postgres component, with its ``problems`` (each one makes the
    component degraded): the connection on a standby, no standby streaming in sync/quorum state,
    ``pg_stat_replication`` unreadable (no ``pg_monitor``), a standby behind by more than
    ``max_lag_bytes`` in replay."""
    in_recovery = bool(server.get("in_recovery"))
    out: dict[str, Any] = {
        "members": list(members),
        "leader": None if in_recovery else server.get("connected_to"),
        "connected_to": server.get("connected_to"),
        "in_recovery": in_recovery,
        "timeline": server.get("timeline"),
        "synchronous_standby_names": server.get("synchronous_standby_names"),
        "synchronous_commit": server.get("synchronous_commit"),
        "standbys": [
            {
                "name": s.get("name"),
                "address": s.get("address"),
                "state": s.get("state"),
                "sync_state": s.get("sync_state"),
                "lag_bytes": None if s.get("lag_bytes") is None else int(s["lag_bytes"]),
                "replay_lag_s": None if s.get("replay_lag_s") is None else round(float(s["replay_lag_s"]), 3),
            }
            for s in standbys
        ],
        "max_replication_lag_bytes": max_lag_bytes,
    }
    problems: list[str] = []
    if in_recovery:
        problems.append(
            f"connected to {server.get('connected_to')}, a standby in recovery: writes fail there"
            " (is target_session_attrs read-write?)"
        )
    elif any(s["state"] is None for s in out["standbys"]):
        problems.append(
            "pg_stat_replication shows standbys but not their state: grant pg_monitor to this role"
            " (GRANT pg_monitor TO memoryctl)"
        )
    else:
        synced = [s for s in out["standbys"] if s["state"] == "streaming" and s["sync_state"] in SYNCHRONOUS]
        if not synced:
            seen = ", ".join(f"{_name(s)} {s['state']}/{s['sync_state']}" for s in out["standbys"])
            names = server.get("synchronous_standby_names") or ""
            why = f"standbys: {seen}" if seen else "no standby is streaming"
            problems.append(f"{NO_SYNC_STANDBY} ({why}; synchronous_standby_names = {names!r})")
        for s in out["standbys"]:
            if s["lag_bytes"] is not None and s["lag_bytes"] > max_lag_bytes:
                problems.append(
                    f"standby {_name(s)} is {s['lag_bytes']} bytes behind in replay"
                    f" (max_replication_lag_bytes {max_lag_bytes})"
                )
    out["problems"] = problems
    return out


def _name(standby: Mapping[str, Any]) -> str:
    return str(standby.get("name") or standby.get("address") or "?")


def member_lines(cluster: Mapping[str, Any]) -> list[tuple[str, str]]:
    """One ``(role, detail)`` per member for the human table: the leader, then each standby."""
    lines: list[tuple[str, str]] = []
    tl = cluster.get("timeline")
    if cluster.get("leader"):
        lines.append(("leader", f"{cluster['leader']} timeline {tl if tl is not None else '?'}"))
    else:
        lines.append(("connected", f"{cluster.get('connected_to')} in recovery (not the leader)"))
    for s in cluster.get("standbys") or []:
        where = s["name"] if not s.get("address") else f"{s['name']} ({s['address']})"
        lag = "-" if s.get("lag_bytes") is None else _bytes(s["lag_bytes"])
        secs = "-" if s.get("replay_lag_s") is None else f"{s['replay_lag_s']:.3f} s"
        lines.append(("standby", f"{where} {s.get('state')} {s.get('sync_state')}, replay lag {lag} / {secs}"))
    return lines


def _bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
