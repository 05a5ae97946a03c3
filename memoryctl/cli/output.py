"""Output helpers: JSON for machines on stdout, rich for people, messages on stderr."""

from __future__ import annotations

import json
import sys
import uuid
from datetime import datetime
from typing import Any

from rich.console import Console

# Piped output (no terminal) would default to 80 columns; tables of memories need more.
out = Console(width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True, soft_wrap=True)


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def to_json(data: Any) -> str:
    return json.dumps(data, default=_default, ensure_ascii=False, indent=2)


def print_json(data: Any) -> None:
    sys.stdout.write(to_json(data) + "\n")
    sys.stdout.flush()


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/] {message}", highlight=False, markup=True)
