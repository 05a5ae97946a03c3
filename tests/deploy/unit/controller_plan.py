"""The Hetzner example planned inside a controller venv (run by test_controller_venv.py).

``python -m tests.deploy.unit.controller_plan INVENTORY WHEELHOUSE NODE...`` from the checkout, with
the controller venv's Python: every node planned whole (deploy/roles.py) as test_hetzner.py plans it
(tests/deploy/unit/plans.py, fact fixtures of fresh Debian 13 servers: there are no servers to ask),
printed as one JSON line with what this Python could import.

memoryctl's wheelhouse (``pip download`` of its dependencies for the nodes, some 200 MB) is the
unit tests' fake one, ``WHEELHOUSE``, as in the test process (conftest.py ``no_wheel_build``).
memoryctl-lora's wheel for the GPU node is built for real with this venv's pip, under the
inventory's ``components.memoryctl.wheelhouse``: the one controller step that could need
memoryctl-lora or a build backend the venv lacks.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pyinfra

import deploy.memoryctl
import deploy.vllm
import memoryctl
from deploy.roles import everything
from tests.deploy.unit.plans import OPERATOR_DOWNLOADS, plan

# What a controller never installs: memoryctl-lora and its training stack.
TRAINING = ("memoryctl_lora", "torch", "peft", "transformers", "sentence_transformers")


def main(argv: list[str]) -> None:
    inventory, wheelhouse, *nodes = argv
    fake = Path(wheelhouse)
    deploy.memoryctl.controller_wheelhouse = lambda: fake  # type: ignore[assignment]
    deploy.vllm.controller_wheelhouse = lambda: fake  # type: ignore[assignment]
    started = time.monotonic()
    plans = {node: plan(everything, node, inventory=Path(inventory), facts=OPERATOR_DOWNLOADS) for node in nodes}
    report = {
        "plans": {node: p.names() for node, p in plans.items()},
        "seconds": round(time.monotonic() - started, 1),
        "importable": [name for name in TRAINING if importlib.util.find_spec(name) is not None],
        "imported": [name for name in TRAINING if name in sys.modules],
        "prefix": sys.prefix,
        "paths": {module.__name__: str(module.__file__) for module in (memoryctl, deploy, pyinfra)},
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
