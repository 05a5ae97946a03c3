"""The CLI as operators use it, against the real stores: the README's examples, exit codes, and
bad input that must give a clear error and never a traceback."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from memoryctl.cli.main import _invoke
from tests.conftest import write_cluster_config

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def config(pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = write_cluster_config(
        tmp_path / "memoryctl.toml",
        pg_dsn,
        neo4j_clean,
        tmp_path / "qdrant",
        data_dir=tmp_path / "data",
        default_agent="support",
        query={"store_timeout_s": 10},
    )
    monkeypatch.setenv("MEMORYCTL_CONFIG", str(path))
    monkeypatch.chdir(tmp_path)
    return path


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = _invoke(list(args))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, captured.out, captured.err


def readme_examples() -> list[list[str]]:
    """The commands in the README's "Using it" block, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Using it", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands, current = [], ""
    for line in block.splitlines():
        line = line.split("  #")[0].rstrip()
        if not line:
            continue
        current += " " + line.rstrip("\\").strip()
        if not line.endswith("\\"):
            commands.append(shlex.split(current))
            current = ""
    return commands


def test_readme_examples_run(config: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "memories.jsonl").write_text(
        json.dumps({"text": "Bob: the deploy pipeline needs a canary", "entities": [{"type": "User", "name": "Bob"}]})
        + "\n"
    )
    examples = readme_examples()
    assert len(examples) >= 6
    for argv in examples:
        assert argv[0] == "memoryctl"
        code, out, err = cli(capsys, *argv[1:])
        assert code == 0, (argv, out, err)
        if argv[1] == "query":
            assert "Alice: the rollback finished" in out
            assert "graph.traverse" in out  # --explain
        if argv[1] == "config":
            assert "[postgres]" in out
        if argv[1] == "stats":  # the numbers and their trend: a bar per bucket, a sparkline
            assert "0.600" in out and "█" in out and "avg trend:" in out


def test_add_get_forget_json_contract(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "add", "Alice: ship it", "--entity", "User:Alice", "--meta", "score=3", "--json")
    assert code == 0
    mid = json.loads(out)["id"]
    code, out, _ = cli(capsys, "get", mid, "--json")
    got = json.loads(out)
    assert code == 0 and got["text"] == "Alice: ship it" and got["metadata"] == {"score": 3}
    code, out, _ = cli(capsys, "query", "ship", "--json")
    doc = json.loads(out)
    assert code == 0 and set(doc) >= {"hits", "degraded", "explain"}
    hit = doc["hits"][0]
    assert set(hit) >= {"id", "score", "scores", "text", "created_at", "kind", "agent_id", "entities", "sources"}
    assert hit["id"] == mid and hit["entities"] == [{"type": "User", "name": "Alice"}]
    assert cli(capsys, "forget", mid)[0] == 0
    code, out, _ = cli(capsys, "query", "ship", "--json")
    assert json.loads(out)["hits"] == []


def test_stats_per_bucket_on_the_timescale_path(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`stats` as operators run it; the cluster profile's database is on the Timescale path, so
    daily buckets come from the continuous aggregate plus the partial hours at the edges."""
    for at, meta in [
        ("2026-01-05T10:20:00Z", "sentiment=0.5"),
        ("2026-01-05T23:59:59Z", "sentiment=-0.25"),
        ("2026-01-05T12:00:00Z", "sentiment=high"),  # not a number: counted, not averaged
        ("2026-01-06T00:00:00Z", "sentiment=1"),
        ("2026-01-07T00:30:00Z", "sentiment=9"),  # after --until
    ]:
        assert cli(capsys, "add", f"note {meta}", "--at", at, "--meta", meta)[0] == 0
    code, out, _ = cli(capsys, "health", "--json", "--deadline", "15")
    assert json.loads(out)["components"]["postgres"]["schema_path"] == "timescale", out
    code, out, err = cli(
        capsys, "stats", "--bucket", "1d", "--since", "2026-01-05T00:10:00Z", "--until", "2026-01-07T00:00:00Z",
        "--metric", "sentiment", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["buckets"] == [
        {"bucket": "2026-01-05T00:00:00+00:00", "count": 3, "n": 2, "avg": 0.125, "min": -0.25, "max": 0.5},
        {"bucket": "2026-01-06T00:00:00+00:00", "count": 1, "n": 1, "avg": 1.0, "min": 1.0, "max": 1.0},
    ]


def test_the_default_query_is_the_no_decay_query(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No half-life unless one is configured: ``query TEXT`` prints, hit for hit and byte for
    byte, what ``--half-life off`` prints; ``--half-life 30d`` turns the preference on."""
    for n, at in enumerate(["2026-01-05T10:00:00Z", "2026-04-05T10:00:00Z", "2026-11-05T10:00:00Z"]):
        assert cli(capsys, "add", f"rollback of the payments service, take {n}", "--at", at)[0] == 0
    assert cli(capsys, "add", "rollback of the payments service, take 0", "--at", "2026-02-05T10:00:00Z")[0] == 0

    def hits(*flags: str) -> str:
        code, out, _ = cli(capsys, "query", "payments rollback", "--json", *flags)
        assert code == 0
        return json.dumps(json.loads(out)["hits"])

    default = hits()
    assert default == hits("--half-life", "off") and '"recency"' not in default
    assert '"recency"' in hits("--half-life", "30d")
    # The two equal texts tie exactly: the newer first, in both.
    ties = [h["created_at"][:7] for h in json.loads(default) if h["text"].endswith("take 0")]
    assert ties == ["2026-02", "2026-01"]


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["add", ""], 2, "empty"),
        (["add", "x", "--entity", "NoColon"], 2, "TYPE:NAME"),
        (["add", "x", "--entity", "Us`er:x"], 2, "entity type"),
        (["add", "x", "--rel", "User:A -1DROP-> this"], 2, "relation"),
        (["add", "x", "--rel", "nonsense"], 2, "FROM -REL-> TO"),
        (["add", "x", "--meta", "novalue"], 2, "key=value"),
        (["add", "x", "--meta", "bad key=1"], 2, "metadata key"),
        (["add", "x", "--at", "yesterday"], 2, "ISO 8601"),
        (["add", "x", "--agent", "../etc"], 2, "agent id"),
        (["query"], 2, "empty query"),
        (["query", "x", "--where", "a; DROP TABLE memories = 1"], 2, "field OP value"),
        (["query", "x", "--where", "kind > note"], 2, "supports only"),
        (["query", "x", "--via", "AUTHORED"], 2, "--entity"),
        (["query", "x", "--since", "last tuesday"], 2, "ISO 8601"),
        (["query", "x", "--hops", "9"], 2, "hops must be from 1 to 3"),
        (["query", "x", "--combine", "xor"], 2, "combine must be one of and, or"),
        (["get", "not-a-uuid"], 2, "UUID"),
        (["get", str(uuid.UUID(int=1))], 1, "no memory"),
        (["forget", str(uuid.UUID(int=1))], 1, "no memory"),
        (["import", "missing.jsonl"], 2, "not a readable file"),
        (["stats", "--bucket", "1s"], 2, "at least"),
        (["cypher", "CREATE (n:X) RETURN n"], 2, "agent_id"),
        (["cypher", "MATCH (m:Memory {agent_id: $agent_id}) DETACH DELETE m"], 2, "read"),
        (["nonsense-command"], 2, "No such command 'nonsense-command'"),
    ],
)
def test_bad_input_is_a_clear_error(
    config: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, needle: str
) -> None:
    got, out, err = cli(capsys, *argv)
    assert got == code, (out, err)
    assert needle and needle.lower() in (out + err).lower()


def test_bad_config_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("profile = 'cluster'\n[postgres\n")
    assert cli(capsys, "--config", str(bad), "health")[0] == 2
    bad.write_text("profile = 'mainframe'\n")
    code, _, err = cli(capsys, "--config", str(bad), "health")
    assert code == 2 and "profile" in err
    bad.write_text("[query]\nhalf_life = 'a month'\n")
    code, _, err = cli(capsys, "--config", str(bad), "health")
    assert code == 2 and "half_life" in err
    assert cli(capsys, "--config", str(tmp_path / "nope.toml"), "health")[0] == 2


def test_secrets_are_masked(config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORYCTL_NEO4J__PASSWORD", "hunter2-secret")
    monkeypatch.setenv("MEMORYCTL_QDRANT__API_KEY", "qdrant-secret")
    code, out, _ = cli(capsys, "config", "show", "--json")
    assert code == 0 and "hunter2" not in out and "qdrant-secret" not in out
    assert json.loads(out)["neo4j"]["password"] == "***"


def test_neo4j_down_add_exits_3_and_sync_delivers(
    config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORYCTL_NEO4J__URI", "bolt://127.0.0.1:9")
    code, out, err = cli(capsys, "add", "written while neo4j is down", "--entity", "User:Alice")
    assert code == 3 and "pending" in err and "memoryctl sync" in err
    code, out, err = cli(capsys, "query", "written", "--entity", "User:Alice")
    assert code == 3 and "degraded: neo4j" in err
    assert "written while neo4j is down" in out  # answered from the fallback
    monkeypatch.delenv("MEMORYCTL_NEO4J__URI")
    code, out, _ = cli(capsys, "sync", "--json")
    assert code == 0 and json.loads(out)["pending"] == {"qdrant": 0, "neo4j": 0}


def test_a_failed_sync_is_recorded_as_failed(config: Path, capsys: pytest.CaptureFixture[str], pg_dsn: str) -> None:
    """A run that dies is recorded as failed, never left "running" (``recorded_run``)."""
    code, _, _ = cli(capsys, "sync")
    assert code == 0
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE outbox RENAME TO outbox_gone")  # PostgreSQL now fails the sync for real
    code, _, err = cli(capsys, "sync")
    assert code == 1 and "outbox" in err
    code, out, _ = cli(capsys, "runs", "--json", "--command", "sync")
    runs = json.loads(out)
    assert [r["status"] for r in runs] == ["failed", "ok"] and "outbox" in runs[0]["error"]


def test_console_script_has_no_traceback(config: Path) -> None:
    """The installed entry point, as cron and ssh run it."""
    proc = subprocess.run(
        [sys.executable, "-c", "from memoryctl.cli.main import run; run()", "get", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and re.search(r"error: .*UUID", proc.stderr)


@pytest.fixture(autouse=True)
def _no_color(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("NO_COLOR", "1")
    yield
