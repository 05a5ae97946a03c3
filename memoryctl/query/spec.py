"""What a caller can ask: ``MemoryQuery`` and its parts, parsed and validated before planning.

Every field name that can reach a store as an identifier is checked against a whitelist here;
values stay values (bound parameters in SQL/Cypher, payload values in Qdrant).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from memoryctl.declaration.table import QUERY
from memoryctl.errors import InputError
from memoryctl.model import (
    EntityRef,
    ago,
    check_unicode,
    is_duration,
    parse_datetime,
    parse_duration,
    parse_half_life,
    validate_agent_id,
    validate_kind,
    validate_meta_key,
    validate_relation_type,
)
from memoryctl.query_terms import OPS, Combine, Direction, MetaOp, Retrieval

CANONICAL_FIELDS = ("kind", "agent_id", "created_at")

_WHERE = re.compile(
    r"^\s*(?P<field>[A-Za-z_][A-Za-z0-9_.]*)\s*(?P<op>!=|<=|>=|=|<|>|\bin\b)\s*(?P<value>.*?)\s*$", re.S
)


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    """An ISO timestamp, or a duration meaning 'that long ago' (``7d`` = the last 7 days)."""
    if is_duration(text):
        return ago(parse_duration(text), now=now or datetime.now(UTC))
    return parse_datetime(text)


@dataclass(frozen=True, slots=True)
class Where:
    """One relational filter. ``field`` is a canonical column or ``meta.<key>`` (metadata)."""

    field: str
    op: MetaOp
    value: Any

    @property
    def meta_key(self) -> str | None:
        return self.field[5:] if self.field.startswith("meta.") else None

    @classmethod
    def parse(cls, text: str) -> Where:
        m = _WHERE.match(text)
        if not m:
            raise InputError(
                f"--where {text!r} is not 'field OP value'",
                hint="ops: = != < <= > >= in; fields: kind, agent_id, created_at, or a metadata key",
            )
        return cls.build(m["field"], m["op"], _value(m["value"], m["op"]))

    @classmethod
    def build(cls, field_: str, op_text: str, value: Any) -> Where:
        op = next((o for o in OPS if o == op_text), None)
        if op is None:
            raise InputError(f"unknown operator {op_text!r}", hint="ops: " + " ".join(OPS))
        if field_ in CANONICAL_FIELDS:
            name = field_
        else:
            key = field_
            for prefix in ("meta.", "metadata."):
                if field_.startswith(prefix):
                    key = field_[len(prefix) :]
                    break
            name = "meta." + validate_meta_key(key)
        if op == "in":
            if not isinstance(value, list) or not value:
                raise InputError(
                    f"'{field_} in …' needs a non-empty list",
                    hint='e.g. kind in ["note","event"] or kind in note,event',
                )
            values = value
        else:
            if isinstance(value, list | dict):
                raise InputError(f"'{field_} {op} …' needs a single value")
            values = [value]
        if name == "created_at":
            values = [parse_datetime(v) for v in values]
        elif name == "kind":
            values = [validate_kind(str(v)) for v in values]
        elif name == "agent_id":
            values = [validate_agent_id(str(v)) for v in values]
        else:
            for v in values:
                check_unicode(v, "--where value")
                if not isinstance(v, str | int | float | bool):
                    raise InputError(f"metadata filter values must be strings, numbers or booleans, not {v!r}")
                if op in ("<", "<=", ">", ">=") and (isinstance(v, bool) or not isinstance(v, int | float)):
                    raise InputError(
                        f"'{field_} {op} {v!r}': range operators compare numbers",
                        hint="use = != or in for strings and booleans",
                    )
        if name in ("kind", "agent_id") and op not in ("=", "!=", "in"):
            raise InputError(f"{name} supports only = != in")
        return cls(name, op, values if op == "in" else values[0])


QUOTING_HINT = (
    'a value in double quotes is a JSON string (\\" and \\\\ inside), in single quotes an SQL-style string'
    " ('' inside is one '); unquoted, a number, true or false, else the text as written;"
    " `in` takes a JSON array or a comma-separated list of such values"
)


def _value(raw: str, op: str) -> Any:
    """The value of ``field OP value`` by rules a user can predict (README, "--where values"):

    - ``"…"`` is a JSON string, ``'…'`` an SQL-style string (``''`` is one quote); the quote
      must close at the end of the value, else it is an error, never a guess;
    - unquoted: a JSON number, ``true`` or ``false``; anything else is the text as written
      (trimmed): ``note = hello world``; ``null``, ``NaN`` and ``Infinity`` are refused (no
      memory's value equals them, and no store orders them the same way);
    - ``in``: a JSON array, or a comma-separated list (optionally in ``()`` or ``[]``) of values
      following the rules above; a comma inside quotes belongs to the value.
    """
    text = raw.strip()
    if op == "in":
        if text.startswith("["):
            parsed = _json(text)
            if isinstance(parsed, list):
                return [_checked(v) for v in parsed]
        if text[:1] + text[-1:] in ("()", "[]"):
            text = text[1:-1]
        return [_scalar(part) for part in _split_list(text)]
    return _scalar(text)


def _json(text: str) -> Any:
    """``text`` as JSON, with NaN and Infinity refused; ``_NOT_JSON`` when it is not JSON."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError:
        return _NOT_JSON
    except RecursionError:
        raise InputError("--where value nested too deeply") from None


_NOT_JSON = object()


def _no_constant(name: str) -> Any:
    raise InputError(
        f"--where value {name} is not a number a filter can compare",
        hint=f'write a finite number, or "{name}" in quotes for the text',
    )


def _scalar(text: str) -> Any:
    text = text.strip()
    if not text:
        raise InputError("--where value is empty", hint="write '' for the empty string")
    if text[0] == '"':
        value = _json(text)
        if not isinstance(value, str):
            raise InputError(f"unbalanced or malformed double-quoted value {text!r}", hint=QUOTING_HINT)
        return value
    if text[0] == "'":
        body = text[1:-1] if len(text) >= 2 and text[-1] == "'" else None
        if body is None or body.replace("''", "").count("'"):
            raise InputError(f"unbalanced single-quoted value {text!r}", hint=QUOTING_HINT)
        return body.replace("''", "'")
    if text in ("NaN", "Infinity", "-Infinity"):
        _no_constant(text)
    value = _json(text)
    if value is _NOT_JSON:
        return text
    return value if isinstance(value, list | dict) else _checked(value)


def _checked(value: Any) -> Any:
    """A JSON scalar a filter can compare: no null, numbers finite and within a double's range."""
    if value is None:
        raise InputError("--where value null matches nothing", hint="write 'null' in quotes for the text")
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"--where value {value} is not a finite number", hint="write a finite number")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_EXACT_INT:
        raise InputError(
            f"--where value {value} is beyond the integers a filter compares exactly (+-2**53)",
            hint="write it in quotes to match it as text",
        )
    return value


# The stores compare metadata numbers as doubles (jsonb numeric casts, Qdrant's range filter):
# integers beyond 2**53 would compare approximately, so they are refused instead of half-matched.
MAX_EXACT_INT = 2**53


def _split_list(text: str) -> list[str]:
    """Split on commas outside quotes; a quote opened and never closed is an error."""
    parts, current, quote, i = [], "", "", 0
    while i < len(text):
        c = text[i]
        if not quote:
            if c == ",":
                parts.append(current)
                current = ""
            else:
                quote = c if c in "'\"" and not current.strip() else ""
                current += c
        else:
            current += c
            nxt = text[i + 1 : i + 2]
            if quote == '"' and c == "\\" and nxt:
                current, i = current + nxt, i + 1  # an escaped character stays inside
            elif quote == "'" and c == "'" and nxt == "'":
                current, i = current + nxt, i + 1  # '' is one quote inside
            elif c == quote and len(current.strip()) > 1:
                quote = ""
        i += 1
    if quote:
        raise InputError(f"unbalanced quote in --where list {text!r}", hint=QUOTING_HINT)
    parts.append(current)
    return [p for p in parts if p.strip()]


def _declared(name: str, value: Any) -> None:
    """A query field checked by its declaration (``memoryctl.declaration.table``: type, range,
    choices): the one check, whether the query came from the command line, HTTP, MCP or Python."""
    QUERY.param(name).check(value)


@dataclass(frozen=True, slots=True)
class GraphFilter:
    entity: EntityRef
    via: tuple[str, ...] = ()
    hops: int = 1
    direction: Direction = "both"

    def __post_init__(self) -> None:
        object.__setattr__(self, "via", tuple(validate_relation_type(v) for v in self.via))
        _declared("hops", self.hops)
        _declared("direction", self.direction)


# The query's parameters that are its fields as declared: the declaration's check is all they need.
_AS_DECLARED = ("text", "combine", "limit", "threshold", "retrieval", "rerank")


@dataclass(frozen=True, slots=True)
class MemoryQuery:
    """One question over all three stores. ``agent_id`` scopes it unless ``all_agents``.

    A value: nothing changes it once made. ``validate`` returns the normalised query the engine
    runs (blank text dropped, ``all_agents`` without an agent id), and the engine resolves the
    configured half-life into a copy of its own; the caller's query stays as it was asked.
    """

    text: str | None = None
    vector: Sequence[float] | None = None
    agent_id: str | None = None
    all_agents: bool = False
    since: datetime | None = None
    until: datetime | None = None
    graph: GraphFilter | None = None
    where: Sequence[Where] = ()
    combine: Combine = "and"
    limit: int = 10
    threshold: float | None = None
    half_life: timedelta | None = None  # None: the agent's configured half-life (none by default)
    decay: bool = True  # False: rank without the recency preference, whatever is configured
    retrieval: Retrieval = "hybrid"
    rerank: bool | None = None  # the cross-encoder stage (memoryctl.query.rerank); None: as configured
    query_id: uuid.UUID = field(default_factory=uuid.uuid4)

    def __post_init__(self) -> None:
        object.__setattr__(self, "where", tuple(self.where))

    @classmethod
    def from_params(cls, p: Mapping[str, Any], *, agent_id: str | None) -> MemoryQuery:
        """The query a caller sent as the ``query`` operation's parameters (``QUERY.validate``
        has checked and filled them in), whichever surface it came through: each filter is parsed
        beside the field it fills, so a new one is declared in the table and written here.
        ``agent_id``: the scope the caller's agent resolves to (``all_agents``: None)."""
        entity = p["entity"]
        graph = (
            GraphFilter(EntityRef.parse(entity), tuple(p["via"] or ()), p["hops"], p["direction"]) if entity else None
        )
        # "off" overrides a configured half-life; none given: the agent's configured one, if any.
        half_life = parse_half_life(p["half_life"]) if p["half_life"] else None
        return cls(
            **{name: p[name] for name in _AS_DECLARED},
            agent_id=agent_id,
            all_agents=bool(p["all_agents"]),
            since=parse_since(p["since"]) if p["since"] else None,
            until=parse_datetime(p["until"]) if p["until"] else None,
            graph=graph,
            where=[Where.parse(w) for w in p["where"] or []],
            half_life=half_life,
            decay=half_life is not None if p["half_life"] else True,
        )

    def validate(self) -> MemoryQuery:
        """The query as the engine runs it (a new value when anything was normalised), or
        ``InputError`` naming what is wrong."""
        if self.text is not None:
            check_unicode(self.text, "query text")
        if self.text is not None and not self.text.strip():
            return dataclasses.replace(self, text=None).validate()
        if self.all_agents and self.agent_id is not None:
            return dataclasses.replace(self, agent_id=None).validate()
        if self.text is not None and self.vector is not None:
            raise InputError("give text or a vector, not both")
        if not self.all_agents and not self.agent_id:
            raise InputError("a query is scoped to one agent", hint="pass --agent A, or --all-agents as an operator")
        if self.agent_id is not None:
            validate_agent_id(self.agent_id)
        if self.graph is not None and self.agent_id is None:
            raise InputError(
                "a graph filter needs an agent: entity keys are per agent",
                hint="pass --agent A instead of --all-agents",
            )
        for name in ("limit", "retrieval", "combine"):
            _declared(name, getattr(self, name))
        if self.threshold is not None:
            _declared("threshold", self.threshold)
        if self.vector is not None and self.retrieval == "lexical":
            raise InputError("a raw vector has no words for the lexical leg", hint="give TEXT, or retrieval dense")
        if self.since and self.until and self.since > self.until:
            raise InputError("--since is after --until")
        if self.half_life is not None and self.half_life.total_seconds() <= 0:
            raise InputError("half-life must be positive")
        if not (self.text or self.vector is not None or self.graph or self.where or self.since or self.until):
            raise InputError("empty query", hint="give TEXT, --entity, --where, or --since/--until")
        return self

    @property
    def has_vector_leg(self) -> bool:
        return self.text is not None or self.vector is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "vector": None if self.vector is None else f"<{len(self.vector)} floats>",
            "agent_id": self.agent_id,
            "all_agents": self.all_agents,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "graph": None
            if not self.graph
            else {
                "entity": self.graph.entity.as_dict(),
                "via": list(self.graph.via),
                "hops": self.graph.hops,
                "direction": self.graph.direction,
            },
            "where": [{"field": w.field, "op": w.op, "value": w.value} for w in self.where],
            "combine": self.combine,
            "limit": self.limit,
            "threshold": self.threshold,
            "half_life_s": self.half_life.total_seconds() if self.half_life and self.decay else None,
            "retrieval": self.retrieval,
            "rerank": self.rerank,
        }
