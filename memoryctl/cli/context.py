"""Per-invocation state shared by the commands: options from the top level, one lazy client."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from memoryctl.model import validate_agent_id

if TYPE_CHECKING:  # imported when first used: start-up cost of every command
    from memoryctl.client import MemoryClient
    from memoryctl.config import Settings


@dataclass
class Ctx:
    config_path: Path | None = None
    profile: str | None = None
    _settings: Settings | None = None
    _client: MemoryClient | None = field(default=None, repr=False)

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            from memoryctl.config import load_settings

            self._settings = load_settings(self.config_path, profile=self.profile)
        return self._settings

    @property
    def client(self) -> MemoryClient:
        if self._client is None:
            from memoryctl.client import MemoryClient

            self._client = MemoryClient(self.settings)
        return self._client

    def agent(self, agent: str | None) -> str:
        return validate_agent_id(agent) if agent else self.settings.default_agent

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def ctx_of(typer_ctx: typer.Context) -> Ctx:
    obj = typer_ctx.find_root().obj
    assert isinstance(obj, Ctx)
    return obj
