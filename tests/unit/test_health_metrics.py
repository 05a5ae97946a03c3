"""The health metrics node_exporter exposes (``memoryctl health --prometheus``): degraded is told apart
from down, so the alerts can be (templates/prometheus/memoryctl.rules.yml, rules_test.yml)."""

from __future__ import annotations

from memoryctl.health import HealthReport, prometheus


def test_degraded_is_not_down_in_the_metrics() -> None:
    report = HealthReport(
        components={
            "postgres": {"status": "degraded", "latency_ms": 3.0},  # e.g. no synchronous standby
            "neo4j": {"status": "down", "latency_ms": 2000.0},
            "qdrant": {"status": "ok", "latency_ms": 4.0},
        }
    )
    text = prometheus(report)
    assert 'memoryctl_up{component="postgres"} 0' in text and 'memoryctl_degraded{component="postgres"} 1' in text
    assert 'memoryctl_up{component="neo4j"} 0' in text and 'memoryctl_degraded{component="neo4j"} 0' in text
    assert 'memoryctl_up{component="qdrant"} 1' in text and 'memoryctl_degraded{component="qdrant"} 0' in text
