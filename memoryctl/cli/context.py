"""Per-invocation state shared by the commands: options from the top level, one lazy client."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from memoryctl.model import validate_agent_id

if TYPE_CHECKING:  # imported when first used: start-up cost of every command
    from memoryctl.client import MemoryClient
    from memoryctl.config import Settings
    from memoryctl.serve.client import ServiceClient
    from memoryctl.serve.operations import Progress
    from memoryctl.serve.wire import Reply

_UNSET = object()


@dataclass
class Ctx:
    config_path: Path | None = None
    profile: str | None = None
    _settings: Settings | None = None
    _client: MemoryClient | None = field(default=None, repr=False)
    _service: object = field(default=_UNSET, repr=False)  # ServiceClient | None once looked up

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

    @property
    def service(self) -> ServiceClient | None:
        """The running ``memoryctl serve`` to call, or None to work in-process."""
        if self._service is _UNSET:
            from memoryctl.serve.client import discover

            self._service = discover(self.settings)
        return self._service  # type: ignore[return-value]

    def call(
        self,
        operation: str,
        flags: Mapping[str, Any],
        *,
        upload: Path | None = None,
        progress: Progress | None = None,
    ) -> Reply:
        """Run one shared operation: through the service when one answers, else in this process.

        Both paths run ``memoryctl.serve.operations``; the caller prints the reply the same way.
        A flag whose value is None was not given.
        """
        params = {k: v for k, v in flags.items() if v is not None}
        service = self.service
        if service is not None:
            reply = service.call(operation, params, upload=upload)
            if reply is not None:
                return reply
        from memoryctl.serve.operations import run

        return run(self.client, operation, params, upload=upload, progress=progress)

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
