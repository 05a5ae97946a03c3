"""The rest stage in shards run at once, each against its own servers (scripts/test ``rest``).

Why: on CI's two cores one pytest process of the rest stage keeps about 0.8 of a core busy (it
waits on PostgreSQL, Neo4j, Qdrant and the CLI processes it starts); two at once finish in a bit
more than half the time. Each shard has its own PostgreSQL, Neo4j and Qdrant (scripts/services
with ``MEMORYCTL_SERVICES_DIR`` and ports of its own), so no test shares a server with a test of
the other shard.

``--shard K/N`` keeps the test modules of shard K of N. The split is by module, never inside one,
so that a module's fixtures are set up once; modules are balanced by the seconds they took in a
measured run (``tests/durations.json``), longest first onto the shard with the fewest seconds so far
(a module not in the file counts as ``DEFAULT_SECONDS``). Deterministic: a failing shard runs again
alone with the same option. ``python3 -m tests.shard update JUNIT...`` rewrites the file from the
junit XML of a run (scripts/test writes .cache/junit-rest-K.xml).
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
DEFAULT_SECONDS = 5.0


def parse(value: str) -> tuple[int, int]:
    """``K/N`` with 1 <= K <= N."""
    try:
        k, n = (int(part) for part in value.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard {value!r}: expected K/N, e.g. 1/2") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard {value!r}: K must be between 1 and N")
    return k, n


def assign(modules: list[str], seconds: dict[str, float], shards: int) -> list[list[str]]:
    """The modules of each shard: longest first onto the least loaded shard (ties: the lower shard)."""
    loads = [0.0] * shards
    out: list[list[str]] = [[] for _ in range(shards)]
    for module in sorted(set(modules), key=lambda m: (-seconds.get(m, DEFAULT_SECONDS), m)):
        target = min(range(shards), key=lambda i: (loads[i], i))
        out[target].append(module)
        loads[target] += seconds.get(module, DEFAULT_SECONDS)
    return out


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def load_durations() -> dict[str, float]:
    if not DURATIONS.exists():
        return {}
    data: dict[str, float] = json.loads(DURATIONS.read_text())
    return data


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--shard", default=None, help="K/N: run only the test modules of shard K of N (tests/shard.py)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    value = config.getoption("--shard")
    if not value:
        return
    k, n = parse(value)
    mine = set(assign([module_of(item.nodeid) for item in items], load_durations(), n)[k - 1])
    others = [item for item in items if module_of(item.nodeid) not in mine]
    if others:
        config.hook.pytest_deselected(items=others)
        items[:] = [item for item in items if module_of(item.nodeid) in mine]


def seconds_per_module(junit_files: list[Path]) -> dict[str, float]:
    """Seconds per test module (``tests/x/test_y.py``) summed over the test cases of junit XML files."""
    root = Path(__file__).resolve().parent.parent
    totals: dict[str, float] = defaultdict(float)
    for junit in junit_files:
        for case in ET.parse(junit).iter("testcase"):
            parts = (case.get("classname") or "").split(".")
            # classname is the module's dotted path, then a class name if the test is in one
            for end in range(len(parts), 0, -1):
                path = "/".join(parts[:end]) + ".py"
                if (root / path).is_file():
                    totals[path] += float(case.get("time") or 0.0)
                    break
    return {module: round(total, 1) for module, total in sorted(totals.items())}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "update":
        print("usage: python3 -m tests.shard update JUNIT_XML...", file=sys.stderr)
        return 2
    measured = seconds_per_module([Path(arg) for arg in argv[1:]])
    DURATIONS.write_text(json.dumps({**load_durations(), **measured}, indent=1, sort_keys=True) + "\n")
    print(f"{DURATIONS}: {len(measured)} modules, {sum(measured.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
