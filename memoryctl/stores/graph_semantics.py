"""Graph semantics both graph stores share, and the validation that precedes any store call.

``SqlGraphStore`` (recursive SQL) and ``Neo4jGraphStore`` (Cypher) must answer every traversal
identically; the integration tests run the same cases against both. What they agree on is
defined here, in ``prepare_batch`` and ``check_traversal``:

- A node is an entity (``key``) or a memory (``id``). Edges carry ``origin``: the memory whose
  upsert declared them. Re-upserting a memory replaces exactly the edges it declared (even ones
  between two entities), and the same edge declared by two memories survives the deletion of one.
- A traversal starts at an existing entity of the agent, follows edges of the allowed types in the
  given direction for 1..hops steps, and only steps onto nodes that exist, belong to the agent
  (when one is given) and are not soft-deleted memories. It returns the memories on those paths
  plus the live memories of the agent that MENTION any entity reached (the start included),
  ordered by distance (a mentioning memory is one step further than its entity), then by id.
- Deleting a memory removes its node, every edge touching it, every edge it declared, and the
  entities left with no edge at all.

Everything that may end up in a query as a literal (relation types, hops, direction, limits) is
validated here, before any store is touched.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from memoryctl.errors import InputError
from memoryctl.model import validate_agent_id, validate_entity_type, validate_relation_type
from memoryctl.query_terms import DIRECTIONS, MAX_HOPS
from memoryctl.stores.protocols import GraphMemory, GraphTraversal

MENTIONS = "MENTIONS"


@dataclass(frozen=True, slots=True)
class PreparedEdge:
    src: str
    src_is_memory: bool
    type: str  # validated by memoryctl.model.validate_relation_type (any identifier of that shape)
    dst: str
    dst_is_memory: bool
    origin: str  # the memory id (text) that declared the edge
    agent_id: str


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """A validated, de-duplicated upsert batch in plain values (memory ids as lowercase text)."""

    entities: list[dict[str, str]]  # key, name, type, agent_id
    memories: list[dict[str, Any]]  # id, agent_id, created_at, deleted
    edges: list[PreparedEdge]

    @property
    def ids(self) -> list[str]:
        return [m["id"] for m in self.memories]


def _check_text(value: Any, what: str, max_len: int = 2048) -> str:
    # PostgreSQL text cannot hold NUL; refusing it here keeps both stores' behaviour identical.
    if not isinstance(value, str) or not value or len(value) > max_len or "\x00" in value:
        raise InputError(f"invalid {what} {value!r}", hint=f"{what}s are 1-{max_len} characters without NUL")
    return value


def node_ref(node: str | uuid.UUID) -> tuple[str, bool]:
    """(text id, is_memory). A UUID is a memory; a string is an entity key unless it is a UUID.

    Entity keys always contain '/' (``agent/Type:name``), so a bare UUID string is unambiguous.
    """
    if isinstance(node, uuid.UUID):
        return str(node), True
    text = _check_text(node, "graph node")
    if "/" not in text:
        try:
            return str(uuid.UUID(text)), True
        except ValueError:
            pass
    return text, False


def _aware(dt: datetime) -> datetime:
    if not isinstance(dt, datetime):
        raise InputError(f"created_at {dt!r} is not a datetime")
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _key_agent(key: str, default: str) -> str:
    """The agent an entity belongs to is part of its key (``agent/Type:name``), not the writer's.

    A memory may name another agent's entity as a relation end; that must not move the entity.
    """
    head, sep, _ = key.partition("/")
    if sep:
        try:
            return validate_agent_id(head)
        except InputError:
            pass
    return default


def prepare_batch(items: Sequence[GraphMemory]) -> PreparedBatch:
    """Validate a whole batch before anything is written; later items win on duplicate keys/ids."""
    entities: dict[str, dict[str, str]] = {}
    memories: dict[str, dict[str, Any]] = {}
    edges: dict[str, list[PreparedEdge]] = {}
    for item in items:
        if not isinstance(item.id, uuid.UUID):
            raise InputError(f"graph memory id {item.id!r} is not a UUID")
        mid = str(item.id)
        agent = validate_agent_id(item.agent_id)
        memories[mid] = {
            "id": mid,
            "agent_id": agent,
            "created_at": _aware(item.created_at),
            "deleted": bool(item.deleted),
        }
        for ent in item.entities:
            key = _check_text(ent.key, "entity key")
            entities[key] = {
                "key": key,
                "name": _check_text(ent.name, "entity name"),
                "type": validate_entity_type(ent.type),
                "agent_id": _key_agent(key, agent),
            }
        own: dict[tuple[str, str, str], PreparedEdge] = {}
        for key in item.mentions:
            dst = _check_text(key, "entity key")
            own[(mid, MENTIONS, dst)] = PreparedEdge(mid, True, MENTIONS, dst, False, mid, agent)
        for edge in item.edges:
            rel = validate_relation_type(edge.type)
            src, src_mem = node_ref(edge.source)
            dst, dst_mem = node_ref(edge.target)
            own[(src, rel, dst)] = PreparedEdge(src, src_mem, rel, dst, dst_mem, mid, agent)
        edges[mid] = list(own.values())
    return PreparedBatch(
        entities=list(entities.values()),
        memories=list(memories.values()),
        edges=[e for mid in memories for e in edges[mid]],
    )


def check_traversal(query: GraphTraversal) -> GraphTraversal:
    """The traversal as the engines may run it, or ``InputError``: every part that may end up
    spliced into a statement as a literal is checked, relation types de-duplicated and sorted,
    times made aware. The same type as asked, so a field added to ``GraphTraversal`` is checked
    here and read by the engines, with no twin to keep in step."""
    hops = query.hops
    if type(hops) is not int or not 1 <= hops <= MAX_HOPS:
        raise InputError(f"hops must be an integer from 1 to {MAX_HOPS}, not {hops!r}")
    if query.direction not in DIRECTIONS:
        raise InputError(f"direction must be one of {', '.join(DIRECTIONS)}, not {query.direction!r}")
    if isinstance(query.relation_types, str):
        raise InputError("relation_types is a list of relationship types, not one string")
    types = tuple(sorted({validate_relation_type(t) for t in query.relation_types}))
    limit = query.limit
    if limit is not None and (type(limit) is not int or limit < 1):
        raise InputError(f"limit must be a positive integer, not {limit!r}")
    agent = validate_agent_id(query.agent_id) if query.agent_id is not None else None
    if type(query.newest_first) is not bool:
        raise InputError("newest_first is a boolean")
    return replace(
        query,
        agent_id=agent,
        start_key=_check_text(query.start_key, "start entity key"),
        relation_types=types,
        created_from=_aware(query.created_from) if query.created_from is not None else None,
        created_to=_aware(query.created_to) if query.created_to is not None else None,
    )


def check_ids(ids: Sequence[uuid.UUID]) -> list[str]:
    out = []
    for i in ids:
        if not isinstance(i, uuid.UUID):
            raise InputError(f"{i!r} is not a UUID")
        out.append(str(i))
    return out


def check_page(agent_id: str | None, batch: int) -> str | None:
    """The validated agent of a ``scroll`` (None: every agent); a page size must be positive."""
    if type(batch) is not int or batch < 1:
        raise InputError(f"batch must be a positive integer, not {batch!r}")
    return validate_agent_id(agent_id) if agent_id is not None else None


def relationship(
    rel_type: str, direction: str, node_id: str, is_memory: bool, etype: str | None, name: str | None
) -> dict[str, Any]:
    """One edge of a memory as query results show it: its type, direction and the node at the other end."""
    node = (
        {"kind": "memory", "id": node_id}
        if is_memory
        else {"kind": "entity", "key": node_id, "type": etype, "name": name}
    )
    return {"type": rel_type, "direction": direction, "node": node}


def relationship_sort_key(rel: dict[str, Any]) -> tuple[str, str, str]:
    node = rel["node"]
    return (rel["type"], rel["direction"], str(node.get("key") or node.get("id") or ""))
