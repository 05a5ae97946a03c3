"""The CI skip guard of tests/conftest.py sees every way a test can go missing (issue 25, item 3).

Each case runs a small suite in a subprocess with ``CI=true`` and tests/conftest.py as its plugin,
and checks the exit status and the summary line: a module skipped while it is collected (a
module-level ``importorskip``) fails CI like a skipped test does, and a backend of a parametrised
suite that never ran fails CI although nothing failed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[2]


def run_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, conftest: str = "", **modules: str
) -> pytest.RunResult:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest("pytest_plugins = ['tests.conftest']\n" + conftest)
    pytester.makepyfile(**modules)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider")


def test_a_module_skipped_at_collection_fails_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_ci(
        pytester,
        monkeypatch,
        test_gone="import pytest\npytest.importorskip('no_such_module_for_memoryctl')\n\ndef test_x():\n    pass\n",
        test_here="def test_y():\n    pass\n",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*FAILS CI: test_gone.py: *no_such_module_for_memoryctl*"])


def test_a_backend_that_never_ran_fails_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stands for any way a collected backend leaves no report (a plugin that swallows it, a run
    cut short): the run is green test by test, yet one backend was never exercised."""
    result = run_ci(
        pytester,
        monkeypatch,
        conftest=(
            "import pytest\n\n"
            "@pytest.hookimpl(tryfirst=True)\n"
            "def pytest_runtest_protocol(item, nextitem):\n"
            "    return True if 'server' in item.name else None\n"
        ),
        test_backends=(
            "import pytest\n\n"
            "@pytest.mark.parametrize('factory', ['edge', 'server'])\n"
            "def test_store(factory):\n    pass\n"
        ),
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["*vector-store backends: edge: 1 passed; server: NOT RUN*", "*FAILS CI: backend NOT RUN*"]
    )


def test_a_clean_run_passes_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_ci(pytester, monkeypatch, test_fine="def test_y():\n    pass\n")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
