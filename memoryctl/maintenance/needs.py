"""What the maintenance operations need from the composition root, declared here.

``memoryctl.stack.Stack`` provides it; the operations take anything of this shape, so they do not
import the stack (which imports ``maintenance.models`` to pick the active embedder: the other direction).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from memoryctl.config import Settings
from memoryctl.stores.events import EventLog
from memoryctl.stores.pg import Pool
from memoryctl.stores.protocols import OpenedStores, VectorStore
from memoryctl.stores.records import RunLog

if TYPE_CHECKING:
    from memoryctl.embed import Embedder


class MaintenanceStack(OpenedStores, Protocol):
    """The stack as the maintenance jobs see it: the opened stores, and besides them the settings,
    PostgreSQL's pool, the run log and event log, and the embedder (reloaded after a migration)."""

    settings: Settings

    @property
    def pool(self) -> Pool: ...

    @property
    def runs(self) -> RunLog: ...

    @property
    def events(self) -> EventLog: ...

    @property
    def embedder(self) -> Embedder: ...

    def reload_embedder(self) -> None: ...

    def require_vectors(self) -> VectorStore: ...
