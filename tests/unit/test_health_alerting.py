"""The alerting component's verdict from what Prometheus answered (memoryctl/health/alerting.py)."""

from __future__ import annotations

import pytest

from memoryctl.health.alerting import Observed, judge, summary

UP = {"10.77.0.3:9093": 1.0}
OLD = {"10.77.0.3:9093": 3600.0}


def test_delivered_and_nothing_failed_is_ok_and_the_watchdog_is_not_listed() -> None:
    seen = Observed(
        up=UP, uptime_s=OLD, sent={"webhook": 15.2, "email": 1.0}, failed={"webhook": 0.0}, firing=["QdrantDown"]
    )
    res = judge(seen, window_s=900, heartbeat=True, heartbeat_interval_s=60)
    assert "status" not in res  # the probe runner makes it ok
    assert res["delivered"] == {"webhook": 15, "email": 1} and res["failed"] == {}
    assert summary(res) == "delivered in the last 900s: email 1, webhook 15; firing: QdrantDown"


@pytest.mark.parametrize(
    ("seen", "said"),
    [
        (Observed(up={}, uptime_s={}, sent={}, failed={}), "scrapes no Alertmanager"),
        (Observed(up={"a:9093": 0.0}, uptime_s={}, sent={}, failed={}), "Alertmanager down: a:9093"),
        (
            Observed(up=UP, uptime_s=OLD, sent={"webhook": 10.0, "email": 2.0}, failed={"email": 2.0}),
            "notifications failed in the last 900s (email 2)",
        ),
        (
            Observed(up=UP, uptime_s=OLD, sent={"webhook": 0.0}, failed={"webhook": 0.0}),
            "the dead-man's switch will page",
        ),
    ],
    ids=["no target", "down", "failed", "heartbeat silent"],
)
def test_each_way_alerts_would_not_reach_anyone_is_degraded(seen: Observed, said: str) -> None:
    res = judge(seen, window_s=900, heartbeat=True, heartbeat_interval_s=60)
    assert res["status"] == "degraded" and said in res["error"], res


def test_an_empty_window_says_nothing_right_after_a_restart_or_without_a_heartbeat() -> None:
    quiet = {"sent": {"webhook": 0.0}, "failed": {"webhook": 0.0}}
    young = Observed(up=UP, uptime_s={"10.77.0.3:9093": 230.0}, **quiet)  # resend + three pings: 240 s
    assert "status" not in judge(young, window_s=900, heartbeat=True, heartbeat_interval_s=60)
    settled = Observed(up=UP, uptime_s={"10.77.0.3:9093": 240.0}, **quiet)
    assert judge(settled, window_s=900, heartbeat=True, heartbeat_interval_s=60)["status"] == "degraded"
    assert "status" not in judge(settled, window_s=900, heartbeat=False, heartbeat_interval_s=60)
