"""``memoryctl health``'s alerting component against a real Prometheus and a real Alertmanager
(Debian's packages, as the deploy runs them): a Watchdog rule fires always, Alertmanager sends it to
a webhook this test serves (delivered) and to a receiver nobody listens on (failed), and the
component reads both from Prometheus — then says ``down`` when Prometheus is gone.
"""

from __future__ import annotations

import http.server
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memoryctl.config import Settings
from memoryctl.deadline import poll_until
from memoryctl.health.alerting import alerting_probe, judge, observe

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # real servers and Alertmanager's retries: about a minute

HANG_GUARD_S = 120  # the servers start and the first notifications go out in seconds; a hang guard only


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list[bytes] = []

    def do_POST(self) -> None:
        self.received.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def start_servers(tmp_path: Path, am_port: int, am_cluster: int, prom_port: int) -> list[subprocess.Popen[bytes]]:
    """Alertmanager and Prometheus on loopback, with the configuration files written in ``tmp_path``."""
    alertmanager, prometheus = shutil.which("prometheus-alertmanager"), shutil.which("prometheus")
    assert alertmanager and prometheus
    return [
        _start(
            [
                alertmanager,
                f"--config.file={tmp_path / 'alertmanager.yml'}",
                f"--storage.path={tmp_path / 'am'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                f"--cluster.listen-address=127.0.0.1:{am_cluster}",
            ],
            tmp_path / "alertmanager.log",
        ),
        _start(
            [
                prometheus,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'prom'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            tmp_path / "prometheus.log",
        ),
    ]


@pytest.fixture
def monitoring(tmp_path: Path) -> Iterator[dict[str, Any]]:
    prometheus, alertmanager = shutil.which("prometheus"), shutil.which("prometheus-alertmanager")
    if not prometheus or not alertmanager:
        pytest.fail("prometheus and prometheus-alertmanager (Debian) are needed: scripts/bootstrap installs them")
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    dead, am_port, am_cluster, prom_port = _free_port(), _free_port(), _free_port(), _free_port()
    (tmp_path / "alertmanager.yml").write_text(
        "route: {receiver: hook, group_by: [alertname], group_wait: 0s, group_interval: 1s, repeat_interval: 1s,\n"
        "        routes: [{receiver: hook, continue: true}, {receiver: nobody}]}\n"
        "receivers:\n"
        f"  - {{name: hook, webhook_configs: [{{url: 'http://127.0.0.1:{hook.server_port}/'}}]}}\n"
        f"  - {{name: nobody, webhook_configs: [{{url: 'http://127.0.0.1:{dead}/', max_alerts: 0}}]}}\n"
    )
    (tmp_path / "rules.yml").write_text(
        "groups: [{name: t, rules: [{alert: Watchdog, expr: vector(1)}, {alert: AlwaysOn, expr: vector(1)}]}]\n"
    )
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "rule_files: [rules.yml]\n"
        f"alerting: {{alertmanagers: [{{static_configs: [{{targets: ['127.0.0.1:{am_port}']}}]}}]}}\n"
        f"scrape_configs: [{{job_name: alertmanager, static_configs: [{{targets: ['127.0.0.1:{am_port}']}}]}}]\n"
    )
    procs = start_servers(tmp_path, am_port, am_cluster, prom_port)
    try:
        yield {"url": f"http://127.0.0.1:{prom_port}", "hook": _Hook.received, "logs": tmp_path}
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
        hook.shutdown()


def _settled(url: str) -> Any:
    """Once Prometheus has seen a delivery and a failure of Alertmanager's, and its uptime."""
    try:
        seen = observe(url, window_s=300, timeout_s=2)
    except Exception:  # not listening yet
        return None
    return seen if sum(seen.sent.values()) > sum(seen.failed.values()) > 0 and seen.uptime_s else None


def test_delivered_and_failed_notifications_are_read_from_prometheus(monitoring: dict[str, Any]) -> None:
    polled = poll_until(lambda: _settled(monitoring["url"]), timeout_s=HANG_GUARD_S, interval_s=1)
    assert polled.ok, (monitoring["logs"] / "alertmanager.log").read_text()[-2000:]
    seen = polled.value
    assert seen is not None and monitoring["hook"]  # the webhook really got notifications
    assert list(seen.up.values()) == [1.0]
    assert seen.firing == ["AlwaysOn"]  # the Watchdog is not listed: it always fires

    report = judge(seen, window_s=300, heartbeat=True, heartbeat_interval_s=1)
    assert report["status"] == "degraded" and "notifications failed in the last 300s (webhook " in report["error"]
    assert report["delivered"]["webhook"] >= 1 and report["failed"]["webhook"] >= 1

    settings = Settings.model_validate({"alerting": {"prometheus_url": monitoring["url"], "window_s": 300}})
    probe = alerting_probe(settings, timeout_s=2)
    assert probe["status"] == "degraded" and probe["prometheus"] == monitoring["url"]

    # An HA pair's list (docs/monitoring.md): the first that answers is read; one that does not
    # answer is named, and degrades the component (alerts still fire from the other).
    dead = f"http://127.0.0.1:{_free_port()}"
    pair = Settings.model_validate({"alerting": {"prometheus_url": [dead, monitoring["url"]], "window_s": 300}})
    probe = alerting_probe(pair, timeout_s=2)
    assert probe["prometheus"] == monitoring["url"] and list(probe["unanswered"]) == [dead]
    assert probe["status"] == "degraded" and f"Prometheus does not answer: {dead}" in probe["error"]


def test_a_prometheus_that_does_not_answer_is_down_and_none_configured_is_disabled() -> None:
    from memoryctl.errors import StoreUnavailable

    port = _free_port()
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}"):
        observe(f"http://127.0.0.1:{port}", window_s=60, timeout_s=1)
    other = _free_port()
    pair = Settings.model_validate({"alerting": {"prometheus_url": [f"http://127.0.0.1:{p}" for p in (port, other)]}})
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}.*; .*127.0.0.1:{other}"):
        alerting_probe(pair, timeout_s=1)
    assert alerting_probe(Settings(), timeout_s=1)["status"] == "disabled"
