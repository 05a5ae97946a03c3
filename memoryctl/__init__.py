"""memoryctl: one query interface and the ops CLI for a self-hosted agent memory stack."""

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

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "EntityRef",
    "ExitCode",
    "InputError",
    "Memory",
    "MemoryRef",
    "MemoryctlError",
    "NotFoundError",
    "PartialFailure",
    "Relation",
    "StoreError",
    "StoreUnavailable",
    "UsageError",
    "__version__",
]
