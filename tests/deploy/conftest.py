"""Deploy tests: three local nodes (``scripts/cluster``), two pyinfra runs, then verification.

The session fixture ``local_cluster`` brings the cluster up (``scripts/cluster up`` also starts the
controller's stand-ins, ``scripts/standin``); ``deployed`` deploys from scratch and kills that run
half-way (right after TimescaleDB's repository was added), deploys again (that run must
converge), deploys a third time (that run must change nothing). The tests on the nodes run as one
block, test_ha.py and test_reshape.py last (``RUN_LAST``), and the nodes go down as soon as its
last test has run, whatever its outcome (and when ``up`` fails), their journals saved first to
``.cache/cluster-logs/<node>.log``; nothing else of the session runs beside them. A cluster left up
by an earlier run is taken down and brought up fresh; ``MEMORYCTL_CLUSTER_KEEP=1`` reuses it and
leaves the nodes up at the end. Those runs deploy PostgreSQL as a single server
(tests/deploy/single-server.yaml); test_ha.py converts it to the inventory's Patroni cluster.
``imported`` then
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
    CLUSTER_LOGS,
    NODES,
    REPO,
    DeployRun,
    cluster,
    memoryctl,
    node,
    put,
    run_deploy,
    take_down,
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


class _TakeDown:
    """``take_down`` (journals, then ``cluster down``) at most once, and only when armed: by a session
    that brought the nodes up without ``MEMORYCTL_CLUSTER_KEEP=1``, or whose ``up`` failed."""

    def __init__(self) -> None:
        self.armed = False

    def __call__(self) -> None:
        if self.armed:
            self.armed = False
            started = time.monotonic()
            down = take_down()
            record("cluster_down", {"seconds": round(time.monotonic() - started, 1), "rc": down.returncode})


_take_down = _TakeDown()


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("the local nodes need root (network namespaces, overlayfs, systemd-nspawn)")
    missing = _missing_tools()
    if missing:
        pytest.fail(f"host tools missing for the local nodes: {missing} (see .ci/apt-packages.txt)")
    # MEMORYCTL_DEPLOY_REUSE=1 means the nodes as they are: kept, as with MEMORYCTL_CLUSTER_KEEP=1
    keep = "1" in (os.environ.get("MEMORYCTL_CLUSTER_KEEP"), os.environ.get("MEMORYCTL_DEPLOY_REUSE"))
    if keep and cluster("status").returncode == 0:
        record("cluster_up", {"reused": "MEMORYCTL_CLUSTER_KEEP=1"})
    else:
        take_down()  # whatever an earlier run left (killed, kept, half up) is never deployed over
        started = time.monotonic()
        _take_down.armed = True
        up = cluster("up")
        if up.returncode != 0:
            _take_down()
            pytest.fail(f"scripts/cluster up failed (journals: {CLUSTER_LOGS}):\n{up.stdout}\n{up.stderr}")
        _take_down.armed = not keep
        record(
            "cluster_up", {"seconds": round(time.monotonic() - started, 1), "log": up.stderr.strip().splitlines()[-1:]}
        )
    yield
    _take_down()  # a no-op when pytest_runtest_teardown did it after the last test on the nodes


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


# Modules that end the block of tests on the nodes, in this order: test_ha.py converts the single
# server to the inventory's Patroni cluster and drills it, test_reshape.py then changes the shape.
RUN_LAST = ("tests/deploy/test_ha.py", "tests/deploy/test_reshape.py")


def on_nodes(item: pytest.Item) -> bool:
    """A test that needs the local nodes (marked ``deploy``, or asking for ``local_cluster``)."""
    return item.get_closest_marker("deploy") is not None or "local_cluster" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The cluster-shape drills marked `drill` run on demand (`scripts/test --drills`): deselected,
    # not skipped, so CI's run says how many it left out.
    if os.environ.get("MEMORYCTL_DRILLS") != "1":
        drills = [item for item in items if item.get_closest_marker("drill")]
        if drills:
            config.hook.pytest_deselected(items=drills)
            items[:] = [item for item in items if item not in drills]
    # The tests on the nodes run as one block, where the first of them was collected (the nodes go
    # down right after its last test, pytest_runtest_teardown), RUN_LAST's modules at its end.
    block = [item for item in items if on_nodes(item)]
    if block:
        rank = {module: n for n, module in enumerate(RUN_LAST, start=1)}
        block.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], 0))  # stable: the rest keeps its order
        rest = [item for item in items if not on_nodes(item)]
        at = items.index(block[0])
        items[:] = rest[:at] + block + rest[at:]
    for item in items:
        # A drill runs two to six deploys; a module run alone pays for the deploy in its first test
        # (pytest-timeout counts the fixtures' setup): a drill first in its run pays for the cluster,
        # the first deploy and the conversion too (20 minutes of the 30 on a loaded machine, when
        # test_reshape.py's node1 drill timed out in session 15).
        if item.get_closest_marker("drill"):
            item.add_marker(pytest.mark.timeout(2 * DEPLOY_TIMEOUT))
        elif {"deployed", "ha"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.timeout(DEPLOY_TIMEOUT))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """The nodes go down once the last test on them is torn down (its module's fixtures may still use
    them), failed or not: the rest of the session does not share the cores with three nodes."""
    try:
        return (yield)
    finally:
        if on_nodes(item) and (nextitem is None or not on_nodes(nextitem)):
            _take_down()


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
