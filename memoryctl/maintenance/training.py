"""The training side of the nightly and of ``memoryctl adapters``, found through an entry point.

Training, merging and serving LoRA adapters need torch, peft and transformers, which are the
``memoryctl-lora`` distribution's dependencies (``lora/`` in the repository), never the core's. So
the two distributions depend one way: memoryctl-lora imports memoryctl, and memoryctl never imports
memoryctl-lora (tests/unit/test_import_graph.py holds that). memoryctl declares here what it needs
(:class:`Training`); memoryctl-lora implements it (``memoryctl_lora.night``) and says so in its
package metadata, an entry point of the group :data:`GROUP` (lora/pyproject.toml), which
:func:`training_side` looks up. Where memoryctl-lora is not installed (the db node, every client),
every path to training ends in the same ConfigError naming the node that trains and the install.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from memoryctl.adapter_files import LORA_INSTALL_HINT
from memoryctl.config import Settings
from memoryctl.errors import ConfigError
from memoryctl.maintenance.needs import MaintenanceStack

GROUP = "memoryctl.training"  # the entry-point group memoryctl-lora declares its Training in
# The training distribution's import name, only to tell "not installed" from "installed before it
# declared the entry point" (located, never imported: importlib.util.find_spec).
TRAINING_PACKAGE = "memoryctl_lora"

AdapterKind = Literal["embedding", "generation"]


@dataclass(frozen=True, slots=True)
class Window:
    """The night's data window: from the last successful night (None: all history) to now."""

    since: datetime | None
    until: datetime


@dataclass(slots=True)
class Trained:
    """A training step as the night records it: ``status`` ok | skipped | rejected | failed, the
    ``detail`` for the run record, and whether the served embedding model changed (``swapped``: the
    night's later steps embed with the new one)."""

    status: str
    detail: dict[str, Any] = field(default_factory=dict)
    swapped: bool = False


@runtime_checkable
class Training(Protocol):
    """What memoryctl asks of the training side. Each call may raise MemoryctlError (the night
    records it as the step's failure; ``memoryctl adapters`` prints it)."""

    def embedding(self, stack: MaintenanceStack, window: Window, workdir: Path) -> Trained:
        """The nightly's embedding step once it is known to apply (enabled, an embedder that takes
        an adapter): train, gate, register, serve (merge onto an idle slot or MiniLM's adapter),
        ``migrate`` the vectors, set active."""
        ...

    def generation(self, stack: MaintenanceStack, window: Window, workdir: Path) -> Trained:
        """The nightly's generation step once configured: train, gate, register, hot-swap into vLLM."""
        ...

    def prune_merged(self, settings: Settings, root: Path, keep: Mapping[str, str]) -> dict[str, Any]:
        """Remove the merged embedding versions under ``root`` not in ``keep`` (served name → why
        kept), with their registry entries; ``{"removed": [...], "kept": [...]}``."""
        ...

    def adapters(self, settings: Settings, kind: AdapterKind) -> list[dict[str, Any]]:
        """Every registered version of ``kind``, oldest first, the served one marked ``active``."""
        ...

    def roll_back_generation(self, settings: Settings) -> str:
        """Serve the previous generation adapter again (or the bare base model); what is served, in words."""
        ...

    def serve_active_generation(self, settings: Settings, *, wait: bool, night_running: Callable[[], bool]) -> str:
        """Load the active generation adapter into vLLM when it does not list it; what was done, in words."""
        ...

    def follow_active_embedding(self, stack: MaintenanceStack, *, reason: str) -> dict[str, Any]:
        """Make the registry's active embedding adapter the one in the collection now aliased."""
        ...


def not_installed() -> ConfigError:
    return ConfigError(
        "LoRA adapters are trained and kept where the nightly trains, and memoryctl-lora is not installed here",
        hint=f"run this on the node that trains (the GPU node in the cluster), or {LORA_INSTALL_HINT}",
    )


def training_side(found: Iterable[EntryPoint] | None = None) -> Training:
    """The installed training side (``found``: the group's entry points, read from the installed
    distributions' metadata unless given). A ConfigError that names the fix where there is none, or
    where memoryctl-lora is importable but its installed metadata predates the entry point (an
    editable install registers entry points when it is installed, not when pyproject.toml changes)."""
    points = list(entry_points(group=GROUP) if found is None else found)
    if not points:
        if importlib.util.find_spec(TRAINING_PACKAGE) is not None:
            raise ConfigError(
                f"memoryctl-lora is importable here but its installed metadata declares no {GROUP!r} entry"
                " point (it was installed before it declared one), so memoryctl cannot find its training side",
                hint="install it again: `pip install -e ./lora` (scripts/bootstrap does; a node: its wheel)",
            )
        raise not_installed()
    if len(points) > 1:
        raise ConfigError(
            f"more than one training side is installed ({', '.join(sorted(p.value for p in points))})",
            hint=f"keep one distribution declaring the {GROUP!r} entry point (pip list; pip uninstall the other)",
        )
    point = points[0]
    try:
        factory = point.load()
    except ImportError as exc:
        # The metadata is there but the package is not (removed by hand, or hidden): not installed.
        # An ImportError of one of its own dependencies is a broken install: shown as it is.
        if (exc.name or "").split(".")[0] != point.module.split(".")[0]:
            raise
        raise not_installed() from None
    side = factory()
    if not isinstance(side, Training):
        raise ConfigError(
            f"the {GROUP!r} entry point {point.value} does not provide what this memoryctl needs",
            hint="install memoryctl-lora of the same version as memoryctl (both are built from one commit)",
        )
    return side
