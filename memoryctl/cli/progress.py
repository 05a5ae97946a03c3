"""Progress bars on stderr, only when it is a terminal: never in ``--json`` output, pipes or cron logs.

An operation reports ``progress(phase, advance, total)`` (``memoryctl.operations.Progress``); each
phase gets its bar. Only an operation run in this process reports progress (the service does not
stream it). rich's widgets are imported when a bar is shown: every other command's start-up would
pay for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from memoryctl.cli.output import err

if TYPE_CHECKING:
    from rich.progress import TaskID

    from memoryctl.operations import Progress

REDRAW_EVERY = 500  # items between redraws: the cost stays negligible at 100k ids/s


@contextmanager
def phase_bars(enabled: bool) -> Iterator[Progress | None]:
    """One bar per phase of a run; yields ``report(phase, advance, total)``, or None for no bars."""
    if not enabled or not err.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        tasks: dict[str, TaskID] = {}
        pending: dict[str, int] = {}

        def report(phase: str, advance: int, total: int | None) -> None:
            if phase not in tasks:
                tasks[phase] = progress.add_task(phase, total=total, completed=advance)
                pending[phase] = 0
                return
            pending[phase] += advance
            if pending[phase] >= REDRAW_EVERY:
                progress.advance(tasks[phase], pending[phase])
                pending[phase] = 0

        yield report
