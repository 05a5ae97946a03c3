"""What the maintenance operations need from the composition root, declared here.

``memoryctl.stack.Stack`` provides it; the operations take anything of this shape, so they do not
import the stack (which imports ``maintenance.models`` to pick the active embedder: the other direction).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from memoryctl.config import Settings
from memoryctl.stores.events import EventLog
from memoryctl.stores.pg import Pool
from memoryctl.stores.protocols import GraphStore, VectorStore
from memoryctl.stores.records import RecordStore, RunLog

if TYPE_CHECKING:
    from memoryctl.embed import Embedder


class MaintenanceStack(Protocol):
    """The stack as the maintenance jobs see it: the settings, PostgreSQL's pool, records, run log
    and event log, the embedder (reloaded after a migration), the vector store and the graph."""

    settings: Settings
    unavailable: dict[str, str]  # store name -> why it could not be opened
    store_names: dict[str, str]  # "vector"/"graph" -> the store's name in reports

    @property
    def pool(self) -> Pool: ...

    @property
    def records(self) -> RecordStore: ...

    @property
    def runs(self) -> RunLog: ...

    @property
    def events(self) -> EventLog: ...

    @property
    def embedder(self) -> Embedder: ...

    def reload_embedder(self) -> None: ...

    def vectors(self) -> VectorStore | None: ...

    def graph(self) -> GraphStore | None: ...

    def require_vectors(self) -> VectorStore: ...
