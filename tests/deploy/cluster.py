"""Helpers for the deploy tests: run pyinfra against the local nodes, read its summary, reach nodes,
run memoryctl on the db node as cron would, and ask a node's Qdrant peer over the mesh."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import testinfra

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "scripts" / "cluster"
SSH_KEY = REPO / ".cache" / "cluster" / "id_ed25519"
NODES = {"node1": "10.78.0.1", "node2": "10.78.0.2", "node3": "10.78.0.3"}
MESH = {"node1": "10.77.0.1", "node2": "10.77.0.2", "node3": "10.77.0.3"}
SSH_OPTIONS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"

# pyinfra's closing table: "Grand total   <ops> <success> <error> <no change>", '-' meaning 0.
_GRAND_TOTAL = re.compile(r"^\s*Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class DeployRun:
    seconds: float
    returncode: int
    output: str
    operations: int
    changed: int
    errors: int
    unchanged: int

    def figures(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 1),
            "operations": self.operations,
            "changed": self.changed,
            "unchanged": self.unchanged,
            "load_average": os.getloadavg(),
        }

    def changed_operations(self) -> list[str]:
        """Rows of the results table with a non-zero Success column (what this run changed)."""
        rows = []
        for line in self.output.splitlines():
            cells = re.split(r"\s{2,}", line.strip())
            if len(cells) == 5 and cells[0] not in ("Operation", "Grand total") and cells[2] not in ("-", "0"):
                rows.append(cells[0])
        return rows


def _count(cell: str) -> int:
    return 0 if cell == "-" else int(cell)


# Overlays every deploy of the session merges first: the single-server stage (tests/deploy/conftest.py)
# until test_ha.py converts the stack to the inventory's Patroni cluster.
BASE_OVERLAYS: list[Path] = []


class _OperationClock:
    """When each operation of a streamed pyinfra log started, read as the run goes (every poll of
    :func:`run_deploy`, 0.2 s): where a deploy's minutes go, written beside its log as
    ``<log>.ops.tsv`` (seconds, operation; slowest first). An operation's time runs until the next
    one starts, so it includes the facts gathered for it."""

    MARK = "--> Starting operation: "

    def __init__(self, log: Path) -> None:
        self.log, self.offset, self.partial = log, 0, ""
        self.started: list[tuple[float, str]] = []

    def poll(self) -> list[str]:
        """Operations started so far."""
        if self.log.exists():
            with self.log.open() as stream:
                stream.seek(self.offset)
                chunk = stream.read()
                self.offset = stream.tell()
            now = time.monotonic()
            lines = (self.partial + chunk).split("\n")
            self.partial = lines.pop()
            self.started += [(now, line.split(self.MARK, 1)[1].strip()) for line in lines if self.MARK in line]
        return [name for _, name in self.started]

    def write(self, path: Path, ended: float) -> None:
        ends = [at for at, _ in self.started[1:]] + [ended]
        rows = sorted(((end - at, name) for (at, name), end in zip(self.started, ends, strict=True)), reverse=True)
        path.write_text("".join(f"{seconds:.1f}\t{name}\n" for seconds, name in rows))


def run_deploy(log: Path, *, overlay: Path | None = None, kill_at: str | None = None) -> DeployRun:
    """``pyinfra -y inventory/local.py deploy.py`` from the repository root, timed; output to ``log``.

    ``overlay``: an inventory overlay for this run (``$MEMORYCTL_INVENTORY_OVERLAY``). ``kill_at``:
    SIGKILL pyinfra as soon as its output names this operation starting (a run killed half-way).
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    overlays = [*BASE_OVERLAYS, *([overlay] if overlay is not None else [])]
    if overlays:
        env["MEMORYCTL_INVENTORY_OVERLAY"] = os.pathsep.join(str(path) for path in overlays)
    else:
        env.pop("MEMORYCTL_INVENTORY_OVERLAY", None)
    started = time.monotonic()
    timing = _OperationClock(log)
    with log.open("w") as out:  # streamed, so that a run in progress can be watched
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyinfra", "-y", "inventory/local.py", "deploy.py"],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,  # its own process group: killed with whatever it started
        )
        try:
            # timing.poll() on every turn (not only when there is a kill_at to look for): the
            # operations' times are when this loop saw them start.
            while proc.poll() is None:
                started_ops = timing.poll()
                if kill_at is not None and any(name.startswith(kill_at) for name in started_ops):
                    break
                time.sleep(0.2)
        finally:  # killed at kill_at, and whenever the test ends first (its timeout, Ctrl-C, an error)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            returncode = proc.wait()
    seconds = time.monotonic() - started
    timing.poll()
    timing.write(log.with_suffix(".ops.tsv"), time.monotonic())
    output = log.read_text()
    match = _GRAND_TOTAL.search(output)
    counts = [_count(c) for c in match.groups()] if match else [0, 0, 0, 0]
    return DeployRun(seconds, returncode, output, *counts)


def node(name: str) -> testinfra.host.Host:
    return testinfra.get_host(f"ssh://root@{NODES[name]}", ssh_identity_file=str(SSH_KEY), ssh_extra_args=SSH_OPTIONS)


def cluster(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLUSTER), command], cwd=REPO, capture_output=True, text=True, check=False)


CLUSTER_LOGS = REPO / ".cache" / "cluster-logs"
# What a node's log holds: its whole journal, then the units that failed.
JOURNAL = "journalctl --no-pager -o short-iso; echo; echo '--- failed units'; systemctl --failed --no-pager"


def nodes_running() -> list[str]:
    """The nodes ``scripts/cluster status`` does not list as stopped (booted, starting or unreachable)."""
    rows = (line.split("\t") for line in cluster("status").stdout.splitlines())
    return [row[0] for row in rows if len(row) == 3 and row[2] != "stopped"]


def save_journals(names: list[str]) -> Path:
    """Each node's journal and failed units into ``.cache/cluster-logs/<node>.log`` (over SSH; a node
    that does not answer gets the error instead): what is left to read once ``cluster down`` has
    deleted the nodes."""
    CLUSTER_LOGS.mkdir(parents=True, exist_ok=True)
    for name in names:
        ssh = ["ssh", "-i", str(SSH_KEY), *SSH_OPTIONS.split(), "-o", "ConnectTimeout=10", f"root@{NODES[name]}"]
        with (CLUSTER_LOGS / f"{name}.log").open("w") as out:
            try:
                subprocess.run([*ssh, JOURNAL], stdout=out, stderr=subprocess.STDOUT, timeout=300, check=False)
            except subprocess.TimeoutExpired:
                out.write(f"\n--- {name}: the journal was not read within 300 s\n")
    return CLUSTER_LOGS


def take_down() -> subprocess.CompletedProcess[str]:
    """``scripts/cluster down``, the running nodes' journals saved first (``save_journals``)."""
    running = nodes_running()
    if running:
        save_journals(running)
    return cluster("down")


def put(name: str, content: str, remote: str, owner: str = "root") -> None:
    """Write ``content`` to ``remote`` on a node (over SSH's stdin: no scp dependency)."""
    command = f"cat > {shlex.quote(remote)} && chown {owner}: {shlex.quote(remote)}"
    ssh = ["ssh", "-i", str(SSH_KEY), *SSH_OPTIONS.split(), f"root@{NODES[name]}", command]
    subprocess.run(ssh, input=content, text=True, check=True, timeout=120)


def fetch(name: str, remote: str) -> bytes:
    """A node's file, read over SSH (``put``'s other direction)."""
    ssh = ["ssh", "-i", str(SSH_KEY), *SSH_OPTIONS.split(), f"root@{NODES[name]}", f"cat {shlex.quote(remote)}"]
    return subprocess.run(ssh, capture_output=True, check=True, timeout=300).stdout


@dataclass(frozen=True)
class CliRun:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def json(self) -> Any:
        return json.loads(self.stdout)


def memoryctl(*args: str, timeout: float = 900, on: str = "node1", env: dict[str, str] | None = None) -> CliRun:
    """``memoryctl ARGS`` on the db node (or ``on``) as the memoryctl user (what cron runs), from its data dir.

    One inference thread for the in-process embedder (migrate to ``kind=local``): the nodes share
    the host's cores, and OpenMP threads spin when they do (see templates/vllm/vllm@.service.j2).
    ``env``: ``MEMORYCTL_*`` settings for this one command (the node's file stays as deployed).
    """
    assignments = ["OMP_NUM_THREADS=1", *(f"{name}={value}" for name, value in (env or {}).items())]
    command = "cd /var/lib/memoryctl && sudo -u memoryctl " + shlex.join([*assignments, "memoryctl", *args])
    started = time.monotonic()
    result = node(on).run(f"timeout {int(timeout)} sh -c {shlex.quote(command)}")
    return CliRun(result.rc, result.stdout, result.stderr, time.monotonic() - started)


# The scheduled jobs as /etc/cron.d/memoryctl and /etc/cron.d/memoryctl-backup run them (the
# night on the gpu node: CRON_NODES).
CRON_NODES = {"nightly": "node3"}
CRON_COMMANDS = {
    "sync": ("sync",),
    "reconcile": ("reconcile", "--repair"),
    "nightly": ("nightly",),
    "backup qdrant": ("backup", "qdrant"),
}


def wait_healthy(what: str, timeout: float) -> tuple[dict[str, Any], dict[str, str]]:
    """Poll ``memoryctl health --json`` until it exits 0 (healthy): the report, and the scheduled
    jobs that had to be run again on the way (command -> the error of its failed run).

    Why the reruns: cron keeps running the jobs through a maintenance (a nightly at 02:15 that
    meets a rolling restart, a reconcile while a node reboots), and a job that failed then leaves
    ``runs`` degraded until its next run, up to a day later. The operator's runbook after
    maintenance (docs/operations.md) is: read health, run the failed jobs again, health is whole.
    So does this: only when ``runs`` (and the nightly component) is all that is not ok, each failed job
    once, and each
    rerun must succeed (exit 0, no traceback) -- a job that fails again is a failure here. On
    timeout it says what the last report found not ok (a bare ``False`` tells nobody anything).
    """
    last: dict[str, Any] = {}
    reruns: dict[str, str] = {}

    def check() -> dict[str, Any] | None:
        run = memoryctl("health", "--json", "--deadline", "15")
        try:
            report = run.json()
        except ValueError:
            last.update(exit=run.returncode, stdout=run.stdout[-500:], stderr=run.stderr[-500:])
            return None
        bad = {n: c for n, c in report.get("components", {}).items() if c.get("status") not in ("ok", "disabled")}
        last.clear()
        last.update(exit=run.returncode, status=report.get("status"), **bad)
        if run.returncode == 0:
            return dict(report)
        # health's nightly component repeats a failed night (memoryctl.health.nightly): same cause
        if "runs" in bad and set(bad) <= {"runs", "nightly"}:
            failed = {c: r for c, r in bad["runs"]["last"].items() if r["status"] == "failed"}
            for command, record in failed.items():
                assert command in CRON_COMMANDS and command not in reruns, (command, record, reruns)
                reruns[command] = str(record.get("error"))
                again = memoryctl(*CRON_COMMANDS[command], on=CRON_NODES.get(command, "node1"))
                output = again.stdout[-1500:] + again.stderr[-1500:]
                assert again.returncode == 0 and "Traceback" not in output, (command, again.returncode, output)
        return None

    try:
        return wait_for(what, check, timeout=timeout, interval=5), reruns
    except AssertionError as exc:
        raise AssertionError(f"{exc}; not ok in the last report: {json.dumps(last, default=str)[:3000]}") from None


def peer_api(name: str, path: str, method: str = "GET", body: Any = None) -> Any:
    """``METHOD path`` (with a JSON ``body``) on the Qdrant peer of node ``name`` (its mesh address;
    run on the node itself)."""
    script = (
        "import json, re, sys, urllib.request\n"
        "key = re.search(r'api_key: (\\S+)', open('/etc/qdrant/config.yaml').read()).group(1)\n"
        "data = sys.argv[3].encode() if sys.argv[3] else None\n"
        "headers = {'api-key': json.loads(key), 'Content-Type': 'application/json'}\n"
        "req = urllib.request.Request(sys.argv[1], data, headers=headers, method=sys.argv[2])\n"
        "print(urllib.request.urlopen(req, timeout=60).read().decode())\n"
    )
    url = f"http://{MESH[name]}:6333{path}"
    payload = "" if body is None else json.dumps(body)
    out = node(name).check_output(
        f"python3 -c {shlex.quote(script)} {shlex.quote(url)} {method} {shlex.quote(payload)}"
    )
    return json.loads(out)["result"]


def wait_for(what: str, check: Any, timeout: float, interval: float = 2.0, describe: Any = None) -> Any:
    """Poll ``check()`` until it returns something truthy; fail with ``what`` after ``timeout`` s.
    ``describe()``, when given, says what the state was at the end (a bare ``False`` tells nothing)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    state = ""
    if describe is not None:
        try:
            state = f"; state: {json.dumps(describe(), default=str)}"
        except Exception as exc:  # the description must not hide the timeout
            state = f"; state unreadable: {exc!r}"
    raise AssertionError(f"{what}: not reached in {timeout:.0f} s (last: {last!r}){state}"[:6000])


if __name__ == "__main__":
    # `python3 -m tests.deploy.cluster down`: .ci/run's exit trap, for a session that could not take
    # its nodes down itself (killed, or hung past the job's time).
    if sys.argv[1:] != ["down"]:
        raise SystemExit("usage: python3 -m tests.deploy.cluster down")
    done = take_down()
    print(done.stderr.strip() or done.stdout.strip(), file=sys.stderr)
    raise SystemExit(done.returncode)
