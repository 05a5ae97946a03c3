"""Helpers for the deploy tests: run pyinfra against the local nodes, read its summary, reach nodes."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

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


def run_deploy(log: Path) -> DeployRun:
    """``pyinfra -y inventory/local.py deploy.py`` from the repository root, timed; output to ``log``."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "inventory/local.py", "deploy.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.monotonic() - started
    output = proc.stdout + proc.stderr
    log.write_text(output)
    match = _GRAND_TOTAL.search(output)
    counts = [_count(c) for c in match.groups()] if match else [0, 0, 0, 0]
    return DeployRun(seconds, proc.returncode, output, *counts)


def node(name: str) -> testinfra.host.Host:
    return testinfra.get_host(f"ssh://root@{NODES[name]}", ssh_identity_file=str(SSH_KEY), ssh_extra_args=SSH_OPTIONS)


def cluster(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLUSTER), command], cwd=REPO, capture_output=True, text=True, check=False)
