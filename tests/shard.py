"""The rest stage in shards run at once, each against its own servers (scripts/test ``rest``).

Why: on CI's two cores one pytest process of the rest stage keeps about one core busy (it waits on
PostgreSQL, Neo4j, Qdrant and the CLI and model-server processes it starts); two at once finish in
a bit more than half the time. Each shard has its own PostgreSQL, Neo4j and Qdrant (scripts/services
with ``MEMORYCTL_SERVICES_SHARD``), so no test shares a server with a test of the other shard.

``--shard-claims DIR``: every shard collects the same tests, then takes whole test modules one at
a time by creating ``DIR/<module>`` (``O_EXCL``: exactly one shard gets each), and runs the module
it got; a module the other shard took is reported as deselected when the loop ends. Taking modules
as they come balances the shards by their real speed (a loaded core, a slow server) with no
durations to keep up to date; whole modules, so that a module's fixtures are set up once. Modules
are taken longest first when ``tests/durations.json`` knows them (seconds per module, written by
``python3 -m tests.shard update JUNIT...`` from a run's junit XML), so that no long module starts
last; the others in collection order after them.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def load_durations() -> dict[str, float]:
    if not DURATIONS.exists():
        return {}
    data: dict[str, float] = json.loads(DURATIONS.read_text())
    return data


def take_order(modules: list[str], seconds: dict[str, float]) -> list[str]:
    """The order the shards try to take modules in: measured ones longest first, then the rest as collected."""
    known = sorted((m for m in modules if m in seconds), key=lambda m: (-seconds[m], m))
    return known + [m for m in modules if m not in seconds]


def claim(claims: Path, module: str) -> bool:
    """True for exactly one of the shards asking for ``module``."""
    name = module.replace("/", "__") + "-" + hashlib.sha256(module.encode()).hexdigest()[:8]
    try:
        os.close(os.open(claims / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shard-claims",
        default=None,
        metavar="DIR",
        help="run only the test modules this process takes first in DIR, shared with the other shards (tests/shard.py)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    option = session.config.getoption("--shard-claims")
    if not option or session.config.option.collectonly:
        return None  # pytest's own loop
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
    claims = Path(option)
    claims.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[pytest.Item]] = {}
    for item in session.items:
        groups.setdefault(module_of(item), []).append(item)
    pending = iter(take_order(list(groups), load_durations()))
    taken: set[str] = set()

    def take_next() -> str | None:
        for module in pending:
            if claim(claims, module):
                taken.add(module)
                return module
        return None

    current = take_next()
    while current is not None:
        items, following = groups[current], None
        for index, item in enumerate(items):
            if index + 1 < len(items):
                nextitem: pytest.Item | None = items[index + 1]
            else:  # the next module is taken before the last test, so its teardown knows what follows
                following = take_next()
                nextitem = groups[following][0] if following is not None else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        current = following
    others = [item for module, items in groups.items() if module not in taken for item in items]
    if others:
        session.config.hook.pytest_deselected(items=others)
    return True


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
