"""Every surface of an operation is its declaration: the HTTP route and OpenAPI schema, the MCP
tool, and who may call it with an agent token (issue 23).

The end-to-end tests (tests/e2e/test_serve.py, test_mcp.py) call a few operations through a live
service; this checks every operation of the table, in milliseconds, so that an operation added
to the table without its surfaces, or a surface written by hand beside the table, fails here.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from memoryctl.declaration.declare import Operation
from memoryctl.declaration.replies import Added, Bucket, Stats
from memoryctl.declaration.shape import dump
from memoryctl.declaration.table import OPERATIONS
from memoryctl.errors import InputError
from memoryctl.operations.access import OPERATOR, AccessDenied, Caller, bind
from memoryctl.serve import mcp, openapi

SHARED = [op for op in OPERATIONS.values() if not op.local]
AGENT = Caller("agent-b")


def _shown(op: Operation) -> dict[str, object]:
    """What a caller other than the command line may send: every parameter but those only the
    command line fills in."""
    return {p.name: p.schema() for p in op.params if not p.fill or p.cli}


def _resolved(doc: dict[str, Any], node: Any) -> Any:
    """``node`` with every ``$ref`` to ``components/schemas`` replaced by what it names (the document
    names the reply and request types for the generated clients; the schemas are the declared ones)."""
    if isinstance(node, list):
        return [_resolved(doc, item) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        rest = {k: v for k, v in node.items() if k != "$ref"}
        named = doc["components"]["schemas"][node["$ref"].removeprefix("#/components/schemas/")]
        return {**_resolved(doc, named), **rest}
    return {key: _resolved(doc, value) for key, value in node.items()}


def test_openapi_has_a_route_per_operation_with_the_declared_schema() -> None:
    doc = openapi.document()
    paths = doc["paths"]
    assert {op.path for op in SHARED} <= set(paths)
    assert not {op.path for op in OPERATIONS.values() if op.local} & set(paths)
    for op in SHARED:
        spec = paths[op.path]["post"]
        assert spec["x-exit-codes"] == {str(code): what for code, what in op.exits}, op.name
        if op.upload:
            assert {q["name"]: q["schema"] for q in spec["parameters"]} == _shown(op), op.name
            continue
        schema = _resolved(doc, spec["requestBody"]["content"]["application/json"]["schema"])
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


@pytest.mark.parametrize("op", SHARED, ids=[op.name for op in SHARED])
def test_every_operation_declares_its_reply_and_the_schemas_are_generated_from_it(op: Operation) -> None:
    assert op.reply is not None, op.name
    doc = openapi.document()
    schema = _resolved(doc, doc["paths"][op.path]["post"]["responses"]["200"]["content"]["application/json"])
    assert schema["schema"] == openapi.reply_schema(op) and schema["schema"].get("description"), op.name
    jsonschema.Draft202012Validator.check_schema(schema["schema"])
    if op.mcp:
        output = mcp.tool(op).output_schema
        assert output is not None and output["type"] == "object", op.name
        jsonschema.Draft202012Validator.check_schema(output)


def test_a_reply_type_is_its_json_document_in_declared_order() -> None:
    added = Added(id="u1", pending={"vector": 0})
    assert list(dump(added)) == ["id", "pending"]
    jsonschema.validate(dump(added), openapi.reply_schema(OPERATIONS["add"]))
    # a field that may be left out (stats' n/avg/min/max without --metric) is not required
    stats = Stats(agent_id=None, bucket_s=60.0, metric=None, kind=None, buckets=[Bucket(bucket="t", count=1)])
    assert dump(stats)["buckets"] == [{"bucket": "t", "count": 1}]
    jsonschema.validate(dump(stats), openapi.reply_schema(OPERATIONS["stats"]))
    with pytest.raises(TypeError, match="id is required"):
        Added(pending={})


def test_an_mcp_result_matches_the_tools_output_schema() -> None:
    from memoryctl.operations.reply import Reply

    for name, data in (("add", {"id": "u1", "pending": {}}), ("health", {"prometheus": "up 1\n"})):
        structured = mcp.result(Reply(data)).structured_content
        jsonschema.validate(structured, mcp.tool(OPERATIONS[name]).output_schema)


@pytest.mark.parametrize(
    ("name", "params", "error"),
    [
        ("query", {"via": ["AUTHORED"]}, "--via needs --entity"),
        ("adapters", {"kind": "generation", "wait": True}, "--wait is for --serve-active"),
        ("migrate", {}, "give exactly one of --to-model"),
        ("migrate", {"rollback": True, "cleanup": True}, "give exactly one of --to-model"),
        ("outbox retry", {}, "name the rows or pass --all"),
        ("outbox drop", {"rows": [1], "all": True}, "name the rows or pass --all"),
    ],
)
def test_declared_rules_between_parameters(name: str, params: dict[str, object], error: str) -> None:
    with pytest.raises(InputError, match=error):
        OPERATIONS[name].validate(params)


def test_rules_let_a_valid_call_through_and_flags_replace_name_checks() -> None:
    assert OPERATIONS["migrate"].validate({"to_model": "hash"})["to_model"] == "hash"
    assert OPERATIONS["outbox retry"].validate({"all": True})["all"] is True
    assert OPERATIONS["query"].validate({"via": ["A"], "entity": "User:A"})["via"] == ["A"]
    annotations = {op.tool: mcp.tool(op).annotations for op in mcp.TOOLS.values()}
    assert {t for t, a in annotations.items() if a is not None and a.destructive_hint} == {"forget"}
    assert [op.name for op in OPERATIONS.values() if op.service_status] == ["health"]


class _Settings:
    default_agent = "support"


class _Client:
    settings = _Settings()


@pytest.mark.parametrize("given", ["", " ", "a b"])
def test_an_empty_or_invalid_agent_is_refused_not_taken_for_the_default(given: str) -> None:
    """``--agent "$AGENT"`` with the variable unset must not read or write the default agent's
    memories (the hostile harness, seed 142861580: a query for '' answered memories of 'support')."""
    from memoryctl.operations.memories import agent_of, agent_scope, only_agent

    with pytest.raises(InputError, match="invalid agent id"):
        agent_of(_Client(), {"agent": given})  # type: ignore[arg-type]
    with pytest.raises(InputError, match="invalid agent id"):
        only_agent({"agent": given})
    assert agent_of(_Client(), {"agent": None}) == "support"  # type: ignore[arg-type]
    assert agent_scope(_Client(), {"all_agents": True, "agent": None}) is None  # type: ignore[arg-type]
    assert only_agent({"agent": None}) is None
