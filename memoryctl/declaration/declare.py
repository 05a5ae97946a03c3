"""What an operation is: its name, its parameters (type, default, range, help, command-line
spelling), what it may exit with, whether it writes, who may call it and on which profile.

Standard library only, and no implementation imported: the console script's fast path imports
this on every call (``memoryctl.cli.fast``). Every surface is generated from these values -- the
typer commands (``memoryctl.cli.commands``), the fast path's parser, the HTTP routes and their
OpenAPI document (``memoryctl.serve.app``, ``memoryctl.serve.openapi``) and the MCP tools
(``memoryctl.serve.mcp``) -- and ``Operation.validate`` is the one place a parameter's value is
checked (type, range, choices), whichever surface it came through.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from memoryctl.errors import InputError

JsonType = Literal["string", "integer", "number", "boolean", "array", "object"]
Access = Literal["agent", "any", "operator"]
Profile = Literal["embedded", "cluster"]
PROFILES: tuple[Profile, ...] = ("embedded", "cluster")

_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter: its JSON name and type on the wire, and how the command line spells it.

    ``flag`` is the option (``""``: ``--`` and the name with dashes) or None for a positional
    argument. ``pairs``: an object written as repeated ``key=value`` options (``--meta``).
    ``fill``: what the command line fills in when the option is not given (``uuid``: an ``add``'s
    id is chosen before it is sent, so a retry after a lost reply is idempotent; ``trigger`` and
    ``actor``: who ran a maintenance command, recorded with the run). ``cli=False``: not an option
    at all (filled, or only for other callers).
    """

    name: str
    type: JsonType
    help: str
    default: Any = None
    required: bool = False
    items: JsonType | None = None
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    flag: str | None = ""
    short: str | None = None
    off_flag: str | None = None  # a tri-state boolean's negative spelling (--useful/--not-useful)
    metavar: str | None = None
    pairs: bool = False
    fill: Literal["uuid", "trigger", "actor"] | None = None
    cli: bool = True

    @property
    def option(self) -> str | None:
        """The command line's spelling: ``--limit``, or None for a positional argument."""
        if self.flag is None:
            return None
        return self.flag or "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> Any:
        """``value`` if it is of this parameter's type, range and choices, else an ``InputError``."""
        if not _is(value, self.type) or (
            self.type == "array" and self.items and not all(_is(v, self.items) for v in value)
        ):
            of = f" of {self.items}s" if self.items else ""
            raise InputError(f"{self.name} must be {_article(self.type)}{of}, not {value!r}", hint=self.help)
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise InputError(
                f"{self.name} must be from {_num(self.low)} to {_num(self.high)}, not {value!r}", hint=self.help
            )
        if self.choices and value not in self.choices:
            raise InputError(f"{self.name} must be one of {', '.join(self.choices)}, not {value!r}", hint=self.help)
        return value

    def schema(self) -> dict[str, Any]:
        """JSON Schema of the value (OpenAPI and MCP ``inputSchema``)."""
        schema: dict[str, Any] = {"type": self.type, "description": self.help}
        if self.items:
            schema["items"] = {"type": self.items}
        if self.low is not None:
            schema["minimum"] = self.low
        if self.high is not None:
            schema["maximum"] = self.high
        if self.choices:
            schema["enum"] = list(self.choices)
        if self.default is not None:
            schema["default"] = self.default
        return schema


def _is(value: Any, kind: JsonType) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "number" and isinstance(value, float) and value != value:  # NaN compares with nothing
        return False
    return isinstance(value, _PY_TYPES[kind])


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _given(value: Any) -> bool:
    """A value a caller gave: not None, not a false flag, not an empty list or object."""
    return value is not None and value is not False and value != [] and value != {}


@dataclass(frozen=True, slots=True)
class Requires:
    """A parameter that means nothing without another (``--via`` needs ``--entity``): when
    ``param`` is set (truthy), ``needs`` must be too."""

    param: str
    needs: str
    error: str
    hint: str | None = None


@dataclass(frozen=True, slots=True)
class OneOf:
    """Exactly one of these parameters is given (``migrate``'s actions, ``outbox retry``'s rows or --all)."""

    params: tuple[str, ...]
    error: str
    hint: str | None = None


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation of ``memoryctl``, whichever surface runs it.

    ``run`` names its implementation (``module:function``), imported when it first runs: the
    declaration stays cheap to import. ``access``: who may call it with a token (``agent``: an
    agent's token, bound to its agent; ``any``: any valid token; ``operator``: the operator's
    token only; the Unix socket and the command line are the operator). ``local``: runs in the
    calling process only (``serve``, ``mcp``, ``config show``), never sent to the service.
    ``upload``: the parameter whose file is the request body (``import``). ``long``: may take
    minutes, so a caller sets no reply deadline. ``mcp``: offered as an MCP tool.
    ``reply``: the reply type (``memoryctl.declaration.replies``), whose schema is the OpenAPI 200
    body, the MCP ``outputSchema`` and the README's contract row. ``requires``/``one_of``: rules
    between parameters, checked by ``validate``. ``destructive``: it deletes what a caller cannot
    get back (an MCP hint). ``service_status``: its reply's ``components`` include the answering
    service's own status.
    """

    name: str
    summary: str
    params: tuple[Param, ...]
    run: str
    writes: bool = False
    access: Access = "operator"
    profiles: tuple[Profile, ...] = PROFILES
    exits: tuple[tuple[int, str], ...] = ((0, "ok"), (1, "failed"), (2, "bad input"))
    outputs: tuple[Param, ...] = ()
    local: bool = False
    upload: str | None = None
    long: bool = False
    mcp: bool = False
    reply: Any = None
    requires: tuple[Requires, ...] = ()
    one_of: tuple[OneOf, ...] = ()
    destructive: bool = False
    service_status: bool = False

    @property
    def path(self) -> str:
        """The HTTP route: ``/v1/query``, ``/v1/backup/status``."""
        return "/v1/" + self.name.replace(" ", "/")

    @property
    def tool(self) -> str:
        """The MCP tool's name: ``query``, ``backup_status``."""
        return self.name.replace(" ", "_")

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)

    def validate(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Every parameter checked, defaults filled in: the one check, whatever the surface.

        A parameter given as None (JSON ``null``) counts as not given.
        """
        known = {p.name for p in self.params}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise InputError(
                f"{self.name}: unknown parameter(s) {', '.join(unknown)}",
                hint=f"{self.name} takes {', '.join(sorted(known)) or 'no parameters'}",
            )
        out: dict[str, Any] = {}
        for p in self.params:
            value = raw.get(p.name)
            if value is None:
                if p.required:
                    raise InputError(f"{self.name}: parameter {p.name!r} is required", hint=p.help)
                out[p.name] = p.default
                continue
            out[p.name] = p.check(value)
        for rule in self.requires:
            if out[rule.param] and not out[rule.needs]:
                raise InputError(rule.error, hint=rule.hint)
        for choice in self.one_of:
            if sum(_given(out[name]) for name in choice.params) != 1:
                raise InputError(choice.error, hint=choice.hint)
        return out
