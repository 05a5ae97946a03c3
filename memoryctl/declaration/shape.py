"""How a reply type is declared and what is generated from it: ``Shape`` (the base of reply
types), ``field`` (a field with its description), ``schema`` (the JSON Schema of a type: the
OpenAPI 200 body, the MCP tool's ``outputSchema``, the README's contract table) and ``dump`` (a
reply value as its ``--json`` document, fields in declared order).

A reply type is a ``Shape`` whose annotations are JSON-shaped: ``str``, ``int``, ``float``,
``bool``, ``Any``, ``Literal``, ``X | None``, ``list[X]``, ``dict[str, X]`` and other reply types.
Standard library only: the declaration table imports it on the console script's fast path.
"""

from __future__ import annotations

import types
import typing
from typing import Any, ClassVar, Literal, Union, dataclass_transform


class Field:
    """One field of a reply type: what it means, and whether it may be left out."""

    __slots__ = ("help", "omit_none")

    def __init__(self, help: str, omit_none: bool) -> None:
        self.help = help
        self.omit_none = omit_none


def field(help: str, *, omit_none: bool = False) -> Any:
    """A reply field and what it means (its description in every generated schema). ``omit_none``:
    the key is left out of the document when its value is None (``nightly``'s ``pruned``)."""
    return Field(help, omit_none)


@dataclass_transform(kw_only_default=True, field_specifiers=(field,))
class Shape:
    """The base of reply types: a class of annotated ``field``s, built with keyword arguments.

    Not ``dataclasses.dataclass``: that writes and compiles code for every class, which the
    console script's fast path would pay on every call for thirty replies it never builds.
    """

    __fields__: ClassVar[tuple[tuple[str, Field], ...]] = ()

    def __init_subclass__(cls) -> None:
        own = cls.__dict__.get("__annotations__", {})  # noqa: RUF063 (inspect costs the fast path ~10 ms)
        cls.__fields__ = tuple((name, cls.__dict__[name]) for name in own)
        for name in own:
            delattr(cls, name)

    def __init__(self, **values: Any) -> None:
        for name, f in self.__fields__:
            if name in values:
                setattr(self, name, values.pop(name))
            elif f.omit_none:
                setattr(self, name, None)
            else:
                raise TypeError(f"{type(self).__name__}: {name} is required")
        if values:
            raise TypeError(f"{type(self).__name__}: no field {', '.join(sorted(values))}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dump(self)!r})"


def dump(value: Any) -> Any:
    """``value`` as JSON data: a reply type's fields in declared order, recursively."""
    if isinstance(value, Shape):
        out = {}
        for name, f in value.__fields__:
            item = getattr(value, name)
            if item is None and f.omit_none:
                continue
            out[name] = dump(item)
        return out
    if isinstance(value, list):
        return [dump(v) for v in value]
    if isinstance(value, dict):
        return {k: dump(v) for k, v in value.items()}
    return value


_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean"}


def schema(tp: Any, help: str | None = None) -> dict[str, Any]:
    """The JSON Schema of a reply type (or of any annotation a reply type uses)."""
    out = _schema(tp)
    if help:
        out = {**out, "description": help}
    return out


def _schema(tp: Any) -> dict[str, Any]:
    if tp is Any:
        return {}
    if tp in _SIMPLE:
        return {"type": _SIMPLE[tp]}
    if tp is type(None):
        return {"type": "null"}
    if isinstance(tp, type) and issubclass(tp, Shape):
        return dict(_object(tp))
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema(a) for a in args]}
    if origin is list:
        return {"type": "array", "items": _schema(args[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(args[1])}
    raise TypeError(f"no JSON Schema for {tp!r}")


_OBJECTS: dict[str, dict[str, Any]] = {}


def _object(tp: type[Shape]) -> dict[str, Any]:
    key = f"{tp.__module__}.{tp.__qualname__}"
    if key not in _OBJECTS:
        _OBJECTS[key] = _build(tp)
    return _OBJECTS[key]


def _build(tp: type[Shape]) -> dict[str, Any]:
    hints = typing.get_type_hints(tp)
    doc = (tp.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    return {
        "type": "object",
        **({"description": doc} if doc else {}),
        "properties": {name: schema(hints[name], f.help) for name, f in tp.__fields__},
        "required": [name for name, f in tp.__fields__ if not f.omit_none],
    }


def described(tp: Any) -> list[tuple[str, str]]:
    """(field, description) of a reply type's top level, for the README's contract table."""
    if typing.get_origin(tp) is list:
        return described(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (Union, types.UnionType):
        return [row for arg in typing.get_args(tp) for row in described(arg)]
    if not (isinstance(tp, type) and issubclass(tp, Shape)):
        return []
    return [(name, f.help) for name, f in tp.__fields__]
