"""Every surface of an operation is its declaration: the HTTP route and OpenAPI schema, the MCP
tool, and who may call it with an agent token (issue 23).

The end-to-end tests (tests/e2e/test_serve.py, test_mcp.py) call a few operations through a live
service; this checks every operation of the table, in milliseconds, so that an operation added
to the table without its surfaces, or a surface written by hand beside the table, fails here.
"""

from __future__ import annotations

import pytest

from memoryctl.declaration.declare import Operation
from memoryctl.declaration.table import OPERATIONS
from memoryctl.operations.access import OPERATOR, AccessDenied, Caller, bind
from memoryctl.serve import mcp, openapi

SHARED = [op for op in OPERATIONS.values() if not op.local]
AGENT = Caller("agent-b")


def _shown(op: Operation) -> dict[str, object]:
    """What a caller other than the command line may send: every parameter but those only the
    command line fills in."""
    return {p.name: p.schema() for p in op.params if not p.fill or p.cli}


def test_openapi_has_a_route_per_operation_with_the_declared_schema() -> None:
    paths = openapi.document()["paths"]
    assert {op.path for op in SHARED} <= set(paths)
    assert not {op.path for op in OPERATIONS.values() if op.local} & set(paths)
    for op in SHARED:
        spec = paths[op.path]["post"]
        assert spec["x-exit-codes"] == {str(code): what for code, what in op.exits}, op.name
        if op.upload:
            assert {q["name"]: q["schema"] for q in spec["parameters"]} == _shown(op), op.name
            continue
        schema = spec["requestBody"]["content"]["application/json"]["schema"]
        assert schema["properties"] == _shown(op), op.name
        assert schema["required"] == [p.name for p in op.params if p.required], op.name
        assert schema["additionalProperties"] is False


def test_the_mcp_tools_are_the_declared_ones_with_their_schemas() -> None:
    tools = {op.tool: mcp.tool(op) for op in mcp.TOOLS.values()}
    assert set(tools) == {op.tool for op in OPERATIONS.values() if op.mcp}
    assert {"add", "query", "get", "forget", "stats", "health"} <= set(tools)
    for name, tool in tools.items():
        op = mcp.TOOLS[name]
        assert tool.input_schema["properties"] == _shown(op), name
        assert tool.input_schema["required"] == [p.name for p in op.params if p.required], name
        assert tool.annotations is not None and tool.annotations.read_only_hint is (not op.writes), name


@pytest.mark.parametrize("op", SHARED, ids=[op.name for op in SHARED])
def test_an_agent_token_is_bound_to_its_agent_on_every_operation(op: Operation) -> None:
    assert bind(op, {"x": 1}, OPERATOR) == {"x": 1}  # the operator: unchanged
    if op.access == "operator":
        with pytest.raises(AccessDenied, match=f"may not run {op.name}"):
            bind(op, {}, AGENT)
        return
    if op.access == "any":
        assert bind(op, {}, AGENT) == {}
        return
    # every operation an agent may run is scoped by an agent parameter, and it is the token's
    assert "agent" in {p.name for p in op.params}, op.name
    assert bind(op, {}, AGENT) == {"agent": "agent-b"}
    assert bind(op, {"agent": "agent-b"}, AGENT)["agent"] == "agent-b"
    with pytest.raises(AccessDenied, match="bound to agent 'agent-b', not 'agent-a'"):
        bind(op, {"agent": "agent-a"}, AGENT)
    with pytest.raises(AccessDenied, match="not every agent"):
        bind(op, {"all_agents": True}, AGENT)


def test_what_an_agent_token_opens() -> None:
    opened = {op.name for op in SHARED if op.access != "operator"}
    assert opened == {"query", "get", "add", "import", "forget", "stats", "health"}
