"""Two real ``memoryctl serve`` processes (embedded profile, temporary data directories, loopback
ports) for the generated clients, shared by the Python and the TypeScript tests:

- ``healthy``: an agent token for ``agent-a`` issued by ``memoryctl token issue``, and a memory of
  ``agent-b`` written with the operator's token (what agent-a must not read);
- ``degraded``: a file where the vector store's directory goes, so the vector store cannot open:
  a write is stored in PostgreSQL with its vector delivery pending and a query is answered by the
  lexical leg alone, both exit code 3 -- a degraded answer on the embedded profile, without
  stopping a server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.serving import Served, embedded_home, running_service

ROOT = Path(__file__).resolve().parents[2]
PYTHON_CLIENT = ROOT / "clients" / "python" / "src"
AGENT, OTHER = "agent-a", "agent-b"
# memoryctl_client is its own distribution (clients/python), imported from its folder, not installed.
if str(PYTHON_CLIENT) not in sys.path:
    sys.path.insert(0, str(PYTHON_CLIENT))


@dataclass(frozen=True, slots=True)
class Stack:
    healthy: Served
    agent_token: str
    other_id: str
    degraded: Served

    def environment(self) -> dict[str, str]:
        """What the TypeScript tests and the README examples read."""
        return {
            "MEMORYCTL_URL": self.healthy.url,
            "MEMORYCTL_TOKEN": self.healthy.token,
            "MEMORYCTL_AGENT": AGENT,
            "MEMORYCTL_AGENT_TOKEN": self.agent_token,
            "MEMORYCTL_OTHER_AGENT": OTHER,
            "MEMORYCTL_OTHER_ID": self.other_id,
            "MEMORYCTL_DEGRADED_URL": self.degraded.url,
            "MEMORYCTL_DEGRADED_TOKEN": self.degraded.token,
        }


def _issue(config: Path, agent: str) -> str:
    """An agent token, as an operator issues it (through the running service)."""
    done = subprocess.run(
        [sys.executable, "-m", "memoryctl", "--config", str(config), "token", "issue", agent, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "MEMORYCTL_CONFIG": str(config)},
    )
    assert done.returncode == 0, done.stderr
    token: str = json.loads(done.stdout)["token"]
    return token


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    with embedded_home("memoryctl-clients-") as config, embedded_home("memoryctl-clients-degraded-") as broken:
        data, broken_data = config.parent / "d", broken.parent / "d"
        broken_data.mkdir(mode=0o755)
        (broken_data / "vectors").write_text("a file where the vector store's directory goes\n")
        with running_service(config, data) as healthy, running_service(broken, broken_data) as degraded:
            status, _, other = healthy.request("/v1/add", {"text": "agent-b's plan for Friday", "agent": OTHER})
            assert status == 200, other
            yield Stack(healthy, _issue(config, AGENT), other["id"], degraded)
