"""Output helpers: JSON for machines on stdout, rich for people, messages on stderr.

The rich consoles are built on first use: importing rich costs ~100 ms, which ``--help``,
``--json`` output and commands answered by ``memoryctl serve`` need not pay.

Nothing printed is read as console markup: both consoles are made with ``markup=False``, so a
memory whose text is ``only [/] here`` or ``Eve said [red]hello[/red]`` prints as written, in
every table cell, title and tree label, whatever the call site passes (issue 22, item 8). Style
comes from rich objects (``Text`` with a style), never from brackets inside a string.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from memoryctl.serve.wire import json_default

if TYPE_CHECKING:
    from rich.console import Console

    from memoryctl.operations.reply import Reply


class _LazyConsole:
    """Stands in for a ``rich.console.Console`` and builds it when first used."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return getattr(self._console, name)


# Piped output (no terminal) would default to 80 columns; tables of memories need more.
out = cast("Console", _LazyConsole(markup=False, width=None if sys.stdout.isatty() else 140))
err = cast("Console", _LazyConsole(markup=False, stderr=True, soft_wrap=True))


def to_json(data: Any) -> str:
    return json.dumps(data, default=json_default, ensure_ascii=False, indent=2)


def print_json(data: Any) -> None:
    sys.stdout.write(to_json(data) + "\n")
    sys.stdout.flush()


def warn(message: str) -> None:
    from rich.text import Text

    err.print(Text.assemble(("warning:", "yellow"), f" {message}"), highlight=False)


def emit(reply: Reply, as_json: bool, human: Callable[[Any], None]) -> int:
    """Print a shared operation's reply -- the same whether the service or this process ran it:
    its ``--json`` document or the human rendering of that document, then its warnings on stderr.
    Returns the exit code."""
    if as_json:
        print_json(reply.data)
    else:
        human(reply.data)
    for line in reply.warnings:
        err.print(line, markup=False, highlight=False)
    return reply.exit_code
