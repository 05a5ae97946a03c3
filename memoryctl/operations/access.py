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

import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memoryctl.declaration.declare import Operation
from memoryctl.errors import ConflictError, ExitCode, MemoryctlError, NotFoundError, StoreError, UsageError

if TYPE_CHECKING:
    from memoryctl.operations.tokens import AgentTokens


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


def caller_of(given: str, operator_token: str | None, tokens: AgentTokens) -> Caller | None:
    """Who ``given`` (a bearer token) stands for: the operator's token (``serve.token``, compared
    in constant time), an issued operator or agent token, or None. The one check of HTTP, MCP and
    the console's sign-in."""
    if operator_token is not None and hmac.compare_digest(given.encode(), operator_token.encode()):
        return OPERATOR
    entry = tokens.lookup(given)
    return None if entry is None else issued_caller(entry)


def status_for(exc: MemoryctlError) -> int:
    """HTTP status of a deliberate error (HTTP and the console alike): bad input 400, not allowed
    403, unknown id 404, an id of another agent 409, store down 503."""
    if isinstance(exc, AccessDenied):
        return 403
    if isinstance(exc, ConflictError):
        return 409
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, StoreError):
        return 503
    if exc.exit_code == ExitCode.USAGE:
        return 400
    return 500


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
