"""Issue 41 item 5: a controller is what docs/deploy.md installs on it, and nothing more.

A fresh venv (no system site-packages, no ``PYTHONPATH``) gets the one install command the guide
states ("Install the controller side with ..."), and the completed Hetzner example is planned there
(tests/deploy/unit/controller_plan.py) the way test_hetzner.py plans it in the test process, where
memoryctl-lora and the ``dev`` extra are installed. The GPU node's night builds memoryctl-lora's own
wheel with the venv's pip for real. The plans must be the same, operation for operation, and the
venv must be unable to import memoryctl-lora or its training stack.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy.settings import REPO
from tests.deploy.unit.plans import NODES, Plan, example_inventory, fill_sha256

pytestmark = pytest.mark.slow

DOCS = REPO / "docs" / "deploy.md"
PLATFORM = "cp313-manylinux_2_41_x86_64"  # the nodes' (Debian 13): deploy/wheelhouse.py node_platform
TRAINING_LOCK = (
    "Nightly LoRA cycle | The training lock (deploy/locks/lora.txt)",
    "Nightly LoRA cycle | memoryctl-lora's closure with torch 2.10.0 (CUDA 12.9) from the lock, hashes required",
    "Nightly LoRA cycle | Install memoryctl-lora and the rest of its wheelhouse",
)


def controller_install() -> list[str]:
    """The controller's install command, as docs/deploy.md states it."""
    (command,) = re.findall(r"Install the controller side with `([^`]+)`", DOCS.read_text())
    return shlex.split(command)


def outside_env() -> dict[str, str]:
    """This process's environment without what would let the venv see the test's packages."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "PYTHONNOUSERSITE": "1"}


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, float]]:
    """A fresh venv with the guide's install in it, and how long that took; removed afterwards (some
    550 MB). Module scope: set up before the function fixtures point ``HOME`` at the operator's, so
    pip's cache is the real one."""
    venv = tmp_path_factory.mktemp("controller") / "venv"
    command = controller_install()
    assert command[:2] == ["pip", "install"], command
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # From the checkout, as the guide's `.` says.
    subprocess.run([str(venv / "bin" / "python"), "-m", *command], cwd=REPO, env=outside_env(), check=True)
    yield venv, time.monotonic() - started
    shutil.rmtree(venv)


def test_the_guides_controller_install_plans_the_hetzner_example(
    controller: tuple[Path, float],
    plans: dict[str, Plan],
    tmp_path: Path,
    no_wheel_build: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    venv, installed_in = controller
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    wheelhouses = tmp_path / "controller-wheelhouse"

    def operator(doc: dict[str, Any]) -> None:
        fill_sha256(doc)
        doc["components"]["memoryctl"]["wheelhouse"] = str(wheelhouses)  # not the checkout's .cache

    (tmp_path / "controller").mkdir()
    inventory = example_inventory(tmp_path / "controller", operator)
    started = time.monotonic()
    command = ["-m", "tests.deploy.unit.controller_plan", str(inventory), str(no_wheel_build), *NODES]
    result = subprocess.run(
        [str(venv / "bin" / "python"), *command],
        cwd=REPO,
        env=outside_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    planned_in = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-6000:]
    report = json.loads(result.stdout.splitlines()[-1])
    with capsys.disabled():
        print(
            f"\ncontroller venv: `{shlex.join(controller_install())}` {installed_in:.1f}s;"
            f" the Hetzner example planned there {planned_in:.1f}s ({report['seconds']}s planning)"
        )

    # The venv's own packages, this checkout's deploy/ and memoryctl (editable): nothing of the test's.
    assert report["prefix"] == str(venv)
    assert report["paths"]["pyinfra"].startswith(str(venv)), report["paths"]
    for name in ("deploy", "memoryctl"):
        assert report["paths"][name].startswith(str(REPO)), report["paths"]
    # memoryctl-lora and its training stack (controller_plan.TRAINING): neither importable there nor needed.
    assert report["importable"] == [] and report["imported"] == [], report

    # The same plans, operation for operation, as in the test process.
    assert report["plans"] == {name: p.names() for name, p in plans.items()}
    gpu = report["plans"]["mem-gpu"]
    assert all(name in gpu for name in TRAINING_LOCK), [n for n in gpu if n.startswith("Nightly")]
    # memoryctl-lora's own wheel, built by the venv's pip, and nothing of its closure.
    built = sorted(p.name for p in (wheelhouses / f"lora-only-{PLATFORM}").glob("*.whl"))
    assert built == ["memoryctl_lora-0.1.0-py3-none-any.whl"], built
