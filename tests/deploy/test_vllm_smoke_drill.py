"""The deploy's success depends on vLLM answering (issue 41), on the local nodes' vLLM STAND-IN:
its smoke requests answer in vLLM's shapes, and a stand-in answering 500 fails the deploy with the
unit's journal lines. On demand (``scripts/test --drills tests/deploy/test_vllm_smoke_drill.py``):
two extra deploy runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.cluster import node, run_deploy

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

DROPIN = "/etc/systemd/system/vllm@generate.service.d/zz-drill-fail.conf"


def _units(gpu: Any) -> list[str]:
    mesh = gpu.check_output("ip -4 -o addr show wg0 | awk '{print $4}' | cut -d/ -f1").strip()
    active = gpu.check_output("systemctl list-units --state=active --plain --no-legend 'vllm@*' | awk '{print $1}'")
    units = []
    for unit in active.split():
        instance = unit.removeprefix("vllm@").removesuffix(".service")
        port = gpu.check_output(f"sed -n 's/^PORT=//p' /etc/vllm/{instance}.args").strip()
        units.append(f"--unit vllm@{instance}=http://{mesh}:{port}:{'generate' if instance == 'generate' else 'embed'}")
    return units


@pytest.mark.drill
def test_the_standins_answer_the_smoke_requests(deployed: Any) -> None:
    gpu = node("node3")
    units = _units(gpu)
    out = gpu.check_output(
        f"python3 /opt/vllm/vllm-smoke smoke --env /etc/vllm/vllm.env --timeout 120 {' '.join(units)}"
    )
    print(out)
    assert "vllm@generate: ok: chat completion from" in out
    assert any(f"{unit.split('=')[0].split()[-1]}: ok: embedding of" in out for unit in units if ":embed" in unit)


@pytest.mark.drill
def test_a_standin_answering_500_fails_the_deploy_with_its_journal(deployed: Any, tmp_path: Path) -> None:
    gpu = node("node3")
    gpu.check_output(
        f"mkdir -p {Path(DROPIN).parent} && printf '[Service]\\nEnvironment=VLLM_STANDIN_FAIL_REQUESTS=1\\n' > {DROPIN}"
    )
    try:
        gpu.check_output("systemctl daemon-reload && systemctl restart vllm@generate")
        broken = run_deploy(tmp_path / "broken.log")
        # The failing step with its journal lines (the run's tail is pyinfra's summary table).
        at = broken.output.find("FAILED:")
        print(broken.output[max(0, at - 300) : at + 3000] if at >= 0 else broken.output[-4000:])
        assert broken.returncode != 0
        assert "vllm@generate: FAILED:" in broken.output and "HTTP 500" in broken.output
        assert "--- journalctl -u vllm@generate -n 30 ---" in broken.output
    finally:
        gpu.check_output(f"rm -f {DROPIN} && systemctl daemon-reload && systemctl restart vllm@generate")
    healed = run_deploy(tmp_path / "healed.log")
    assert healed.returncode == 0, healed.output[-3000:]
