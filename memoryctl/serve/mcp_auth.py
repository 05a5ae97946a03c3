"""The MCP SDK's view of a caller: the service's token check hands it to ``/mcp`` requests, and
the tools read it back (``memoryctl.serve.mcp``). Apart so that the application can set it without
importing the tools."""

from __future__ import annotations

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken

from memoryctl.operations.access import OPERATOR, Caller


def authenticated(caller: Caller) -> AuthenticatedUser:
    """The SDK's user for a caller (the SDK keeps a session to the caller that opened it)."""
    claims = {"agent": caller.agent, "label": caller.label}  # the label: an issued token's name, for the runs log
    token = AccessToken(token="", client_id=caller.name, scopes=[], claims=claims)
    return AuthenticatedUser(token)


def current_caller() -> Caller:
    """The caller of the MCP request being handled (the token check runs before every one)."""
    access = get_access_token()
    if access is None:
        raise LookupError("no MCP caller: the token check did not run")
    claims = access.claims or {}
    agent, label = claims.get("agent"), claims.get("label")
    return Caller(agent or None, label=label) if agent or label else OPERATOR
