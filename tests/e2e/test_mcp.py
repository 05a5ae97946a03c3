"""MCP with the official SDK's own client, over both transports, and agent tokens over HTTP and MCP.

- streamable HTTP at ``/mcp`` of a running service: list the tools, add, query back, forget, a
  bad argument (a tool error that says what is wrong), a wrong token (refused), a store down (a
  degraded answer, not an error);
- stdio, ``memoryctl mcp`` as the subprocess an agent framework starts: through the running
  service, and in its own process when none runs;
- agent tokens: bound to one agent over HTTP and MCP; the operator's token opens every agent.
"""

from __future__ import annotations

import json
import os
import re
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from memoryctl.cli.main import _invoke
from memoryctl.serve.server import Service
from tests.conftest import cluster_settings
from tests.e2e.conftest import embedded_config

pytestmark = pytest.mark.integration
TOOLS = {"add", "query", "get", "forget", "stats", "health"}


@asynccontextmanager
async def over_http(service: Service, token: str | None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        async with Client(streamable_http_client(f"http://{service.address_http}/mcp", http_client=http)) as client:
            yield client


def stdio(config: Path, *args: str) -> StdioServerParameters:
    env = {**os.environ, "MEMORYCTL_CONFIG": str(config)}
    return StdioServerParameters(command=sys.executable, args=["-m", "memoryctl", "mcp", *args], env=env)


def _messages(exc: BaseException) -> list[str]:
    """The messages of an exception and of everything it groups or was caused by."""
    found = [f"{type(exc).__name__}: {exc}"]
    for inner in [*getattr(exc, "exceptions", ()), exc.__cause__, exc.__context__]:
        if inner is not None and inner is not exc:
            found += _messages(inner)
    return found


async def call(client: Client, tool: str, **arguments: Any) -> tuple[bool, Any]:
    """(is the result an error, its structured content -- or its text for an error)."""
    result = await client.call_tool(tool, arguments)
    if result.is_error:
        return True, result.content[0].text  # type: ignore[union-attr]
    return False, result.structured_content


async def add_query_forget(client: Client, text: str, agent: str | None = None) -> dict[str, Any]:
    """The round trip every transport must do; the query's answer for the caller to inspect."""
    listed = await client.list_tools()
    assert TOOLS <= {t.name for t in listed.tools}
    schema = next(t for t in listed.tools if t.name == "query").input_schema
    assert schema["properties"]["limit"]["maximum"] == 1000  # generated from the declaration
    where = {"agent": agent} if agent else {}
    error, added = await call(client, "add", text=text, entities=["User:Alice"], **where)
    assert not error and added["exit_code"] == 0, added
    error, answer = await call(client, "query", text=text, **where)
    assert not error and answer["degraded"] == []
    hit = answer["hits"][0]
    assert hit["id"] == added["id"] and isinstance(hit["score"], float)
    error, got = await call(client, "get", id=added["id"])
    assert not error and got["text"] == text
    error, bad = await call(client, "query", text=text, limit="ten")
    assert error and bad.startswith("error: limit must be an integer"), bad
    error, bad = await call(client, "query", text=text, limt=5)
    assert error and "unknown parameter" in bad and "hint:" in bad
    error, forgotten = await call(client, "forget", ids=[added["id"]])
    assert not error and forgotten["forgotten"] == [added["id"]]
    error, again = await call(client, "query", text=text, **where)
    assert not error and added["id"] not in [h["id"] for h in again["hits"]]
    return dict(answer)


def test_mcp_over_streamable_http(served: Service) -> None:
    async def main() -> None:
        async with over_http(served, served.token) as client:
            answer = await add_query_forget(client, "over streamable http", agent="support")
            assert answer["hits"][0]["agent_id"] == "support"
            error, health = await call(client, "health")
            assert not error and "serve" in health["components"]
        with pytest.raises(BaseException) as refused:
            async with over_http(served, "wrong") as client:
                await client.list_tools()
        assert "MCPError" in " ".join(_messages(refused.value)), _messages(refused.value)
        # what the SDK's client reported as an error response: the token check's 401
        hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        reply = httpx2.post(
            f"http://{served.address_http}/mcp", json=hello, headers={"Authorization": "Bearer wrong"}, timeout=30
        )
        assert reply.status_code == 401 and "token" in reply.json()["error"]

    anyio.run(main)


@pytest.mark.slow  # two `memoryctl mcp` processes (the SDK's import), one starting the embedded PostgreSQL
def test_mcp_over_stdio_through_the_service_and_in_process(served: Service, tmp_path: Path) -> None:
    config = served.settings.source_file
    assert config is not None
    requests = served.status()["requests"]

    async def through(params: StdioServerParameters, text: str) -> dict[str, Any]:
        async with Client(params) as client:
            return await add_query_forget(client, text)

    answer = anyio.run(through, stdio(config, "--agent", "stdio-agent"), "over stdio via the service")
    assert answer["hits"][0]["agent_id"] == "stdio-agent"
    assert served.status()["requests"] > requests  # the tools called the service
    alone = embedded_config(tmp_path)  # no service runs for this data directory
    answer = anyio.run(through, stdio(alone), "over stdio in process")
    assert answer["hits"][0]["agent_id"] == "support"  # the configured default agent
    assert not (tmp_path / "d" / "serve.sock").exists()


@pytest.fixture
def vectors_down(pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path) -> Iterator[Service]:
    """The cluster profile with its Qdrant unreachable (nothing listens on the port)."""
    settings = cluster_settings(pg_dsn, neo4j_clean, tmp_path / "qdrant")
    down = settings.model_copy(update={"qdrant": settings.qdrant.model_copy(update={"url": "http://127.0.0.1:9"})})
    svc = Service(down, http="127.0.0.1:0")
    svc.start()
    yield svc
    svc.shutdown(grace_s=10)


def test_mcp_with_a_store_down_answers_degraded(vectors_down: Service) -> None:
    async def main() -> None:
        async with over_http(vectors_down, vectors_down.token) as client:
            error, added = await call(client, "add", text="Alice: the rollback finished", agent="ops")
            assert not error and added["exit_code"] == 3 and added["pending"]["qdrant"] == 1
            assert any("pending" in w for w in added["warnings"])
            error, answer = await call(client, "query", text="rollback", agent="ops")
            assert not error and "qdrant" in answer["degraded"] and answer["exit_code"] == 3
            assert answer["hits"][0]["id"] == added["id"]  # the lexical leg still answers

    anyio.run(main)


# ---- agent tokens ------------------------------------------------------------------------------
def _issue(config: Path, agent: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert _invoke(["--config", str(config), "token", "issue", agent, "--json"]) == 0
    issued: dict[str, Any] = json.loads(capsys.readouterr().out)
    return issued


def _post(service: Service, token: str, operation: str, **params: Any) -> tuple[int, Any]:
    reply = httpx2.post(
        f"http://{service.address_http}/v1/{operation}",
        json=params,
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    return reply.status_code, reply.json()


def test_an_agent_token_opens_one_agent_over_http_and_mcp(served: Service, capsys: pytest.CaptureFixture[str]) -> None:
    config = served.settings.source_file
    assert config is not None
    a, b = _issue(config, "agent-a", capsys), _issue(config, "agent-b", capsys)
    stored = (served.settings.data_dir / "agent-tokens.json").read_text()
    assert a["token"] not in stored and b["token"] not in stored  # kept hashed
    assert (served.settings.data_dir / "agent-tokens.json").stat().st_mode & 0o777 == 0o600
    # A writes and reads its own agent without naming it
    status, added = _post(served, a["token"], "add", text="A's secret plan")
    assert status == 200
    status, answer = _post(served, a["token"], "query", text="secret plan")
    assert status == 200 and [h["agent_id"] for h in answer["hits"]] == ["agent-a"]
    # B cannot read or write A: not by naming it, not by every agent, not by A's ids
    assert _post(served, b["token"], "query", text="secret plan", agent="agent-a")[0] == 403
    assert _post(served, b["token"], "query", text="secret plan", all_agents=True)[0] == 403
    assert _post(served, b["token"], "add", text="planted", agent="agent-a")[0] == 403
    status, answer = _post(served, b["token"], "query", text="secret plan")
    assert status == 200 and answer["hits"] == []
    assert _post(served, b["token"], "get", id=added["id"])[0] == 404
    # forgetting A's id is refused as for an id nobody has (all or nothing; nothing told about A)
    status, refused = _post(served, b["token"], "forget", ids=[added["id"]])
    nobody = str(uuid.uuid4())
    status_nobody, refused_nobody = _post(served, b["token"], "forget", ids=[nobody])
    assert (status, status_nobody) == (404, 404)
    assert refused["error"].replace(added["id"], "ID") == refused_nobody["error"].replace(nobody, "ID")
    # an import with B's token lands in B, whatever agent its lines name (and A's id is a conflict)
    lines = [
        {"text": "imported by B", "agent_id": "agent-a"},
        {"id": added["id"], "text": "taken", "agent_id": "agent-a"},
    ]
    reply = httpx2.post(
        f"http://{served.address_http}/v1/import",
        content="".join(json.dumps(line) + "\n" for line in lines).encode(),
        headers={"Authorization": f"Bearer {b['token']}", "Content-Type": "application/x-ndjson"},
        timeout=60,
    )
    assert reply.status_code == 200 and reply.json()["inserted"] == 1, reply.text
    assert [bad["line"] for bad in reply.json()["invalid"]] == [2]  # A's id: a conflict, not a move
    assert reply.headers["Memoryctl-Exit-Code"] == "2"
    assert _post(served, b["token"], "query", text="imported by B")[1]["hits"][0]["agent_id"] == "agent-b"
    assert _post(served, b["token"], "reconcile")[0] == 403  # the operator's
    assert _post(served, b["token"], "token/list")[0] == 403
    # the operator's token opens every agent
    status, answer = _post(served, str(served.token), "query", text="secret plan", all_agents=True)
    assert status == 200 and added["id"] in [h["id"] for h in answer["hits"]]

    async def over_mcp() -> None:
        async with over_http(served, b["token"]) as client:
            error, text = await call(client, "query", text="secret plan", agent="agent-a")
            assert error and "bound to agent 'agent-b'" in text
            error, answer = await call(client, "get", id=added["id"])
            assert error and "no memory" in answer
            error, text = await call(client, "add", text="planted over mcp", agent="agent-a")
            assert error and "bound to agent 'agent-b'" in text
            error, text = await call(client, "forget", ids=[added["id"]])
            assert error and "no memory" in text
            error, _ = await call(client, "add", text="B's own note")
            assert not error
            error, answer = await call(client, "query", text="own note")
            assert not error and answer["hits"] and {h["agent_id"] for h in answer["hits"]} == {"agent-b"}

    anyio.run(over_mcp)
    status, kept = _post(served, str(served.token), "get", id=added["id"])
    assert status == 200 and (kept["agent_id"], kept["text"]) == ("agent-a", "A's secret plan")
    # revoked: refused from the next request on
    assert _invoke(["--config", str(config), "token", "revoke", b["id"]]) == 0
    assert _post(served, b["token"], "query", text="x")[0] == 401
    assert _post(served, a["token"], "query", text="x")[0] == 200


def test_docs_mcp_example_runs_against_a_live_service(served: Service, capsys: pytest.CaptureFixture[str]) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "mcp.md").read_text()
    [block] = re.findall(r"```python\n(.*?)```", doc, re.S)
    namespace: dict[str, Any] = {"URL": f"http://{served.address_http}", "TOKEN": served.token}
    exec(compile(block, "docs/mcp.md", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert TOOLS <= set(eval(printed[0]))
    assert "True Alice prefers the blue theme" in printed[1]
    assert printed[-1] == "degraded: []"


def test_an_issued_tokens_name_is_recorded_alike_over_http_and_mcp(
    served: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    """A forget with an issued token is a run in the runs log with the token's name, the same name
    over HTTP and over MCP (the console records its own the same way); one with the operator's
    serve.token is recorded as the operator's."""
    config = served.settings.source_file
    assert config is not None
    assert _invoke(["--config", str(config), "token", "issue", "agent-rec", "--name", "ci-bot", "--json"]) == 0
    bot = json.loads(capsys.readouterr().out)
    runs = served.client.stack.runs

    def forget_run(mid: str) -> dict[str, Any]:
        found = [r for r in runs.recent(command="forget", limit=50) if mid in r["details"]["params"]["ids"]]
        assert len(found) == 1, found
        return found[0]

    status, added = _post(served, bot["token"], "add", text="forgotten over HTTP")
    assert status == 200
    assert _post(served, bot["token"], "forget", ids=[added["id"]])[0] == 200
    by_http = forget_run(added["id"])
    assert (by_http["actor"], by_http["trigger"], by_http["status"]) == ("agent:agent-rec (ci-bot)", "api", "ok")

    async def forget_over_mcp(token: str) -> str:
        async with over_http(served, token) as client:
            error, mcp_added = await call(client, "add", text="forgotten over MCP", agent="agent-rec")
            assert not error, mcp_added
            error, forgotten = await call(client, "forget", ids=[mcp_added["id"]])
            assert not error and forgotten["forgotten"] == [mcp_added["id"]]
            return str(mcp_added["id"])

    mid = anyio.run(forget_over_mcp, bot["token"])
    assert forget_run(mid)["actor"] == by_http["actor"]
    mid = anyio.run(forget_over_mcp, str(served.token))
    assert forget_run(mid)["actor"] == "operator"
    # a refused forget (another agent's id) is recorded failed, with the same name
    status, other = _post(served, str(served.token), "add", text="not the bot's", agent="someone-else")
    assert status == 200 and _post(served, bot["token"], "forget", ids=[other["id"]])[0] == 404
    refused = forget_run(other["id"])
    assert (refused["actor"], refused["status"]) == (by_http["actor"], "failed")
