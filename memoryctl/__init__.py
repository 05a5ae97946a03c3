"""memoryctl: one query interface and the ops CLI for a self-hosted agent memory stack."""

from memoryctl._version import __version__
from memoryctl.client import MemoryClient, WriteOutcome
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
