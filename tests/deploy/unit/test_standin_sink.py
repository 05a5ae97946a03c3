"""The controller's stand-in server takes the local Alertmanager's notifications (scripts/standin
``serve``): a POST under /alertsink/ is one JSON line in alertsink.jsonl, anything else is refused,
and the archives are still served."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from memoryctl.deadline import poll_until

REPO = Path(__file__).resolve().parents[3]


def test_notifications_are_kept_one_json_line_each(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "SHA256SUMS").write_text("abc  x\n")
    env = {
        **os.environ,
        "MEMORYCTL_STANDIN_DIR": str(tmp_path),
        "MEMORYCTL_STANDIN_ADDRESS": "127.0.0.1",
        "MEMORYCTL_STANDIN_PORT": str(port),
    }
    server = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "standin"), "serve"], env=env, stderr=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    try:
        up = poll_until(
            lambda: urllib.request.urlopen(base + "/SHA256SUMS", timeout=2).read(),
            timeout_s=30,
            interval_s=0.1,
            retry_on=(OSError,),
        )
        assert up.ok and up.value == b"abc  x\n"
        for path, alert in (("/alertsink/alerts", "QdrantDown"), ("/alertsink/heartbeat", "Watchdog")):
            body = json.dumps({"receiver": "r", "alerts": [{"labels": {"alertname": alert}}]}).encode()
            with urllib.request.urlopen(
                urllib.request.Request(base + path, data=body, method="POST"), timeout=5
            ) as resp:
                assert resp.status == 200
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(urllib.request.Request(base + "/SHA256SUMS", data=b"{}", method="POST"), timeout=5)
        kept = [json.loads(line) for line in (tmp_path / "alertsink.jsonl").read_text().splitlines()]
        assert [(k["path"], k["body"]["alerts"][0]["labels"]["alertname"]) for k in kept] == [
            ("/alerts", "QdrantDown"),
            ("/heartbeat", "Watchdog"),
        ]
        assert all(isinstance(k["t"], float) for k in kept)
    finally:
        server.terminate()
        server.wait(10)
