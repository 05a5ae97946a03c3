"""What an operation answers, whatever surface asked: ``Reply``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memoryctl.errors import ExitCode


@dataclass(slots=True)
class Reply:
    """What a command prints: ``data`` (its ``--json`` document), its exit code, its stderr lines."""

    data: Any
    exit_code: int = int(ExitCode.OK)
    warnings: list[str] = field(default_factory=list)
