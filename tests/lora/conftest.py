"""Shared fixtures for the LoRA tests; torch-dependent ones skip cleanly without torch and peft."""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import pytest

TIMINGS: dict[str, float] = {}
RESULTS: dict[str, float] = {}  # gate numbers from real training, printed with the timings


def _extra_installed() -> bool:
    # find_spec, not import: collecting must stay fast and must not import torch for other suites.
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "peft"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if _extra_installed():
        return
    skip = pytest.mark.skip(reason="needs torch, transformers and peft: pip install -e ./lora")
    for item in items:
        # The marker, not ``item.keywords``: keywords hold the directory name too, so "lora" in
        # them skipped every test under tests/lora, the no-torch install test included (issue 42, 9).
        if item.get_closest_marker("lora") is not None:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the measured training/loading timings at the end of the run."""
    if TIMINGS:
        terminalreporter.write_sep("-", "LoRA timings (seconds)")
        for name, secs in sorted(TIMINGS.items()):
            terminalreporter.write_line(f"{name:<48} {secs:8.2f}")
    if RESULTS:
        terminalreporter.write_sep("-", "LoRA gate metrics (real training)")
        for name, value in sorted(RESULTS.items()):
            terminalreporter.write_line(f"{name:<48} {value:8.4f}")


@pytest.fixture(scope="session")
def timings() -> dict[str, float]:
    return TIMINGS


class Stopwatch:
    """``with Stopwatch(timings, "name"):`` records the block's wall-clock time."""

    def __init__(self, sink: dict[str, float], name: str) -> None:
        self.sink, self.name = sink, name

    def __enter__(self) -> Stopwatch:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sink[self.name] = time.perf_counter() - self.t0
