"""The README's module map ("Where each decision lives in `memoryctl/`") is tested against the tree
(issue 43): a module or package added, moved or renamed without the map fails here.

The map's granularity: the first cell of a row names modules (``client.py``, ``query/plan.py``) or
whole directories (``write/``, ``stores/sql/``). Every ``.py`` file under ``memoryctl/`` (but
``__init__.py``) and every directory must be named, itself or through a directory named whole (a
directory whose modules are named one by one is named by them), and everything named must exist.
The second cell's ``*.py`` names (the files of a package named whole, ``nightly.py`` in
``health/``) must exist too, and an UPPER_CASE constant it names must be defined in one of the
row's modules, so that the map cannot place a constant in the wrong file.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "memoryctl"
HEADING = "Where each decision lives in `memoryctl/`:"
_TICKED = re.compile(r"`([^`]+)`")
_CONSTANT = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")


def _rows() -> list[tuple[list[str], str]]:
    """(the paths of the first cell, the second cell) per row of the map."""
    text = (ROOT / "README.md").read_text()
    assert HEADING in text, f"the README has lost its module map (the line {HEADING!r})"
    rows: list[tuple[list[str], str]] = []
    for line in text.split(HEADING, 1)[1].lstrip("\n").splitlines():
        if not line.startswith("|"):
            break
        if line.startswith(("| module", "|---")):
            continue
        first, _, second = line.strip().strip("|").partition(" | ")
        rows.append((_TICKED.findall(first), second))
    assert rows, "the module map has no rows"
    return rows


def _tree() -> tuple[set[str], set[str]]:
    """The modules (``query/plan.py``) and directories (``query/``) under memoryctl/."""
    modules, directories = set(), set()
    for path in PACKAGE.rglob("*"):
        rel = path.relative_to(PACKAGE).as_posix()
        if "__pycache__" in path.parts:
            continue
        if path.is_dir():
            directories.add(rel + "/")
        elif path.suffix == ".py" and path.name != "__init__.py":
            modules.add(rel)
    return modules, directories


def _covered(path: str, named: set[str]) -> bool:
    """``path`` is named itself or lies in a directory named whole; a directory whose modules are
    named one by one (``query/plan.py``, …) is named by them (each of them is checked itself)."""
    parts = path.rstrip("/").split("/")
    if path in named or any("/".join(parts[:n]) + "/" in named for n in range(1, len(parts))):
        return True
    return path.endswith("/") and any(n.startswith(path) for n in named)


def _defined(module: Path) -> set[str]:
    """The names a module assigns at its top level."""
    names: set[str] = set()
    for node in ast.parse(module.read_text()).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_every_named_path_exists() -> None:
    missing = [p for paths, _ in _rows() for p in paths if not (PACKAGE / p).exists()]
    assert not missing, f"the README's module map names what is not in memoryctl/: {missing}"
    not_paths = [p for paths, _ in _rows() for p in paths if not p.endswith((".py", "/"))]
    assert not not_paths, f"the map's first column names modules (x.py) or directories (x/) only: {not_paths}"


def test_every_module_and_directory_is_named() -> None:
    named = {p for paths, _ in _rows() for p in paths}
    modules, directories = _tree()
    unnamed = sorted(p for p in modules | directories if not _covered(p, named))
    assert not unnamed, f"not in the README's module map (add them to a row, or their package whole): {unnamed}"


def test_the_files_a_row_names_exist() -> None:
    missing = []
    for paths, owns in _rows():
        bases = [PACKAGE] + [PACKAGE / p for p in paths if p.endswith("/")] + [(PACKAGE / p).parent for p in paths]
        for name in _TICKED.findall(owns):
            if name.endswith(".py") and not any((base / name).is_file() for base in bases):
                missing.append(f"{name} (row {', '.join(paths)})")
    assert not missing, f"the README's module map names files that do not exist: {missing}"


def test_the_constants_a_row_names_are_defined_in_its_modules() -> None:
    wrong = []
    for paths, owns in _rows():
        files = [f for p in paths for f in ((PACKAGE / p).rglob("*.py") if p.endswith("/") else [PACKAGE / p])]
        defined = set().union(*(_defined(f) for f in files if f.is_file()))
        wrong += [
            f"{c} (row {', '.join(paths)})"
            for c in _TICKED.findall(owns)
            if _CONSTANT.fullmatch(c) and c not in defined
        ]
    assert not wrong, f"the README's module map places constants where they are not defined: {wrong}"
