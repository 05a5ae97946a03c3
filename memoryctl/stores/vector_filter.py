"""``VectorFilter`` → a small engine-neutral condition tree, with the filter semantics decided here.

Both vector engines (qdrant-client's models, Qdrant Edge's condition objects) express the same
payload conditions; what a ``VectorFilter`` *means* is decided once, in ``build_filter``, and each
engine only maps these few node types onto its own constructors:

- a metadata ``!=`` follows SQL: a point without the key does not satisfy it (it is NULL there);
- a number is matched as a point range, so ``1`` also finds ``1.0`` after a JSON round trip
  (integers beyond float precision are matched exactly instead);
- the time range is half-open ``[from, to)``, so consecutive windows never count a memory twice;
- soft-deleted points are excluded unless the filter asks for them (reconciliation only).

No user value is ever spliced into a string an engine parses: values travel in these nodes, and
metadata keys reach a payload *path* only after ``validate_meta_key``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from memoryctl.errors import InputError
from memoryctl.model import validate_meta_key
from memoryctl.stores.protocols import MetaCondition, VectorFilter


@dataclass(frozen=True, slots=True)
class Match:
    key: str
    value: str | int | bool


@dataclass(frozen=True, slots=True)
class MatchAny:
    key: str
    values: tuple[str, ...]


B = TypeVar("B", float, datetime)


@dataclass(frozen=True, slots=True)
class _Bounds(Generic[B]):
    """Bounds on ``key``; unset bounds are open. The engines map numbers and datetimes to
    different range constructors, hence one subclass each."""

    key: str
    gt: B | None = None
    gte: B | None = None
    lt: B | None = None
    lte: B | None = None


@dataclass(frozen=True, slots=True)
class Range(_Bounds[float]):
    """A numeric range."""


@dataclass(frozen=True, slots=True)
class TimeRange(_Bounds[datetime]):
    """A datetime range (aware UTC)."""


@dataclass(frozen=True, slots=True)
class HasId:
    ids: tuple[uuid.UUID, ...]


@dataclass(frozen=True, slots=True)
class IsEmpty:
    """The key is missing or null."""

    key: str


@dataclass(frozen=True, slots=True)
class AnyOf:
    """At least one of the conditions holds."""

    conditions: tuple[Condition, ...]


Condition = Match | MatchAny | Range | TimeRange | HasId | IsEmpty | AnyOf


@dataclass(frozen=True, slots=True)
class Filter:
    must: list[Condition] = field(default_factory=list)
    must_not: list[Condition] = field(default_factory=list)


_RANGE_OP = {"<": "lt", "<=": "lte", ">": "gt", ">=": "gte"}


def to_utc(value: datetime) -> datetime:
    """Aware UTC; a naive datetime is taken to be UTC already (that is what memoryctl stores)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def meta_key(key: str) -> str:
    """The payload path of a metadata key."""
    return f"meta.{validate_meta_key(key)}"


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def meta_value_error(cond: MetaCondition, why: str) -> InputError:
    return InputError(
        f"metadata filter {cond.key} {cond.op} {cond.value!r}: {why}",
        hint="= / != / in take strings, integers, floats or booleans; < <= > >= take numbers or datetimes",
    )


def _eq(key: str, value: Any, cond: MetaCondition) -> Condition:
    if isinstance(value, bool | str):
        return Match(key, value)
    if is_number(value):
        if isinstance(value, int) and abs(value) > 2**53:  # beyond float precision: match exactly
            return Match(key, value)
        return Range(key, gte=float(value), lte=float(value))
    raise meta_value_error(cond, "unsupported value type")


def _meta(cond: MetaCondition) -> tuple[list[Condition], list[Condition]]:
    """(must, must_not) for one metadata condition."""
    key = meta_key(cond.key)
    if cond.op == "=":
        return [_eq(key, cond.value, cond)], []
    if cond.op == "!=":
        return [], [IsEmpty(key), _eq(key, cond.value, cond)]
    if cond.op == "in":
        values = list(cond.value) if isinstance(cond.value, list | tuple | set | frozenset) else None
        if not values:
            raise meta_value_error(cond, "'in' needs a non-empty list")
        if all(isinstance(v, str) for v in values):
            return [MatchAny(key, tuple(values))], []
        return [AnyOf(tuple(_eq(key, v, cond) for v in values))], []
    if cond.op in _RANGE_OP:
        bound = {_RANGE_OP[cond.op]: cond.value}
        if isinstance(cond.value, datetime):
            return [TimeRange(key, **{k: to_utc(v) for k, v in bound.items()})], []
        if is_number(cond.value):
            return [Range(key, **{k: float(v) for k, v in bound.items()})], []
        raise meta_value_error(cond, "ranges need a number or a datetime")
    raise meta_value_error(cond, "unknown operator")


def build_filter(flt: VectorFilter, ids: Sequence[uuid.UUID] | None = None) -> Filter:
    """The conditions of ``flt`` with ``ids`` (one chunk of ``flt.ids``) in place of ``flt.ids``."""
    out = Filter()
    if flt.agent_id is not None:
        out.must.append(Match("agent_id", flt.agent_id))
    if ids is not None:
        out.must.append(HasId(tuple(ids)))
    if flt.kinds is not None:
        out.must.append(MatchAny("kind", tuple(flt.kinds)))
    if flt.exclude_kinds:
        out.must_not.append(MatchAny("kind", tuple(flt.exclude_kinds)))
    if flt.created_from is not None or flt.created_to is not None:
        out.must.append(
            TimeRange(
                "created_at",
                gte=to_utc(flt.created_from) if flt.created_from else None,
                lt=to_utc(flt.created_to) if flt.created_to else None,
            )
        )
    if flt.entity_keys_any is not None:
        out.must.append(MatchAny("entity_keys", tuple(flt.entity_keys_any)))
    for cond in flt.meta:
        must, must_not = _meta(cond)
        out.must.extend(must)
        out.must_not.extend(must_not)
    if not flt.include_deleted:
        out.must_not.append(Match("deleted", True))
    return out


def empty_selection(flt: VectorFilter) -> bool:
    """An empty candidate list selects nothing (it is a set, not "no restriction": that is None)."""
    return any(v is not None and len(v) == 0 for v in (flt.ids, flt.kinds, flt.entity_keys_any))
