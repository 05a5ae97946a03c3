"""Who may run what: the operator, or an agent holding a token bound to it.

The command line and the Unix socket are the operator (the socket's file mode is the access
control). Over HTTP and MCP the bearer token says who calls (``Caller``): the operator's token
opens every operation and every agent; an agent token (``memoryctl.operations.tokens``) opens only
the operations declared ``access="agent"`` or ``"any"`` (``memoryctl.declaration.table``). ``bind``
applies it to one request: an ``"any"`` operation (``health``) runs as sent; an ``"agent"`` one
(query, get, add, import, forget, stats) is bound to the token's agent: a request for another
agent, or for every agent, is refused (``AccessDenied``, HTTP 403), and one that names no agent is
answered for the token's, so ``get`` and ``forget`` find only that agent's memories; any other
operation is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memoryctl.declaration.declare import Operation
from memoryctl.errors import UsageError


class AccessDenied(UsageError):
    """The caller's token does not open this operation or this agent (HTTP 403)."""


@dataclass(frozen=True, slots=True)
class Caller:
    agent: str | None = None  # None: the operator
    label: str | None = field(default=None, compare=False)  # an issued token's name

    @property
    def operator(self) -> bool:
        return self.agent is None

    @property
    def name(self) -> str:
        who = "operator" if self.agent is None else f"agent:{self.agent}"
        return who if self.label is None else f"{who} ({self.label})"


OPERATOR = Caller()


def issued_caller(entry: Mapping[str, Any]) -> Caller:
    """The caller an issued token's entry (``memoryctl.operations.tokens``) stands for."""
    return Caller(None if entry.get("operator") else str(entry["agent"]), label=str(entry["name"]))


def bind(op: Operation, params: Mapping[str, Any], caller: Caller) -> dict[str, Any]:
    """``params`` as ``caller`` may send them (an agent's own agent filled in), or ``AccessDenied``."""
    if caller.agent is None or op.access == "any":
        return dict(params)
    if op.access == "operator":
        raise AccessDenied(
            f"an agent token may not run {op.name}",
            hint="operations for agents: query, get, add, import, forget, stats",
        )
    if params.get("all_agents"):
        raise AccessDenied(f"this token is bound to agent {caller.agent!r}: not every agent")
    given = params.get("agent")
    if given is not None and given != caller.agent:
        raise AccessDenied(f"this token is bound to agent {caller.agent!r}, not {given!r}")
    return {**params, "agent": caller.agent}
