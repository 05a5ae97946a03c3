"""Deploy tests: three local nodes (``scripts/cluster``), two pyinfra runs, then verification.

The session fixture ``deployed`` brings the cluster up (unless it already is: ``scripts/cluster up``
also starts the controller's stand-ins, ``scripts/standin``), deploys from scratch and kills that
run half-way (right after TimescaleDB's repository was added), deploys again (that run must
converge), deploys a third time (that run must change nothing), and tears the cluster down at the
end unless it was already up before the session or ``MEMORYCTL_CLUSTER_KEEP=1``. Those runs deploy
PostgreSQL as a single server (tests/deploy/single-server.yaml); test_ha.py, ordered last, converts
it to the inventory's Patroni cluster. ``imported`` then
initialises memoryctl on the db node and imports the end-to-end data set (tests/deploy/e2e_data.py)
over the mesh. Timings, changed counts, figures of the end-to-end and fault tests and ``ss -ltn`` of
every node are written to ``.cache/deploy-report.json`` and printed in the terminal summary:
figures, never assertions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.deploy import e2e_data
from tests.deploy.cluster import (
    BASE_OVERLAYS,
    NODES,
    REPO,
    DeployRun,
    cluster,
    memoryctl,
    node,
    put,
    run_deploy,
    wait_for,
)

REPORT = REPO / ".cache" / "deploy-report.json"
_report: dict[str, Any] = {}


def record(key: str, value: Any) -> None:
    """A figure for the closing report (``.cache/deploy-report.json``, the pytest summary)."""
    _report[key] = value
    REPORT.write_text(json.dumps(_report, indent=2, default=str))


KILL_AT = "PostgreSQL | Refresh apt lists (timescaledb"


# Every test but test_ha.py runs on the stack as every install before issue 26 was: one PostgreSQL
# server. test_ha.py runs last (pytest_collection_modifyitems), converts the stack in place to the
# inventory's Patroni cluster and drills it (docs/ha.md).
SINGLE_SERVER = REPO / "tests" / "deploy" / "single-server.yaml"


@dataclass(frozen=True)
class Deployed:
    first: DeployRun
    second: DeployRun


def _missing_tools() -> list[str]:
    tools = ("debootstrap", "systemd-nspawn", "nft", "ip", "ssh", "java", "mvn")
    return [tool for tool in tools if shutil.which(tool) is None]


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("the local nodes need root (network namespaces, overlayfs, systemd-nspawn)")
    missing = _missing_tools()
    if missing:
        pytest.fail(f"host tools missing for the local nodes: {missing} (see .ci/apt-packages.txt)")
    already_up = cluster("status").returncode == 0
    if not already_up:
        started = time.monotonic()
        up = cluster("up")
        if up.returncode != 0:
            pytest.fail(f"scripts/cluster up failed:\n{up.stdout}\n{up.stderr}")
        record(
            "cluster_up", {"seconds": round(time.monotonic() - started, 1), "log": up.stderr.strip().splitlines()[-1:]}
        )
    yield
    if not already_up and os.environ.get("MEMORYCTL_CLUSTER_KEEP") != "1":
        cluster("down")


@pytest.fixture(scope="session")
def deployed(local_cluster: None) -> Deployed:
    """The killed, first and second deploy of the single server (every deploy test's stack).

    ``MEMORYCTL_DEPLOY_REUSE=1`` (a developer's loop on a kept cluster, never CI): the nodes as
    they are, nothing deployed or imported here."""
    if os.environ.get("MEMORYCTL_DEPLOY_REUSE") == "1":
        return Deployed(None, None)  # type: ignore[arg-type]
    logs = REPO / ".cache"
    # Both runs deploy the same commit of memoryctl even if someone commits in between.
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    if head.returncode == 0:
        os.environ["MEMORYCTL_SOURCE_REF"] = head.stdout.strip()
    # The stand-ins current with the artefacts and this checkout (a no-op right after `cluster up`).
    standin = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "standin"), "up"], cwd=REPO, capture_output=True, text=True
    )
    assert standin.returncode == 0, f"scripts/standin up failed:\n{standin.stdout}\n{standin.stderr}"
    # The first deploy is killed half-way, right after TimescaleDB's repository was added and
    # before its lists were fetched (the moment a deploy used to leave a node unable to install
    # for an hour); the next run must converge, and the one after change nothing.
    BASE_OVERLAYS[:] = [SINGLE_SERVER]
    killed = run_deploy(logs / "deploy-killed.log", kill_at=KILL_AT)
    assert killed.returncode != 0 and f"Starting operation: {KILL_AT}" in killed.output, killed.output[-3000:]
    first = run_deploy(logs / "deploy-first.log")
    assert first.returncode == 0 and first.errors == 0, first.output[-4000:]
    second = run_deploy(logs / "deploy-second.log")
    record("killed_deploy", {"seconds": round(killed.seconds, 1), "killed_at": KILL_AT})
    record("first_deploy", {**first.figures(), "after_the_killed_run": True})
    record("second_deploy", {**second.figures(), "changed_operations": second.changed_operations()})
    record("ss_ltn", {name: node(name).check_output("ss -ltn") for name in NODES})
    return Deployed(first, second)


@pytest.fixture(scope="session")
def dataset() -> e2e_data.DataSet:
    return e2e_data.build()


@pytest.fixture(scope="session")
def imported(deployed: Deployed, dataset: e2e_data.DataSet) -> e2e_data.DataSet:
    """memoryctl initialised on the db node and the data set imported through the write path."""
    if os.environ.get("MEMORYCTL_DEPLOY_REUSE") == "1":
        return dataset  # imported when the kept cluster was first deployed
    init = memoryctl("init")
    assert init.returncode == 0, init.stderr
    put("node1", dataset.jsonl(), "/var/lib/memoryctl/e2e.jsonl", owner="memoryctl")
    result = memoryctl("import", "e2e.jsonl", "--json")
    outcome = result.json()
    assert outcome["inserted"] + outcome["unchanged"] == len(dataset.records), outcome
    figures = {"memories": len(dataset.records), "cli_seconds": round(result.seconds, 1), **outcome}
    if any(outcome["pending"].values()):
        # A store that did not answer in time: the outbox keeps the writes and retries them with a
        # backoff (up to 5 min); the test waits for it as cron's sync would deliver them. On a busy
        # machine (load ~10) the embedding stand-in's one CPU thread delivers ~250 memories a minute.
        errors = "SELECT DISTINCT target || ': ' || left(last_error, 200) FROM outbox"
        figures["outbox_errors"] = node("node1").check_output(f'sudo -u postgres psql -XAtd memoryctl -c "{errors}"')
        started = time.monotonic()
        wait_for("the outbox delivered", lambda: memoryctl("sync").returncode == 0, timeout=900, interval=10)
        figures["seconds_until_delivered"] = round(time.monotonic() - started, 1)
    # Neo4j after a bulk import: its first queries of a shape plan and compile cold, and on a busy
    # machine the first can outlast the 2 s store timeout (degraded). The tests assert answers, so
    # they start once a graph query answers (docs/operations.md, "After a Neo4j restart").
    started = time.monotonic()
    graph = ("query", "--agent", e2e_data.AGENT, "--json", "--entity", "person:p00", "--via", "AUTHORED")
    wait_for("a graph query answers (Neo4j warm)", lambda: memoryctl(*graph).returncode == 0, timeout=300, interval=5)
    figures["graph_answers_after_s"] = round(time.monotonic() - started, 1)
    record("import", figures)
    return dataset


# Whichever test first asks for the deployed stack pays for two whole deploys (about 6 and 1
# minutes on an idle machine, twice that on a busy one): more than the suite's per-test timeout.
DEPLOY_TIMEOUT = 1800
# After every other deploy test, in this order: the conversion to the Patroni cluster and its
# drills, then the drills that change the cluster's shape (they need the converted cluster).
RUN_LAST = ("tests/deploy/test_ha.py", "tests/deploy/test_reshape.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The cluster-shape drills marked `drill` run on demand (`scripts/test --drills`): deselected,
    # not skipped, so CI's run says how many it left out.
    if os.environ.get("MEMORYCTL_DRILLS") != "1":
        drills = [item for item in items if item.get_closest_marker("drill")]
        if drills:
            config.hook.pytest_deselected(items=drills)
            items[:] = [item for item in items if item not in drills]
    # The Patroni conversion and its drills come right after every other test of the deployed stack
    # (they run on the single server), then the cluster-shape drills on the converted cluster, before
    # whatever the session runs next.
    last = [item for module in RUN_LAST for item in items if item.nodeid.startswith(module)]
    if last:
        rest = [item for item in items if item not in last]
        on_nodes = [i for i, item in enumerate(rest) if item.nodeid.startswith("tests/deploy/test_")]
        at = on_nodes[-1] + 1 if on_nodes else len(rest)
        items[:] = rest[:at] + last + rest[at:]
    for item in items:
        if "deployed" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(DEPLOY_TIMEOUT))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _report:
        return
    terminalreporter.section("deploy figures")
    for key, value in _report.items():
        if key != "ss_ltn":
            terminalreporter.write_line(f"{key}: {json.dumps(value, default=str)[:1500]}")
    for name, listing in _report.get("ss_ltn", {}).items():
        terminalreporter.write_line(f"--- ss -ltn on {name}")
        terminalreporter.write_line(listing)
