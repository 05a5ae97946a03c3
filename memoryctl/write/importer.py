"""JSONL import: one memory per line, validated line by line so one bad line never costs the file.

Line format (every field but ``text`` optional)::

    {"id": UUID, "agent_id": A, "text": T, "kind": K, "created_at": ISO,
     "entities": [{"type", "name"}], "relations": [{"from": NODE, "type": REL, "to": NODE}],
     "metadata": {}}

where NODE is ``{"type", "name"}``, ``"this"`` or ``{"memory": UUID}``.
"""

from __future__ import annotations

import codecs
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from memoryctl.errors import InputError
from memoryctl.model import (
    DEFAULT_KIND,
    BadLine,
    EntityRef,
    Memory,
    Relation,
    node_from_json,
    parse_datetime,
    parse_uuid,
    utcnow,
)

ALLOWED_FIELDS = frozenset({"id", "agent_id", "text", "kind", "created_at", "entities", "relations", "metadata"})


def memory_from_json(obj: Any, *, default_agent: str) -> Memory:
    if not isinstance(obj, dict):
        raise InputError("a line must be a JSON object")
    unknown = set(obj) - ALLOWED_FIELDS
    if unknown:
        raise InputError(f"unknown field(s) {sorted(unknown)}", hint="allowed: " + ", ".join(sorted(ALLOWED_FIELDS)))
    if "text" not in obj:
        raise InputError('missing "text"')
    mid = parse_uuid(obj["id"]) if obj.get("id") is not None else uuid.uuid4()
    entities = obj.get("entities") or []
    relations = obj.get("relations") or []
    if not isinstance(entities, list) or not isinstance(relations, list):
        raise InputError('"entities" and "relations" must be lists')
    ents = []
    for e in entities:
        if not isinstance(e, dict) or set(e) != {"type", "name"}:
            raise InputError(f"entity {e!r} must be {{'type': T, 'name': N}}")
        ents.append(EntityRef(e["type"], e["name"]))
    rels = []
    for r in relations:
        if not isinstance(r, dict) or set(r) != {"from", "type", "to"}:
            raise InputError(f"relation {r!r} must be {{'from': NODE, 'type': REL, 'to': NODE}}")
        rels.append(Relation(node_from_json(r["from"], mid), r["type"], node_from_json(r["to"], mid)))
    created = parse_datetime(obj["created_at"]) if obj.get("created_at") else utcnow()
    return Memory(
        id=mid,
        agent_id=obj.get("agent_id") or default_agent,
        text=obj["text"],
        kind=obj.get("kind") or DEFAULT_KIND,
        created_at=created,
        metadata=obj.get("metadata") or {},
        entities=ents,
        relations=rels,
    )


def read_jsonl(
    stream: IO[bytes], *, default_agent: str, forced_agent: str | None = None
) -> Iterator[tuple[int, Memory | BadLine]]:
    """Yield (line number, memory or the reason the line was refused). Blank lines are skipped.

    The file is read as bytes and each line decoded on its own: one line that is not UTF-8 is a
    bad line like any other, not the end of the import (a text-mode stream raises on the first
    such byte, losing every line after it).
    """
    for n, raw in enumerate(stream, start=1):
        if n == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)  # editors on Windows start files with one
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            yield n, BadLine(n, f"not valid UTF-8: byte 0x{raw[exc.start]:02x} at column {exc.start + 1}")
            continue
        if not line:
            continue
        try:
            obj = json.loads(line)
            if forced_agent is not None and isinstance(obj, dict):
                obj["agent_id"] = forced_agent
            yield n, memory_from_json(obj, default_agent=default_agent)
        except json.JSONDecodeError as exc:
            yield n, BadLine(n, f"not valid JSON: {exc.msg} (column {exc.colno})")
        except RecursionError:
            yield n, BadLine(n, "not valid JSON: nested too deeply")
        except InputError as exc:
            yield n, BadLine(n, exc.message)


def count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())
