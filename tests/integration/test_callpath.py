"""An HTTP ``add`` enters the client facade once and stays in the write package (issue 43).

The write orchestration used to bounce client.py -> delivery.py -> client.py several times per
request; it lives in memoryctl/write/ now. scripts/callpath traces a real request through a real
``memoryctl serve`` on the embedded default, so this pins the shape the code actually runs, not
the imports it could run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


def test_http_add_enters_the_client_once_and_the_write_package_does_the_rest() -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("MEMORYCTL_CONFIG", None)
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "callpath"), "--json", "add", "Alice: the rollback is done"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    walk = json.loads(run.stdout.strip().splitlines()[-1])
    orchestration = [s for s in walk["stays"] if s.startswith(("memoryctl/client.py", "memoryctl/write/"))]
    assert orchestration[0] == "memoryctl/client.py", orchestration
    assert orchestration.count("memoryctl/client.py") == 1, orchestration
    assert "memoryctl/write/pipeline.py" in walk["order"]
    assert walk["order"][:2] == ["memoryctl/serve/server.py", "memoryctl/serve/app.py"], walk["order"]
