"""The generated Python client (clients/python) against a real ``memoryctl serve``: sync and async
round trips with an agent token, the typed errors of a refused cross-agent read, a degraded
answer's exit code, and the README's example run as written."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from memoryctl_client import (
    AsyncClient,
    BadRequestError,
    Client,
    ConflictError,
    ForbiddenError,
    MemoryctlError,
    NotFoundError,
    QueryReply,
    Reply,
    UnauthorizedError,
)

from tests.clients.conftest import AGENT, OTHER, PYTHON_CLIENT, Stack

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # two services, each starting its embedded PostgreSQL
README = PYTHON_CLIENT.parent / "README.md"


def _ids(reply: Reply[QueryReply]) -> list[str]:
    return [hit["id"] for hit in reply.data["hits"]]


def test_add_query_forget_with_an_agent_token(stack: Stack) -> None:
    with Client(stack.healthy.url, stack.agent_token) as memory:
        added = memory.add("python sync: the canary stage finished on Tuesday", entities=["User:Alice"])
        assert (added.exit_code, added.partial, added.warnings) == (0, False, [])
        found = memory.query(text="canary stage", limit=5)
        assert found.data["hits"][0]["id"] == added.data["id"] and found.data["degraded"] == []
        assert found.data["hits"][0]["agent_id"] == AGENT  # the token's agent, not named by the call
        assert memory.get(added.data["id"]).data["text"].startswith("python sync")
        assert memory.forget([added.data["id"]]).data["forgotten"] == [added.data["id"]]
        assert added.data["id"] not in _ids(memory.query(text="canary stage"))
        # an upload: the lines as the body, the parameters in the query string
        imported = memory.import_('{"text": "python import: the on-call rota moved to Mondays"}\n', file="rota.jsonl")
        assert (imported.data["inserted"], imported.data["file"], imported.data["invalid"]) == (1, "rota.jsonl", [])
        assert "on-call rota" in memory.query(text="on-call rota").data["hits"][0]["text"]
    with Client(stack.healthy.url, stack.healthy.token) as operator:
        assert operator.status().data["requests"] > 0  # GET /v1/status, the service itself
        served = operator.openapi().data  # what this client was generated from (clients/openapi.json)
        assert served == json.loads((PYTHON_CLIENT.parents[1] / "openapi.json").read_text())


def test_the_async_client_does_the_same(stack: Stack) -> None:
    async def main() -> None:
        async with AsyncClient(stack.healthy.url, stack.agent_token) as memory:
            added = await memory.add("python async: the rollback of 4.2 finished", kind="event")
            found = await memory.query(text="rollback finished", retrieval="lexical")
            assert added.data["id"] in _ids(found)
            forgotten = await memory.forget([added.data["id"]])
            assert forgotten.data["forgotten"] == [added.data["id"]]
            assert added.data["id"] not in _ids(await memory.query(text="rollback finished"))
            with pytest.raises(NotFoundError):
                await memory.get(stack.other_id)

    asyncio.run(main())


def test_a_cross_agent_read_is_the_typed_error_http_gives(stack: Stack) -> None:
    with Client(stack.healthy.url, stack.agent_token) as memory:
        with pytest.raises(NotFoundError) as missing:  # another agent's memory: not found, as over HTTP
            memory.get(stack.other_id)
        assert (missing.value.status, missing.value.exit_code) == (404, 1) and missing.value.error
        with pytest.raises(ForbiddenError) as refused:  # naming another agent: refused
            memory.query(text="plan", agent=OTHER)
        assert refused.value.status == 403 and f"bound to agent '{AGENT}'" in refused.value.error
        with pytest.raises(BadRequestError) as bad:  # the service's one validation, its message and hint
            memory.query(text="plan", limit=0)
        assert bad.value.error == "limit must be from 1 to 1000, not 0" and bad.value.exit_code == 2
        assert isinstance(bad.value, MemoryctlError) and bad.value.hint
        with pytest.raises(ConflictError) as taken:  # an id that names another agent's memory
            memory.add("agent-a writing over agent-b's memory", id=stack.other_id)
        assert taken.value.status == 409
    with Client(stack.healthy.url, stack.healthy.token) as operator:  # the operator's token opens it
        assert operator.get(stack.other_id).data["agent_id"] == OTHER
    with Client(stack.healthy.url, "not-a-token") as stranger, pytest.raises(UnauthorizedError):
        stranger.stats()


def test_a_degraded_answer_is_partial_with_exit_code_3(stack: Stack) -> None:
    with Client(stack.degraded.url, stack.degraded.token) as memory:
        added = memory.add("python: written while the vector store is away")
        assert added.exit_code == 3 and added.partial and added.data["pending"]["qdrant"] == 1
        assert any("pending" in line for line in added.warnings), added.warnings
        found = memory.query(text="vector store away")
        assert found.partial and found.data["degraded"] == ["qdrant"]
        assert added.data["id"] in _ids(found)  # the lexical leg still answers
        assert memory.forget([added.data["id"]]).data["forgotten"] == [added.data["id"]]


def readme_block(readme: Path, language: str) -> str:
    """The README's example: its one fenced block in ``language``."""
    blocks = re.findall(rf"^```{language}\n(.*?)^```", readme.read_text(), flags=re.S | re.M)
    assert len(blocks) == 1, f"{readme}: {len(blocks)} ```{language} blocks, the example is the one"
    return str(blocks[0])


def test_the_readme_example_runs_as_written(stack: Stack, tmp_path: Path) -> None:
    example = tmp_path / "example.py"
    example.write_text(readme_block(README, "python"))
    env = {**os.environ, **stack.environment(), "MEMORYCTL_TOKEN": stack.agent_token, "PYTHONPATH": str(PYTHON_CLIENT)}
    done = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    print(done.stdout)  # the example as run (the closing note)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("added ") and "rollback of 4.2" in lines[1] and lines[-1] == "still found: False"
