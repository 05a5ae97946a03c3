"""The tests on the local nodes run as one block and the nodes go down right after its last test
(tests/deploy/conftest.py, issue 42 item 1): a small suite in a subprocess with that conftest's two
hooks, its ``take_down`` replaced by a line in a file (the real one needs the nodes)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[3]

CONFTEST = """
import subprocess

from tests.deploy import conftest as deploy
from tests.deploy.conftest import pytest_collection_modifyitems, pytest_runtest_teardown


def pytest_configure(config):
    config.addinivalue_line("markers", "deploy: on the nodes")


def _take_down():
    with open("events.txt", "a") as out:
        out.write("down\\n")
    return subprocess.CompletedProcess([], 0)


deploy.take_down = _take_down
deploy.record = lambda key, value: None
deploy._take_down.armed = True  # as a session that brought the nodes up
"""


def _test(name: str, *, deploy: bool = False, fails: bool = False) -> str:
    mark = "@pytest.mark.deploy\n" if deploy else ""
    body = f"    open('events.txt', 'a').write('{name}\\n')\n" + ("    assert False\n" if fails else "")
    return f"{mark}def test_{name}():\n{body}\n\n"


def test_the_nodes_go_down_after_the_last_test_on_them_ha_and_reshape_last(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest(CONFTEST)
    header = "import pytest\n\n\n"
    files = {
        "tests/a_first/test_first.py": _test("first"),
        "tests/deploy/test_a.py": _test("a1", deploy=True, fails=True) + _test("a2", deploy=True),
        "tests/deploy/test_ha.py": _test("ha", deploy=True),
        "tests/deploy/test_reshape.py": _test("reshape", deploy=True),
        "tests/deploy/test_zz.py": _test("zz", deploy=True),
        "tests/deploy/unit/test_plan.py": _test("plan"),
        "tests/unit/test_z.py": _test("z"),
    }
    for path, text in files.items():
        (pytester.path / path).parent.mkdir(parents=True, exist_ok=True)
        (pytester.path / path).write_text(header + text)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--import-mode=importlib")
    result.assert_outcomes(passed=7, failed=1)
    events = (pytester.path / "events.txt").read_text().split()
    assert events == ["first", "a1", "a2", "zz", "ha", "reshape", "down", "plan", "z"], result.stdout.str()
