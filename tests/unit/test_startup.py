"""Start-up stays cheap: the CLI imports the heavy libraries only in the commands that use them.

Every ``memoryctl`` call pays its imports before it does anything; psycopg, pydantic, numpy, rich
and the store clients cost ~1.5 s together on a busy 2-core host (``python -X importtime``). The
time itself is measured by ``benchmarks/latency.py``; this pins the cause, which a timed test
could not do reliably on a shared machine: which modules a command loads.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("psycopg", "pydantic", "numpy", "rich", "qdrant_client", "qdrant_edge", "neo4j", "httpx", "click", "torch")

PROBE = """
import contextlib, io, json, sys
from memoryctl.cli.main import _invoke
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = _invoke(sys.argv[1:])
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(HEAVY)))
print(json.dumps({"code": code, "heavy": heavy, "out": out.getvalue()}))
"""


def _run(*argv: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.replace("HEAVY", repr(json.dumps(HEAVY))), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["get", "--help"], ["query", "--help"], ["health", "-h"]])
def test_help_loads_no_heavy_library(argv: list[str]) -> None:
    result = _run(*argv)
    assert result["code"] == 0
    assert "memoryctl" in str(result["out"])
    # typer (>= 0.2x) converts a subcommand's parameters with pydantic itself: not ours to avoid
    allowed = ["pydantic"] if argv[0] not in ("--help", "--version") else []
    assert [m for m in result["heavy"] if m not in allowed] == []  # type: ignore[attr-defined]


def test_package_import_is_lazy() -> None:
    code = f"import sys, memoryctl; print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]"
    # the public names still resolve, on first use
    proc = subprocess.run(
        [sys.executable, "-c", "from memoryctl import MemoryClient, QueryResult, ExitCode; print(ExitCode.USAGE)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert proc.stdout.strip() == "2"
