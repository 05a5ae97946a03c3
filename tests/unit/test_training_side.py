"""memoryctl finds its training side (memoryctl-lora) through the entry point memoryctl-lora
declares, never by importing it (memoryctl/maintenance/training.py; tests/unit/test_import_graph.py
holds the "never"). The lookup takes the entry points as an argument, so each way it can go is
tried here with real entry points (importlib.metadata.EntryPoint, loaded for real); one test reads
the metadata this environment has installed, the way `memoryctl nightly` does."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest

from memoryctl.errors import ConfigError
from memoryctl.maintenance.training import GROUP, Training, training_side

ROOT = Path(__file__).resolve().parents[2]


def declared() -> list[EntryPoint]:
    """The group's entry points as lora/pyproject.toml declares them."""
    project = tomllib.loads((ROOT / "lora" / "pyproject.toml").read_text())["project"]
    return [EntryPoint(name, value, GROUP) for name, value in project["entry-points"][GROUP].items()]


def test_memoryctl_lora_declares_one_training_side_and_it_is_what_memoryctl_needs() -> None:
    points = declared()
    assert [p.value for p in points] == ["memoryctl_lora.night:LoraTraining"]
    side = training_side(points)
    assert isinstance(side, Training) and type(side).__module__ == "memoryctl_lora.night"


def test_the_installed_memoryctl_lora_declares_the_entry_point() -> None:
    """What the nightly reads: the installed distributions' metadata. An editable install registers
    its entry points when it is installed, so an install older than lora/pyproject.toml's entry
    point lacks it: scripts/bootstrap installs again whenever that file changes."""
    installed = sorted(p.value for p in entry_points(group=GROUP))
    assert installed == [p.value for p in declared()], (
        f"the installed memoryctl-lora declares {installed or 'no'} {GROUP!r} entry point: run scripts/bootstrap"
    )
    assert isinstance(training_side(), Training)


def test_memoryctl_lora_importable_but_installed_before_its_entry_point_is_said_so() -> None:
    with pytest.raises(ConfigError) as caught:
        training_side([])
    assert f"declares no {GROUP!r} entry point" in caught.value.message
    assert "pip install -e ./lora" in (caught.value.hint or "") and "scripts/bootstrap" in (caught.value.hint or "")


def test_two_training_sides_are_refused_by_name() -> None:
    second = EntryPoint("other", "memoryctl_lora.night:LoraTraining", GROUP)
    with pytest.raises(ConfigError, match="more than one training side"):
        training_side([*declared(), second])


def test_an_entry_point_that_is_no_training_side_is_refused() -> None:
    """A memoryctl-lora of another version (they are released in lockstep) would not fit."""
    with pytest.raises(ConfigError, match="does not provide what this memoryctl needs") as caught:
        training_side([EntryPoint("lora", "pathlib:PurePath", GROUP)])
    assert "same version" in (caught.value.hint or "")


@pytest.mark.parametrize("points", ["declared", "none"])
def test_without_memoryctl_lora_every_way_ends_in_the_install_hint(points: str) -> None:
    """The db node runs memoryctl without memoryctl-lora: metadata left behind that names a package
    no longer there, or no metadata at all — one message, the one `memoryctl adapters` and a night's
    training step have always given there (the step records it and the night goes on)."""
    code = f"""
        import sys
        from importlib.metadata import EntryPoint
        sys.modules["memoryctl_lora"] = None  # `import memoryctl_lora` now fails as if not installed
        from memoryctl.maintenance.nightly import NightlyReport, _step
        from memoryctl.maintenance.training import training_side
        points = {[(p.name, p.value) for p in declared()] if points == "declared" else []!r}
        report = NightlyReport()
        _step(report, "generation", lambda: training_side([EntryPoint(n, v, "{GROUP}") for n, v in points]))
        step = report.steps[0].as_dict()
        del step["seconds"]
        print(repr(step))
    """
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert ast.literal_eval(r.stdout) == (
        {
            "name": "generation",
            "status": "failed",
            "error": "LoRA adapters are trained and kept where the nightly trains, and memoryctl-lora is not"
            " installed here",
            "hint": "run this on the node that trains (the GPU node in the cluster), or install the memoryctl-lora"
            " distribution (torch, peft, transformers): pip install -e ./lora",
        }
    ), r.stdout
