"""Per-invocation state shared by the commands: options from the top level, one lazy client, and
how one operation runs -- through the running service when one answers, else in this process."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memoryctl.cli import params as cli_params
from memoryctl.errors import InputError

if TYPE_CHECKING:
    from memoryctl.client import MemoryClient
    from memoryctl.config import Settings
    from memoryctl.declaration.declare import Operation
    from memoryctl.operations.reply import Reply
    from memoryctl.serve.client import ServiceClient

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

    def execute(self, op: Operation, values: Mapping[str, Any]) -> int:
        """Run the command ``op`` with the command line's ``values``, print the reply; its exit code."""
        from memoryctl.cli import render
        from memoryctl.operations import runner

        params = cli_params.request(op, values)
        if op.local:
            code: int = runner(op)(self, params, values)
            return code
        upload = None
        if op.upload and params.get(op.upload) is not None:
            upload = Path(params[op.upload])
            if not upload.is_file():
                raise InputError(f"{upload} is not a readable file")
        reply = self.call(op, params, upload=upload, bars=not values.get("json"))
        return render.show(op, reply, values)

    def call(
        self, op: Operation, params: Mapping[str, Any], *, upload: Path | None = None, bars: bool = False
    ) -> Reply:
        """Run one operation: through the service when one answers, else in this process.

        Both paths run ``memoryctl.operations.run``; the caller prints the reply the same way.
        """
        service = self.service
        if service is not None:
            reply = service.call(op.name, params, upload=upload, long=op.long)
            if reply is not None:
                return reply
        from memoryctl.cli.progress import phase_bars
        from memoryctl.operations import run

        with phase_bars(bars and op.long) as progress:
            return run(self.client, op.name, params, upload=upload, progress=progress)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if isinstance(self._service, object) and hasattr(self._service, "close"):
            self._service.close()
