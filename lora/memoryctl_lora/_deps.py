"""Lazy access to the training stack (torch, transformers, peft).

``import memoryctl_lora`` must work before torch is imported: the registry and the adapter
serving need no torch at all, and ``memoryctl nightly`` reaches them on every night. Only a code
path that actually trains or runs a model calls :func:`require_torch`, and a missing package
becomes one ConfigError that names the fix instead of an ImportError traceback from deep inside a
training step.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from memoryctl.adapter_files import LORA_INSTALL_HINT as LORA_INSTALL_HINT
from memoryctl.errors import ConfigError

# The distribution declares these packages, so on a proper install they are there; the hint is for
# a half-installed one (``pip install --no-deps``, a broken wheelhouse).


def require(module: str) -> ModuleType:
    """Import ``module`` or raise ConfigError with the install hint."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - exercised only on installs without the extra
        raise ConfigError(
            f"LoRA training needs the optional package {module!r}, which is not installed ({exc})",
            hint=LORA_INSTALL_HINT,
        ) from exc


def require_torch() -> ModuleType:
    """Check the whole training stack at once so a half-installed extra fails before any work."""
    for name in ("transformers", "peft", "safetensors"):
        require(name)
    return require("torch")


def torch_available() -> bool:
    """True when the training stack is importable; tests use it to skip cleanly."""
    try:
        require_torch()
    except ConfigError:
        return False
    return True
