"""From command-line flags to an operation's parameters, for both ways the CLI parses them.

The typer commands and the console script's fast path (``memoryctl.cli.fast``) both build the
parameters they send here, so that a command sends the same request whichever parsed it. No typer,
no pydantic: the fast path imports this on every call. ``agent_of`` resolves ``--agent`` (None:
the configured default agent) and raises ``InputError`` for an invalid one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from memoryctl.errors import InputError
from memoryctl.model import parse_uuid, validate_meta_key

AgentOf = Callable[[str | None], str]


def parse_params(pairs: list[str], flag: str = "--param") -> dict[str, Any]:
    """``key=value``; the value is JSON when it parses as JSON (numbers, booleans), else a string."""
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise InputError(f"{flag} {pair!r} is not key=value", hint=f"e.g. {flag} sentiment=0.7")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        parsed[validate_meta_key(key.strip())] = value
    return parsed


def query(
    agent_of: AgentOf,
    *,
    text: str | None,
    agent: str | None,
    all_agents: bool,
    entity: str | None,
    via: list[str] | None,
    hops: int,
    direction: str,
    since: str | None,
    until: str | None,
    where: list[str] | None,
    combine: str,
    limit: int,
    threshold: float | None,
    retrieval: str,
    half_life: str | None,
) -> dict[str, Any]:
    return {
        "text": text,
        "agent": None if all_agents else agent_of(agent),
        "all_agents": all_agents or None,
        "entity": entity,
        "via": via or None,
        "hops": hops,
        "direction": direction,
        "since": since,
        "until": until,
        "where": where or None,
        "combine": combine,
        "limit": limit,
        "threshold": threshold,
        "retrieval": retrieval,
        "half_life": half_life,
    }


def add(
    agent_of: AgentOf,
    *,
    text: str,
    agent: str | None,
    kind: str,
    at: str | None,
    entity: list[str] | None,
    rel: list[str] | None,
    meta: list[str] | None,
    id_: str | None,
) -> dict[str, Any]:
    # The id is chosen here, so that a retry after a lost reply from the service is idempotent.
    mid = parse_uuid(id_) if id_ else uuid.uuid4()
    return {
        "id": str(mid),
        "text": text,
        "agent": agent_of(agent),
        "kind": kind,
        "at": at,
        "metadata": parse_params(meta or [], "--meta") or None,
        "entities": entity or None,
        "relations": rel or None,
    }


def get(agent_of: AgentOf, *, memory_id: str, agent: str | None) -> dict[str, Any]:
    return {"id": str(parse_uuid(memory_id)), "agent": agent_of(agent) if agent else None}


def forget(agent_of: AgentOf, *, memory_ids: list[str], agent: str | None) -> dict[str, Any]:
    return {"ids": [str(parse_uuid(i)) for i in memory_ids], "agent": agent_of(agent) if agent else None}
