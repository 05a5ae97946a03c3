"""New connections to a replicated PostgreSQL without waiting out a vanished member.

libpq's multi-host loop (run by psycopg 3 itself, one attempt per member) tries ``[postgres]
hosts`` in order and gives each member the whole ``connect_timeout`` before the next. A member
whose machine has gone (a killed VM: packets dropped, no RST) therefore cost every new
connection 5 s (the default ``connect_timeout_s``) before the live primary was tried: longer than
``memoryctl health``'s 1.8 s deadline, and paid by every connection the service's pool opened.
Measured (tests/integration/test_pg_vanished_member.py, a blackholed address first): 5.01 s per
connection, health's postgres probe ``timeout``.

Two things mature clients do, done here for ``target_session_attrs`` ``read-write``/``primary``
with two or more hosts (anything else goes to psycopg unchanged):

- **Staggered attempts** (the "Happy Eyeballs" pattern, RFC 8305's 250 ms connection attempt
  delay): the next member is tried when the previous one has failed or has not answered within
  ``CONNECT_STAGGER_S``, while the earlier attempts go on; the first member that accepts writes
  wins and a later success is closed. A dead member costs 0.25 s instead of ``connect_timeout``;
  a standby still answers "read-only" at once and is passed over as before. libpq's
  ``load_balance_hosts`` (client-side, libpq 16+) only shuffles the order: a dead member would
  still cost the whole timeout on half the connections.
- **A standby asked again while the attempt lasts**: a member that answered "no" (a standby, a
  server shutting down) is tried again every ``RETRY_ANSWERED_S`` for as long as another member's
  attempt is still running. In a failover the standby is promoted while the lost primary's
  attempt waits out its ``connect_timeout``: without this, the connection failed at the end of it
  and the next attempt came up to 5 s after the promotion (the CI drill: a write acknowledged 7.6 s
  after the leader changed, attempts 5 s apart).
- **The primary remembered** (as pgJDBC's host status tracker does): the member that last
  accepted a connection here is tried first, so after a failover the pool's new connections go
  straight to the new primary instead of first to the old one.

Every attempt keeps ``connect_timeout`` as its own bound; the pool's overall timeout (hosts x
connect_timeout) still holds. A failed connection raises like psycopg's own loop: one
``OperationalError`` listing every member's failure.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow

log = logging.getLogger(__name__)

CONNECT_STAGGER_S = 0.25  # RFC 8305's recommended connection attempt delay
RETRY_ANSWERED_S = 0.5  # a member that said no, asked again while another attempt is still running
RACED_ATTRS = ("read-write", "primary")  # exactly one member qualifies: the first to accept wins

Member = tuple[str, str, str]  # host, port, hostaddr as written in the connection string

_primaries: dict[tuple[Member, ...], Member] = {}  # members -> the one that last accepted
_lock = threading.Lock()


def forget_primaries() -> None:
    """Forget which member was the primary (tests: a process that has not connected yet)."""
    with _lock:
        _primaries.clear()


def members(conninfo: str, kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[Member]] | None:
    """The connection parameters and the members to race, or None when psycopg's own loop applies
    (one host, another ``target_session_attrs``, hosts given as keyword arguments, a string libpq
    cannot parse: psycopg reports that)."""
    if any(k in kwargs for k in ("host", "hostaddr", "port", "target_session_attrs")):
        return None
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return None
    if params.get("target_session_attrs") not in RACED_ATTRS:
        return None
    hosts = str(params.get("host") or "").split(",")
    ports = str(params.get("port") or "").split(",")
    addrs = str(params.get("hostaddr") or "").split(",")
    if len(hosts) < 2 or len(ports) not in (1, len(hosts)) or len(addrs) not in (1, len(hosts)):
        return None
    return params, [
        (host, ports[i] if len(ports) > 1 else ports[0], addrs[i] if len(addrs) > 1 else addrs[0])
        for i, host in enumerate(hosts)
    ]


def attempt_order(found: list[Member]) -> list[Member]:
    """``found`` with the member that last accepted a connection (if any) first."""
    with _lock:
        primary = _primaries.get(tuple(found))
    if primary is None or primary not in found:
        return list(found)
    return [primary, *(m for m in found if m != primary)]


def _single(params: dict[str, Any], member: Member) -> str:
    host, port, hostaddr = member
    one = {k: v for k, v in params.items() if k not in ("host", "port", "hostaddr")}
    one.update({k: v for k, v in (("host", host), ("port", port), ("hostaddr", hostaddr)) if v})
    return make_conninfo("", **one)


def _describe(member: Member) -> str:
    host, port, hostaddr = member
    return f"host: {host!r}, port: {port or None!r}, hostaddr: {hostaddr or None!r}"


class ClusterConnection(psycopg.Connection[DictRow]):
    """psycopg's connection, with staggered attempts across the members of a multi-host string
    (the module's docstring). The pool opens its connections through ``connect``."""

    @classmethod
    def connect(cls, conninfo: str = "", **kwargs: Any) -> ClusterConnection:
        found = members(conninfo, kwargs)
        if found is None:
            return super().connect(conninfo, **kwargs)
        params, configured = found
        order = attempt_order(configured)
        results: queue.Queue[tuple[Member, ClusterConnection | None, psycopg.Error | None]] = queue.Queue()
        state = {"won": False}
        lock = threading.Lock()

        def attempt(member: Member, delay: float = 0.0) -> None:
            if delay:
                time.sleep(delay)
            try:
                conn = super(ClusterConnection, cls).connect(_single(params, member), **kwargs)
            except psycopg.Error as exc:
                results.put((member, None, exc))
                return
            except Exception as exc:  # e.g. a name that does not resolve: the caller's thread reports it
                results.put((member, None, psycopg.OperationalError(f"{type(exc).__name__}: {exc}")))
                return
            with lock:
                late, state["won"] = state["won"], True
            if late:
                conn.close()  # another member answered first
            else:
                results.put((member, conn, None))

        errors: dict[Member, psycopg.Error] = {}
        started = 0
        running = 0

        def start(member: Member, delay: float = 0.0) -> None:
            nonlocal running
            running += 1
            threading.Thread(target=attempt, args=(member, delay), daemon=True, name=f"pg-connect-{member[0]}").start()

        def start_next() -> None:
            nonlocal started
            member = order[started]
            started += 1
            start(member)

        start_next()
        while True:
            try:
                member, conn, error = results.get(timeout=CONNECT_STAGGER_S if started < len(order) else None)
            except queue.Empty:  # no answer yet: try the next member too, the running attempts go on
                log.debug(
                    "postgres: no answer within %gs, also trying %s", CONNECT_STAGGER_S, _describe(order[started])
                )
                start_next()
                continue
            running -= 1
            if conn is not None:
                with _lock:
                    _primaries[tuple(configured)] = member
                return conn
            assert error is not None
            log.debug("postgres: connection failed: %s: %s", _describe(member), error)
            errors[member] = error
            if started < len(order):  # a member that says no (a standby, refused) costs no delay
                start_next()
            elif running:  # another member's attempt still waits: this one may be promoted meanwhile
                start(member, RETRY_ANSWERED_S)
            else:
                raise _all_failed(configured, errors)


def _all_failed(configured: list[Member], errors: dict[Member, psycopg.Error]) -> psycopg.Error:
    """One error for every member's failure, as psycopg's own loop raises it."""
    ordered = [(m, errors[m]) for m in configured]
    last = ordered[-1][1]
    lines = [str(last), "Multiple connection attempts failed. All failures were:"]
    lines += [f"- {_describe(m)}: {error}" for m, error in ordered]
    return type(last)("\n".join(lines)).with_traceback(None)
