"""Deploy tests: three local nodes (``scripts/cluster``), two pyinfra runs, then verification.

The session fixture ``deployed`` brings the cluster up (unless it already is), deploys from scratch,
deploys again (that run must change nothing), and tears the cluster down at the end unless it was
already up before the session or ``MEMORYCTL_CLUSTER_KEEP=1``. Timings and ``ss -ltn`` of every
node are written to ``.cache/deploy-report.json`` and printed in the terminal summary.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.deploy.cluster import NODES, REPO, DeployRun, cluster, node, run_deploy

REPORT = REPO / ".cache" / "deploy-report.json"
_report: dict[str, Any] = {}


@dataclass(frozen=True)
class Deployed:
    first: DeployRun
    second: DeployRun


def _missing_tools() -> list[str]:
    return [tool for tool in ("debootstrap", "systemd-nspawn", "nft", "ip", "ssh") if shutil.which(tool) is None]


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("the local nodes need root (network namespaces, overlayfs, systemd-nspawn)")
    missing = _missing_tools()
    if missing:
        pytest.fail(f"host tools missing for the local nodes: {missing} (see .ci/apt-packages.txt)")
    already_up = cluster("status").returncode == 0
    if not already_up:
        up = cluster("up")
        if up.returncode != 0:
            pytest.fail(f"scripts/cluster up failed:\n{up.stdout}\n{up.stderr}")
        _report["cluster_up"] = up.stderr.strip().splitlines()[-1:]
    yield
    if not already_up and os.environ.get("MEMORYCTL_CLUSTER_KEEP") != "1":
        cluster("down")


@pytest.fixture(scope="session")
def deployed(local_cluster: None) -> Deployed:
    logs = REPO / ".cache"
    # Both runs deploy the same commit of memoryctl even if someone commits in between.
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    if head.returncode == 0:
        os.environ["MEMORYCTL_SOURCE_REF"] = head.stdout.strip()
    first = run_deploy(logs / "deploy-first.log")
    assert first.returncode == 0 and first.errors == 0, first.output[-4000:]
    second = run_deploy(logs / "deploy-second.log")
    _report["first_deploy"] = {
        "seconds": round(first.seconds, 1),
        "changed": first.changed,
        "unchanged": first.unchanged,
        "operations": first.operations,
    }
    _report["second_deploy"] = {
        "seconds": round(second.seconds, 1),
        "changed": second.changed,
        "unchanged": second.unchanged,
        "operations": second.operations,
        "changed_operations": second.changed_operations(),
    }
    _report["ss_ltn"] = {name: node(name).check_output("ss -ltn") for name in NODES}
    REPORT.write_text(json.dumps(_report, indent=2))
    return Deployed(first, second)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _report:
        return
    terminalreporter.section("deploy figures")
    for key in ("cluster_up", "first_deploy", "second_deploy"):
        if key in _report:
            terminalreporter.write_line(f"{key}: {_report[key]}")
    for name, listing in _report.get("ss_ltn", {}).items():
        terminalreporter.write_line(f"--- ss -ltn on {name}")
        terminalreporter.write_line(listing)
