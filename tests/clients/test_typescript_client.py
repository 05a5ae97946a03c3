"""The generated TypeScript client (clients/typescript) against a real ``memoryctl serve``: its
tests (``test/client.test.ts``) and the README's example, compiled with tsc in a copy of the
package (the example type-checked against the generated types) and run with node's own test
runner, the services' URLs and tokens in the environment."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.clients.conftest import ROOT, Stack
from tests.clients.test_python_client import readme_block

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # two services, each starting its embedded PostgreSQL
PACKAGE = ROOT / "clients" / "typescript"


def node_modules() -> Path:
    """The package's installed dependencies (``npm ci``, which scripts/bootstrap runs)."""
    found = PACKAGE / "node_modules"
    if not (found / ".bin" / "tsc").exists():
        pytest.fail(f"{found} is not installed: run scripts/bootstrap (or `npm ci` in {PACKAGE})")
    return found


def test_the_typescript_client_and_its_readme_example(stack: Stack, tmp_path: Path) -> None:
    work = tmp_path / "typescript"
    work.mkdir()
    for name in ("package.json", "tsconfig.json"):
        shutil.copy(PACKAGE / name, work / name)
    for name in ("src", "test"):
        shutil.copytree(PACKAGE / name, work / name)
    (work / "node_modules").symlink_to(node_modules())
    # the example imports the package by its name ("memoryctl-client": the package's own exports)
    (work / "test" / "readme.example.ts").write_text(readme_block(PACKAGE / "README.md", "ts"))
    tsc = subprocess.run(
        ["node", "node_modules/typescript/bin/tsc", "-p", "tsconfig.json"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tsc.returncode == 0, tsc.stdout + tsc.stderr
    env = {**os.environ, **stack.environment()}
    tests = subprocess.run(
        ["node", "--test", "dist/test/client.test.js"], cwd=work, capture_output=True, text=True, env=env, timeout=300
    )
    print(tests.stdout)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "# pass 3" in tests.stdout and "# fail 0" in tests.stdout
    example = subprocess.run(
        ["node", "dist/test/readme.example.js"],
        cwd=work,
        capture_output=True,
        text=True,
        env={**env, "MEMORYCTL_TOKEN": stack.agent_token},
        timeout=120,
    )
    assert example.returncode == 0, example.stderr
    print(example.stdout)  # the example as run (the closing note)
    lines = example.stdout.splitlines()
    assert lines[0].startswith("added ") and "rollback of 4.2" in lines[1] and lines[-1] == "still found: false"
