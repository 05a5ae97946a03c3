"""The deploy tests' health wait (tests/deploy/cluster.py: wait_healthy) runs a job that failed
during maintenance again, as docs/operations.md's runbook says, and only then: a fake of our own
CLI's answers (the real path runs on the nodes, where a collision with cron cannot be staged on
demand)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.deploy import cluster
from tests.deploy.cluster import CliRun


def _health(code: int, **bad: dict[str, Any]) -> CliRun:
    components = {"postgres": {"status": "ok"}, **bad}
    status = "healthy" if code == 0 else "degraded"
    return CliRun(code, json.dumps({"status": status, "components": components}), "", 0.1)


FAILED_NIGHT = {
    "runs": {"status": "degraded", "last": {"nightly": {"status": "failed", "error": "Qdrant restarting"}}},
    "nightly": {"status": "degraded", "error": "the last night failed"},
}


def _script(monkeypatch: pytest.MonkeyPatch, answers: dict[tuple[str, ...], list[CliRun]]) -> list[tuple[str, ...]]:
    calls: list[tuple[str, ...]] = []

    def memoryctl(*args: str, timeout: float = 900, on: str = "node1") -> CliRun:
        assert on == ("node3" if args[0] == "nightly" else "node1"), (args, on)  # the night is the gpu node's
        key = args[:1] if args[0] == "health" else args
        calls.append(args)
        queue = answers[key]
        return queue.pop(0) if len(queue) > 1 else queue[0]  # the last answer stays

    monkeypatch.setattr(cluster, "memoryctl", memoryctl)
    monkeypatch.setattr(cluster.time, "sleep", lambda s: None)
    return calls


def test_a_night_failed_during_maintenance_is_run_again_then_health_is_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _script(
        monkeypatch,
        {("health",): [_health(3, **FAILED_NIGHT), _health(0)], ("nightly",): [CliRun(0, "nightly: ok", "", 2.0)]},
    )
    report, reruns = cluster.wait_healthy("health", timeout=60)
    assert report["status"] == "healthy"
    assert reruns == {"nightly": "Qdrant restarting"}
    assert [c[0] for c in calls] == ["health", "nightly", "health"]  # once, not on every poll


def test_a_rerun_that_fails_again_fails_the_wait_with_its_output(monkeypatch: pytest.MonkeyPatch) -> None:
    _script(
        monkeypatch,
        {("health",): [_health(3, **FAILED_NIGHT)], ("nightly",): [CliRun(1, "", "error: Qdrant unavailable", 2.0)]},
    )
    with pytest.raises(AssertionError, match="Qdrant unavailable"):
        cluster.wait_healthy("health", timeout=60)


def test_a_store_not_ok_is_never_papered_over_by_reruns(monkeypatch: pytest.MonkeyPatch) -> None:
    down = {"neo4j": {"status": "down", "error": "refused"}, **FAILED_NIGHT}
    calls = _script(monkeypatch, {("health",): [_health(1, **down)]})
    with pytest.raises(AssertionError, match=r"neo4j.*refused"):
        cluster.wait_healthy("health", timeout=0.5)
    assert all(c[0] == "health" for c in calls)
