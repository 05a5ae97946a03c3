"""The data model shared by every store: one memory, one UUID, the same everywhere.

Identifiers that ever reach a query language as *identifiers* (entity types, relationship types,
metadata keys used in filters) are validated here against strict patterns or a whitelist; every
other user value travels as a bound parameter. Keeping that rule in one module means an adapter
never has to wonder whether a string is safe to splice.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import unicodedata
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from memoryctl.errors import InputError

# The relationship types memoryctl documents and the LLM extractor chooses from. A caller may use
# any other identifier of the same shape (``SAID``, ``ATTENDED``, a type of their own domain),
# unless the configuration narrows the set (``[graph] relation_types``, see ``memoryctl.vocabulary``).
# MENTIONS is written by memoryctl itself (memory -> entity).
RELATION_TYPES: frozenset[str] = frozenset(
    {
        "AUTHORED",
        "REFERENCES",
        "BELONGS_TO",
        "OCCURRED_AFTER",
        "RELATES_TO",
        "MENTIONS",
        "ASSIGNED_TO",
        "WORKS_ON",
        "PART_OF",
        "REPLIED_TO",
        "OWNS",
        "DEPENDS_ON",
        "BLOCKS",
        "KNOWS",
    }
)

# Upper-case ASCII only: the one shape that is safe to splice into Cypher as a relationship type.
RELATION_TYPE_SHAPE = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
_ENTITY_TYPE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$")
_KIND = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_META_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# A NUL character as JSON writes it: ``\u0000`` after an even number of backslashes (a string that
# merely contains the six characters backslash-u-0-0-0-0 is encoded with its backslash doubled).
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
HALF_LIFE_OFF = "off"  # --half-life off, [query] half_life = "off": no recency preference
MAX_TEXT = 100_000
MAX_NAME = 512
DEFAULT_KIND = "note"
# The instants every part of the stack can hold, in UTC. PostgreSQL keeps far more (4713 BC to
# 294276 AD), but a value must also come back: psycopg reads a ``timestamptz`` into a Python
# ``datetime`` (years 1-9999) in the session's time zone, so an instant in year 1 read at a positive
# offset, or on 9999-12-31 read at a negative one, cannot be read at all -- and a row that cannot be
# read stops every delivery and query that touches it (issue 22, item 1). A day inside Python's
# range on each side covers every offset a time zone has (at most +-15:59 in PostgreSQL).
EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)
_RANGE_HINT = "timestamps must lie between 0001-01-02 and 9999-12-30 in UTC"


def utcnow() -> datetime:
    return datetime.now(UTC)


def content_hash(text: str) -> str:
    """Hash of exactly what gets embedded; a changed hash means the vector is stale."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_unicode(value: Any, what: str) -> None:
    """Refuse strings that are not Unicode text: an unpaired surrogate (``"\\ud800"`` is valid
    JSON, so an HTTP client can send one) cannot be encoded as UTF-8, so no store can hold it
    (found by the hostile-client harness: a 500 and a traceback). ``value``: a string or JSON."""
    try:
        if isinstance(value, str):
            value.encode("utf-8")
        else:
            json.dumps(value, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(
            f"{what} is not valid Unicode (an unpaired surrogate at position {exc.start})",
            hint="send text as UTF-8; a JSON \\uD800-\\uDFFF escape must be half of a pair",
        ) from None


def _shaped(value: str, shape: re.Pattern[str], what: str, hint: str) -> str:
    """``value`` if it is a string of ``shape``, else an InputError naming ``what``: the one check
    behind every identifier a caller passes (agent ids, kinds, entity types, metadata keys), so
    each is refused the same way, with its own shape in the hint."""
    if not isinstance(value, str) or not shape.match(value):
        raise InputError(f"invalid {what} {value!r}", hint=hint)
    return value


def validate_agent_id(value: str) -> str:
    return _shaped(
        value,
        _AGENT_ID,
        "agent id",
        "agent ids are 1-128 characters of letters, digits and _ . : @ - (starting alphanumeric)",
    )


def validate_kind(value: str) -> str:
    return _shaped(value, _KIND, "kind", "kinds are 1-64 characters of letters, digits and _ . -")


def validate_entity_type(value: str) -> str:
    return _shaped(
        value,
        _ENTITY_TYPE,
        "entity type",
        "entity types are identifiers: a letter, then letters, digits or _ (max 64), e.g. User",
    )


def validate_relation_type(value: str) -> str:
    """Any identifier of the documented shape, upper-cased (``said`` → ``SAID``)."""
    upper = value.upper() if isinstance(value, str) else value
    if not isinstance(upper, str) or not RELATION_TYPE_SHAPE.match(upper):
        raise InputError(
            f"invalid relationship type {value!r}",
            hint="relationship types are identifiers: a letter, then letters, digits or _ (max 64),"
            " e.g. SAID or WORKS_ON",
        )
    return upper


def is_meta_key(value: object) -> bool:
    """Metadata keys that may be filtered on are identifiers: they reach a payload path or SQL."""
    return isinstance(value, str) and _META_KEY.match(value) is not None


def validate_meta_key(value: str) -> str:
    return _shaped(
        value,
        _META_KEY,
        "metadata key",
        "metadata keys are identifiers: a letter or _, then letters, digits or _ (max 64)",
    )


@functools.lru_cache(maxsize=65536)
def normalise_name(name: str) -> str:
    """Identity of an entity name: NFKC, case-folded, inner whitespace collapsed.

    Cached: bulk paths (migrate, reembed, reconcile) build the entity keys of every memory, and the
    same few thousand names recur across hundreds of thousands of memories (two-thirds of the
    per-point cost of ``delivery.vector_point`` before the cache, benchmarks/ops.py).
    """
    return " ".join(unicodedata.normalize("NFKC", name).casefold().split())


@dataclass(frozen=True, slots=True)
class EntityRef:
    """An entity as the caller names it. Identity is (agent, type, normalised name)."""

    type: str
    name: str

    def __post_init__(self) -> None:
        validate_entity_type(self.type)
        if not isinstance(self.name, str) or not self.name.strip() or len(self.name) > MAX_NAME:
            raise InputError(f"invalid entity name {self.name!r}", hint=f"names are 1-{MAX_NAME} non-blank characters")
        if any(unicodedata.category(c) == "Cc" for c in self.name):
            raise InputError(f"entity name {self.name!r} contains control characters")
        check_unicode(self.name, "entity name")

    def key(self, agent_id: str) -> str:
        return entity_key(agent_id, self.type, self.name)

    @classmethod
    def stored(cls, type_: str, name: str) -> EntityRef:
        """An entity read back from PostgreSQL, not validated again (see ``Memory.stored``)."""
        ref = object.__new__(cls)
        object.__setattr__(ref, "type", type_)
        object.__setattr__(ref, "name", name)
        return ref

    @classmethod
    def parse(cls, spec: str) -> EntityRef:
        """``TYPE:NAME`` as typed on the command line (the name may itself contain ':')."""
        type_, sep, name = spec.partition(":")
        if not sep:
            raise InputError(f"entity {spec!r} is not TYPE:NAME", hint="write it like User:Alice")
        return cls(type_.strip(), name.strip())

    def as_dict(self) -> dict[str, str]:
        return {"type": self.type, "name": self.name}


def entity_key(agent_id: str, type_: str, name: str) -> str:
    return f"{agent_id}/{type_}:{normalise_name(name)}"


@dataclass(frozen=True, slots=True)
class MemoryRef:
    """A node that is a memory (``this`` is resolved to the memory's own id at parse time)."""

    id: uuid.UUID


NodeRef = EntityRef | MemoryRef


@dataclass(frozen=True, slots=True)
class Relation:
    source: NodeRef
    type: str
    target: NodeRef

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", validate_relation_type(self.type))

    def as_dict(self) -> dict[str, Any]:
        return {"from": node_to_json(self.source), "type": self.type, "to": node_to_json(self.target)}


def node_to_json(node: NodeRef) -> Any:
    if isinstance(node, MemoryRef):
        return {"memory": str(node.id)}
    return node.as_dict()


def node_from_json(value: Any, this_id: uuid.UUID) -> NodeRef:
    if value == "this":
        return MemoryRef(this_id)
    if isinstance(value, dict):
        if set(value) == {"memory"}:
            return MemoryRef(parse_uuid(value["memory"]))
        if set(value) == {"type", "name"}:
            return EntityRef(value["type"], value["name"])
    raise InputError(
        f"invalid relation node {value!r}",
        hint='a node is {"type": T, "name": N}, "this", or {"memory": UUID}',
    )


def node_from_spec(spec: str, this_id: uuid.UUID) -> NodeRef:
    """Command-line node: ``this``, ``memory:<uuid>`` or ``TYPE:NAME``."""
    spec = spec.strip()
    if spec == "this":
        return MemoryRef(this_id)
    if spec.lower().startswith("memory:"):
        return MemoryRef(parse_uuid(spec.split(":", 1)[1]))
    return EntityRef.parse(spec)


_REL_SPEC = re.compile(r"^\s*(?P<src>.+?)\s+-(?P<rel>[A-Za-z_]+)->\s+(?P<dst>.+?)\s*$")


def relation_from_spec(spec: str, this_id: uuid.UUID) -> Relation:
    """``"FROM -REL-> TO"`` as typed after ``--rel``."""
    m = _REL_SPEC.match(spec)
    if not m:
        raise InputError(f"relation {spec!r} is not 'FROM -REL-> TO'", hint='e.g. --rel "User:Alice -AUTHORED-> this"')
    return Relation(node_from_spec(m["src"], this_id), m["rel"], node_from_spec(m["dst"], this_id))


def parse_uuid(value: Any) -> uuid.UUID:
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except ValueError:
        raise InputError(
            f"{value!r} is not a UUID",
            hint="ids are UUIDs such as 0b5f8f5e-7d3a-4c1e-9a57-2f0c6b1d9e42, as `memoryctl add` prints them",
        ) from None


def parse_datetime(value: Any) -> datetime:
    """ISO 8601; a naive timestamp is taken as UTC so every store agrees on the instant.

    Refused unless it lies within ``EARLIEST``..``LATEST`` in UTC: what cannot be read back is
    refused at the door, never stored.
    """
    if isinstance(value, datetime):
        dt = value
    else:
        try:
            dt = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            raise InputError(f"{value!r} is not an ISO 8601 timestamp", hint="e.g. 2026-11-29T10:00:00Z") from None
    return check_instant(dt if dt.tzinfo else dt.replace(tzinfo=UTC), value)


def check_instant(dt: datetime, given: Any = None) -> datetime:
    """``dt`` (aware) if every store can hold and give back that instant, else an ``InputError``."""
    try:
        in_range = EARLIEST <= dt.astimezone(UTC) <= LATEST
    except OverflowError:  # its UTC instant is outside year 1-9999
        in_range = False
    if not in_range:
        shown = given if given is not None and not isinstance(given, datetime) else dt.isoformat()
        raise InputError(f"timestamp {shown!r} is out of range", hint=_RANGE_HINT)
    return dt


def ago(span: timedelta, *, now: datetime | None = None) -> datetime:
    """The instant ``span`` before ``now`` (``--since 7d``), or an ``InputError`` before ``EARLIEST``."""
    try:
        return check_instant((now or utcnow()) - span, f"{span.days}d ago")
    except OverflowError:
        raise InputError(f"{span.days} days ago is out of range", hint=_RANGE_HINT) from None


def is_duration(text: str) -> bool:
    return bool(_DURATION.match(text or ""))


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``15m``, ``2w``, ``90s``."""
    m = _DURATION.match(text or "") if isinstance(text, str) else None
    if not m:
        raise InputError(f"{text!r} is not a duration", hint="use a number and a unit: 90s, 15m, 12h, 7d, 2w")
    try:
        return timedelta(seconds=float(m[1]) * _UNITS[m[2]])
    except OverflowError:
        raise InputError(f"duration {text!r} is too long", hint="at most 999,999,999 days") from None


def parse_half_life(text: str | None) -> timedelta | None:
    """A recency half-life (``30d``), or None for ``off`` or none set: rank by relevance alone."""
    if text is None or text.strip().lower() == HALF_LIFE_OFF:
        return None
    return parse_duration(text)


@dataclass(slots=True)
class Memory:
    """One memory as stored in PostgreSQL (the source of truth)."""

    text: str
    agent_id: str
    id: uuid.UUID = field(default_factory=uuid.uuid4)
    kind: str = DEFAULT_KIND
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    entities: list[EntityRef] = field(default_factory=list)
    relations: list[Relation] = field(default_factory=list)
    deleted_at: datetime | None = None
    hash: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise InputError(
                f"memory text must be a string, not {type(self.text).__name__}", hint='e.g. {"text": "Alice: done"}'
            )
        if not self.text.strip():
            raise InputError("memory text is empty")
        if len(self.text) > MAX_TEXT:
            raise InputError(f"memory text is {len(self.text)} characters; the limit is {MAX_TEXT}")
        if "\x00" in self.text:
            raise InputError("memory text contains a NUL character", hint="PostgreSQL text cannot hold NUL; strip it")
        check_unicode(self.text, "memory text")
        validate_agent_id(self.agent_id)
        validate_kind(self.kind)
        if not isinstance(self.created_at, datetime):
            raise InputError(f"created_at must be a timestamp, not {type(self.created_at).__name__}")
        # The Python API takes datetimes as given: naive is UTC, as on the command line.
        self.created_at = parse_datetime(self.created_at)
        if not isinstance(self.metadata, dict):
            raise InputError("metadata must be a JSON object")
        check_unicode(self.metadata, "metadata")
        try:
            encoded = json.dumps(self.metadata, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InputError(f"metadata is not valid JSON: {exc}") from None
        if _JSON_NUL.search(encoded):
            raise InputError("metadata contains a NUL character", hint="PostgreSQL jsonb cannot hold \\u0000")
        self.entities = dedupe_entities(self.entities, self.agent_id)
        self.hash = self.hash or content_hash(self.text)
        if self.updated_at is None:
            self.updated_at = self.created_at

    @classmethod
    def stored(
        cls,
        *,
        id: uuid.UUID,
        agent_id: str,
        text: str,
        kind: str,
        created_at: datetime,
        updated_at: datetime | None,
        metadata: dict[str, Any],
        entities: list[EntityRef],
        relations: list[Relation],
        deleted_at: datetime | None,
        hash: str,
    ) -> Memory:
        """A memory read back from PostgreSQL, without ``__post_init__``'s checks.

        Every row passed them when it was written (and the table's constraints hold the rest), so
        checking again on read only costs: ~20 us per row, most of it the JSON encoding of the
        metadata, on paths that read every memory (migrate, reembed, the query engine's hydration).
        """
        m = object.__new__(cls)
        m.id, m.agent_id, m.text, m.kind = id, agent_id, text, kind
        m.created_at, m.updated_at, m.deleted_at = created_at, updated_at or created_at, deleted_at
        m.metadata, m.entities, m.relations, m.hash = metadata, entities, relations, hash
        return m

    @property
    def entity_keys(self) -> list[str]:
        return [e.key(self.agent_id) for e in self.entities]

    def all_entities(self) -> list[EntityRef]:
        """Mentioned entities plus every entity a relation names (graph nodes to create)."""
        nodes = list(self.entities)
        for rel in self.relations:
            nodes.extend(n for n in (rel.source, rel.target) if isinstance(n, EntityRef))
        return dedupe_entities(nodes, self.agent_id)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "agent_id": self.agent_id,
            "text": self.text,
            "kind": self.kind,
            "created_at": self.created_at.isoformat(),
            "updated_at": (self.updated_at or self.created_at).isoformat(),
            "content_hash": self.hash,
            "metadata": self.metadata,
            "entities": [e.as_dict() for e in self.entities],
            "relations": [r.as_dict() for r in self.relations],
            "deleted_at": self.deleted_at.isoformat() if self.deleted_at else None,
        }


def dedupe_entities(entities: Iterable[EntityRef], agent_id: str) -> list[EntityRef]:
    seen: dict[str, EntityRef] = {}
    for e in entities:
        seen.setdefault(e.key(agent_id), e)
    return list(seen.values())


@dataclass(frozen=True, slots=True)
class BadLine:
    """An input line refused, and why: the JSONL importer's and the vocabulary's verdict on one
    line of an import, which skips it and goes on (or, ``--strict``, refuses the file)."""

    line: int
    error: str
