"""An alert that arrives by email: a real Prometheus and Alertmanager (Debian's packages), the
operator's receiver built by the deploy's own code (deploy/monitoring.py ``receivers``) with
``email_configs`` pointing at an SMTP server this test runs (aiosmtpd from PyPI). The message as
received is printed (pytest -s): its headers and body, with the alert's labels and runbook link.
"""

from __future__ import annotations

import email
import email.policy
import html
import re
import shutil
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from deploy.components import Monitoring
from deploy.monitoring import receivers
from memoryctl.deadline import poll_until
from tests.integration.test_health_alerting import _free_port, start_servers
from wireguard.keys import SecretDir

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUNBOOK = "https://runbooks.example.org/memoryctl/docs/backup.md#wal-cannot-fill-the-db-nodes-disk"


class _Mailbox:
    """aiosmtpd's handler: every message delivered, as bytes."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(envelope.original_content or envelope.content)
        return "250 Message accepted for delivery"


@pytest.fixture
def mailed(tmp_path: Path) -> Iterator[_Mailbox]:
    prometheus, alertmanager = shutil.which("prometheus"), shutil.which("prometheus-alertmanager")
    if not prometheus or not alertmanager:
        pytest.fail("prometheus and prometheus-alertmanager (Debian) are needed: scripts/bootstrap installs them")
    mailbox = _Mailbox()
    smtp = Controller(mailbox, hostname="127.0.0.1", port=_free_port())
    smtp.start()
    am_port, am_cluster, prom_port = _free_port(), _free_port(), _free_port()
    receiver = {
        "email_configs": [
            {
                "to": "oncall@example.org",
                "from": "alertmanager@example.org",
                "smarthost": f"127.0.0.1:{smtp.port}",
                "require_tls": False,  # a loopback test server; production SMTP uses STARTTLS (the default)
                "send_resolved": True,
            }
        ]
    }
    routes = receivers(Monitoring(receiver=receiver), "local", SecretDir(tmp_path / "secrets"))
    (tmp_path / "alertmanager.yml").write_text(
        "route: {receiver: operator, group_by: [alertname, node], group_wait: 0s, group_interval: 1s,"
        " repeat_interval: 1h}\n" + routes.yaml() + "\n"
    )
    (tmp_path / "rules.yml").write_text(
        "groups: [{name: t, rules: [{alert: WalArchiveQueueFilling, expr: vector(1),\n"
        "  labels: {severity: critical, node: node1},\n"
        "  annotations: {summary: 'un-archived WAL on node1 is past half of the queue limit',\n"
        f"                runbook_url: '{RUNBOOK}'}}}}]}}]\n"
    )
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "rule_files: [rules.yml]\n"
        f"alerting: {{alertmanagers: [{{static_configs: [{{targets: ['127.0.0.1:{am_port}']}}]}}]}}\n"
    )
    procs = start_servers(tmp_path, am_port, am_cluster, prom_port)
    try:
        yield mailbox
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
        smtp.stop()
        if not mailbox.messages:
            print((tmp_path / "alertmanager.log").read_text()[-3000:])


def _text(message: EmailMessage) -> str:
    """The message's body as text: its text part, else its HTML with the tags taken out."""
    part = message.get_body(preferencelist=("plain", "html"))
    assert part is not None
    content = str(part.get_content())
    if part.get_content_type() == "text/html":
        content = re.sub(r"<(style|head)[^>]*>.*?</\1>", " ", content, flags=re.S)  # the stylesheet
        content = html.unescape(re.sub(r"<[^>]+>", " ", content))
    return re.sub(r"[ \t]*\n\s*", "\n", re.sub(r"[ \t]+", " ", content)).strip()


def test_a_firing_alert_arrives_by_email_with_its_labels_and_runbook_link(mailed: _Mailbox) -> None:
    polled = poll_until(lambda: mailed.messages, timeout_s=120, interval_s=0.5)
    assert polled.ok, "no email reached the SMTP server in 120 s"
    message = email.message_from_bytes(mailed.messages[0], policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    body = _text(message)
    print("---- the email as received (headers) ----")
    for name, value in message.items():
        print(f"{name}: {value}")
    print("---- its body (HTML part, tags removed) ----")
    print(body)
    assert message["To"] == "oncall@example.org" and message["From"] == "alertmanager@example.org"
    assert "WalArchiveQueueFilling" in message["Subject"] and "FIRING" in message["Subject"]
    for label in ("alertname = WalArchiveQueueFilling", "severity = critical", "node = node1"):
        assert label in body, label
    assert RUNBOOK in body
    assert "un-archived WAL on node1 is past half of the queue limit" in body
