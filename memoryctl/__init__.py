"""memoryctl: one query interface and the ops CLI for a self-hosted agent memory stack.

The public names below are imported on first use (PEP 562), not with the package: every
``memoryctl`` command imports this package, and the client behind these names pulls in psycopg,
pydantic and numpy, which would cost every ``--help`` and every call answered by ``memoryctl
serve`` a few hundred milliseconds of start-up.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from memoryctl._version import __version__

if TYPE_CHECKING:
    from memoryctl.client import MemoryClient
    from memoryctl.config import Settings, load_settings
    from memoryctl.errors import (
        ConfigError,
        ExitCode,
        InputError,
        MemoryctlError,
        NotFoundError,
        PartialFailure,
        StoreError,
        StoreUnavailable,
        UsageError,
    )
    from memoryctl.model import EntityRef, Memory, MemoryRef, Relation
    from memoryctl.query.results import Hit, QueryResult
    from memoryctl.query.spec import GraphFilter, MemoryQuery, Where
    from memoryctl.write.pipeline import WriteOutcome

_HOMES = {
    "memoryctl.client": ("MemoryClient",),
    "memoryctl.write.pipeline": ("WriteOutcome",),
    "memoryctl.config": ("Settings", "load_settings"),
    "memoryctl.errors": (
        "ConfigError",
        "ExitCode",
        "InputError",
        "MemoryctlError",
        "NotFoundError",
        "PartialFailure",
        "StoreError",
        "StoreUnavailable",
        "UsageError",
    ),
    "memoryctl.model": ("EntityRef", "Memory", "MemoryRef", "Relation"),
    "memoryctl.query.results": ("Hit", "QueryResult"),
    "memoryctl.query.spec": ("GraphFilter", "MemoryQuery", "Where"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> object:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'memoryctl' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ConfigError",
    "EntityRef",
    "ExitCode",
    "GraphFilter",
    "Hit",
    "InputError",
    "Memory",
    "MemoryClient",
    "MemoryQuery",
    "MemoryRef",
    "MemoryctlError",
    "NotFoundError",
    "PartialFailure",
    "QueryResult",
    "Relation",
    "Settings",
    "StoreError",
    "StoreUnavailable",
    "UsageError",
    "Where",
    "WriteOutcome",
    "__version__",
    "load_settings",
]
