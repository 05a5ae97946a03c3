"""From command-line values to an operation's request, for both ways the CLI parses them.

The typer commands (``memoryctl.cli.commands``) and the console script's fast path
(``memoryctl.cli.fast``) both hand the values they parsed here, keyed by the declaration's names
(``memoryctl.declaration.table``), so that a command sends the same request whichever parsed it.
Nothing is validated here: ``Operation.validate`` does that once, wherever the operation runs.
Standard library only: the fast path imports this on every call.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from memoryctl.declaration.declare import Operation
from memoryctl.errors import InputError


def _uuid() -> str:
    import uuid

    return str(uuid.uuid4())


def _trigger() -> str:
    from memoryctl.maintenance.runs import current_trigger

    return current_trigger()


def _actor() -> str | None:
    from memoryctl.maintenance.runs import current_actor

    return current_actor()


# What the command line fills in for a parameter it was not given (Param.fill says which).
FILLS: dict[str, Callable[[], Any]] = {"uuid": _uuid, "trigger": _trigger, "actor": _actor}


def _not_a_json_number(constant: str) -> Any:
    raise ValueError(constant)


def parse_pairs(pairs: list[str], flag: str) -> dict[str, Any]:
    """``key=value``; the value is JSON when it parses as JSON (numbers, booleans), else a string.
    NaN and Infinity, which Python's JSON reader takes and no JSON writer (the service's client, a
    jsonb column) gives back, are refused: a traceback through the service before."""
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise InputError(f"{flag} {pair!r} is not key=value", hint=f"e.g. {flag} sentiment=0.7")
        try:
            value: Any = json.loads(raw, parse_constant=_not_a_json_number)
        except json.JSONDecodeError:
            value = raw
        except ValueError as exc:
            raise InputError(
                f"{flag} {key.strip()!r}: {exc} is not a number JSON can hold",
                hint=f"write a finite number, or quote it for the text: {flag} '{key.strip()}=\"{exc}\"'",
            ) from None
        parsed[key.strip()] = value
    return parsed


def request(op: Operation, values: Mapping[str, Any]) -> dict[str, Any]:
    """The operation's parameters from the command line's values (None: not given, not sent)."""
    params: dict[str, Any] = {}
    for p in op.params:
        value = values.get(p.name)
        if p.pairs and value is not None:
            value = parse_pairs(list(value), p.option or p.name) or None
        elif p.type == "array" and not value:
            value = None  # a repeatable option not given
        if value is None and p.fill:
            value = FILLS[p.fill]()
        if value is not None:
            params[p.name] = value
    return params


def outputs(op: Operation, values: Mapping[str, Any]) -> dict[str, Any]:
    """The command line's own options (``--json``, ``--explain``): how to print, never sent."""
    return {o.name: bool(values.get(o.name)) for o in op.outputs}
