"""The import graphs have no cycle: memoryctl's between modules and between its subpackages, and
deploy/'s and memoryctl-lora's between modules; and the two distributions depend one way,
memoryctl-lora on memoryctl (issue 43, item 5).

Every import counts: module level, inside functions (lazy) and under ``TYPE_CHECKING``, because a
cycle is a design fact (two parts that each need the other), whenever the import runs. Read from
the source with ``ast``, so the test imports nothing and costs a fraction of a second.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "memoryctl"
# (package folder, the folder its module names are relative to): memoryctl, the controller's
# deploy/ (run from the repository), memoryctl-lora's package (lora/ is its distribution's root).
PACKAGES = {
    "memoryctl": (PACKAGE, ROOT),
    "deploy": (ROOT / "deploy", ROOT),
    "memoryctl_lora": (ROOT / "lora" / "memoryctl_lora", ROOT / "lora"),
}
CONTROLLER_SIDE = ("wireguard", "deploy")  # top-level folders memoryctl never imports: they are not installed


def modules(package: str = "memoryctl") -> dict[str, Path]:
    """Module name -> file, for every module of ``package`` (a key of PACKAGES)."""
    folder, root = PACKAGES[package]
    found = {}
    files = [Path(d, f) for d, _, names in os.walk(folder) for f in names if f.endswith(".py")]
    for path in sorted(files):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path) -> Iterator[str]:
    """Every module name an import statement of ``name`` refers to (absolute, relative resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def graph(group: int | None = None, package: str = "memoryctl") -> dict[str, set[str]]:
    """Edges between the modules of ``package``; with ``group``, between their first ``group`` name parts."""
    known = modules(package)

    def node(name: str) -> str:
        return name if group is None else ".".join(name.split(".")[:group])

    edges: dict[str, set[str]] = {node(m): set() for m in known}
    for name, path in known.items():
        for target in imported(name, path):
            while target and target not in known:  # `from pkg import submodule` or a name in a module
                target = target.rpartition(".")[0]
            if target and node(target) != node(name):
                edges[node(name)].add(node(target))
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_cycle_between_modules() -> None:
    assert cycles(graph()) == []


def test_no_cycle_between_deploy_modules() -> None:
    """deploy/'s shared answers (who runs what, where memoryctl lives, the night's declaration) are
    pure modules below the operation modules (deploy/topology.py, layout.py, night.py, scram.py)."""
    edges = graph(package="deploy")
    assert {"deploy.etcd", "deploy.patroni", "deploy.nightly", "deploy.topology"} <= set(edges)
    assert cycles(edges) == []


def test_no_cycle_between_memoryctl_lora_modules() -> None:
    edges = graph(package="memoryctl_lora")
    assert "memoryctl_lora.train_generation" in edges
    assert cycles(edges) == []


def test_no_cycle_between_subpackages() -> None:
    """memoryctl.stack, memoryctl.maintenance, memoryctl.query, … as units: the layering the README draws."""
    edges = graph(group=2)
    assert "memoryctl.maintenance" in edges and "memoryctl.query" in edges  # the grouping is what it says
    assert cycles(edges) == []


def test_the_write_path_sits_between_the_stores_and_the_facade() -> None:
    """memoryctl.write takes what it needs from the stack through a protocol (``WriteStores``), so
    the maintenance operations (which deliver through ``write.outbox``) and the stack (which picks
    the embedder through ``maintenance``) stay below it; the query engine and the write path do not know
    each other; the facade, the operations and the service are above it."""
    edges = graph(group=2)
    above = {"memoryctl.client", "memoryctl.stack", "memoryctl.maintenance", "memoryctl.operations", "memoryctl.serve"}
    assert edges["memoryctl.write"] and not edges["memoryctl.write"] & (above | {"memoryctl.query"})
    assert "memoryctl.write" not in edges["memoryctl.query"]
    assert "memoryctl.write" in edges["memoryctl.client"] and "memoryctl.write" in edges["memoryctl.maintenance"]


def test_the_checker_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_memoryctl_imports_no_controller_side_package_by_its_folder_name() -> None:
    """wireguard/ and deploy/ run on the controller from the repository and are not installed."""
    for name, path in modules().items():
        outside = {t.split(".")[0] for t in imported(name, path)} & set(CONTROLLER_SIDE)
        assert not outside, f"{name} imports {outside}"


def test_store_adapters_take_what_they_need_not_the_settings() -> None:
    """The stack maps the configuration onto each adapter's own arguments (memoryctl/stack.py);
    an adapter that imported memoryctl.config would change whenever an unrelated setting does."""
    for name, path in modules().items():
        if name.startswith("memoryctl.stores."):
            assert "memoryctl.config" not in set(imported(name, path)), name


# memoryctl and memoryctl-lora depend one way (issue 43, item 5): memoryctl-lora (torch, peft)
# imports memoryctl; memoryctl finds the training side through the entry point memoryctl-lora
# declares (memoryctl/maintenance/training.py) and never imports it, not even inside a function.
LORA = "memoryctl_lora"


def lora_imports(path: Path) -> Iterator[int]:
    """The line of every import of memoryctl_lora in ``path``: an import statement anywhere (module
    level, inside a function, under ``if TYPE_CHECKING:``) or an ``import_module``/``__import__`` of
    a name written in the source."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        if any(n.split(".")[0] == LORA for n in names):
            yield node.lineno


def test_memoryctl_never_imports_memoryctl_lora() -> None:
    """The core install is torch-free and memoryctl-lora depends on memoryctl, not the other way."""
    found = {name: list(lora_imports(path)) for name, path in modules().items()}
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_memoryctl_lora_is_written_against_memoryctl() -> None:
    """The other direction is the one that holds: the training side takes memoryctl's stack,
    settings and protocol (the direction the test above keeps from turning round)."""
    night = set(imported("memoryctl_lora.night", modules(LORA)["memoryctl_lora.night"]))
    assert {"memoryctl.maintenance.training", "memoryctl.maintenance.needs"} <= night


def test_the_import_checker_finds_every_kind_of_import(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "import memoryctl_lora.cycle\n"
        "if TYPE_CHECKING:\n    from memoryctl_lora import registry\n"
        "def f():\n    from memoryctl_lora.serving import AdapterServing\n"
        "importlib.import_module('memoryctl_lora.night')\n"
        "__import__('memoryctl_lora')\n"
        "from memoryctl.maintenance import training\n"
        "importlib.util.find_spec('memoryctl_lora')\n"  # located, not imported
    )
    assert sorted(lora_imports(src)) == [1, 3, 5, 6, 7]
