"""lora/ is the memoryctl-lora distribution (import name memoryctl_lora), not a second path to our code.

The repository's layout names lora/ as a top-level folder. Python would make that folder an empty
PEP 420 namespace from the repository root, and the package reachable a second time as
``lora.memoryctl_lora`` (a second copy of every module); lora/__init__.py turns ``import lora`` into
an error that names the right import. memoryctl-lora is released in lockstep with memoryctl (it uses
memoryctl's internals), so it pins the exact version of the same commit.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import memoryctl

ROOT = Path(__file__).resolve().parents[2]
TRAINING_STACK = ("torch", "peft", "transformers", "sentence-transformers", "safetensors")


def _from_root(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def _requirement_names(reqs: list[str]) -> set[str]:
    return {r.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower() for r in reqs}


@pytest.mark.parametrize("statement", ["import lora", "import lora.cycle", "import lora.memoryctl_lora"])
def test_nothing_imports_as_lora_from_the_root(statement: str) -> None:
    r = _from_root(statement)
    assert r.returncode != 0
    assert "ImportError: lora/ is the memoryctl-lora distribution, not a module: import memoryctl_lora" in r.stderr


def test_the_distribution_ships_memoryctl_lora_only() -> None:
    """lora/__init__.py sits beside the package, not in it: the wheel's package list excludes it."""
    lora = tomllib.loads((ROOT / "lora" / "pyproject.toml").read_text())
    assert lora["tool"]["setuptools"]["packages"]["find"]["include"] == ["memoryctl_lora", "memoryctl_lora.*"]


def test_memoryctl_lora_is_its_own_distribution_pinned_to_this_memoryctl() -> None:
    lora = tomllib.loads((ROOT / "lora" / "pyproject.toml").read_text())["project"]
    core = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert lora["name"] == "memoryctl-lora"
    assert lora["version"] == core["version"] == memoryctl.__version__
    assert f"memoryctl=={core['version']}" in lora["dependencies"]
    assert set(TRAINING_STACK) <= _requirement_names(lora["dependencies"])


def test_the_core_install_is_torch_free() -> None:
    """What ``pip install memoryctl`` declares (the dev extra's xgrammar may bring torch: tests only)."""
    core = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _requirement_names(core["dependencies"])
    assert not declared & set(TRAINING_STACK), declared & set(TRAINING_STACK)
    extras = set().union(*(_requirement_names(e) for e in core.get("optional-dependencies", {}).values()))
    assert "memoryctl-lora" not in extras  # on no index: an extra would make pip ask PyPI for the name


def test_the_installed_memoryctl_lora_is_this_checkout() -> None:
    import memoryctl_lora

    assert Path(memoryctl_lora.__file__).resolve().parent == ROOT / "lora" / "memoryctl_lora"


def test_where_memoryctl_lora_is_not_installed_the_adapter_registry_names_the_fix(tmp_path: Path) -> None:
    """The db node runs memoryctl without memoryctl-lora: its adapters command and a nightly that
    would train there say where training runs instead of failing on an import."""
    r = _from_root(f"""
        import sys
        sys.modules["memoryctl_lora"] = None  # `import memoryctl_lora` now fails as if not installed
        from memoryctl.config import Settings
        from memoryctl.errors import ConfigError
        from memoryctl.maintenance.adapters import list_adapters
        try:
            list_adapters(Settings(data_dir={str(tmp_path)!r}), "generation")
        except ConfigError as exc:
            print(exc.message)
            print(exc.hint)
    """)
    assert r.returncode == 0, r.stderr
    assert "memoryctl-lora is not installed here" in r.stdout and "pip install -e ./lora" in r.stdout
