"""Progress bars on stderr, only when it is a terminal: never in ``--json`` output, pipes or cron logs.

rich's widgets are imported when a bar is shown: every other command's start-up would pay for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from memoryctl.cli.output import err

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

REDRAW_EVERY = 500  # items between redraws: the cost stays negligible at 100k ids/s


def _progress() -> Progress:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )


@contextmanager
def progress_bar(enabled: bool, label: str, total: int | None) -> Iterator[Callable[[int], None] | None]:
    """One bar; yields ``advance(n)``, or None when no bar is shown."""
    if not enabled or not err.is_terminal:
        yield None
        return
    with _progress() as progress:
        task = progress.add_task(label, total=total)
        pending = 0

        def advance(n: int) -> None:
            nonlocal pending
            pending += n
            if pending >= REDRAW_EVERY:
                progress.advance(task, pending)
                pending = 0

        yield advance


@contextmanager
def phase_bars(enabled: bool) -> Iterator[Callable[[str, int, int | None], None] | None]:
    """One bar per phase of a long run; yields ``report(phase, advance, total_at_start)``."""
    if not enabled or not err.is_terminal:
        yield None
        return
    with _progress() as progress:
        tasks: dict[str, TaskID] = {}

        def report(phase: str, advance: int, total: int | None) -> None:
            if phase not in tasks:
                tasks[phase] = progress.add_task(phase, total=total, completed=advance)
            else:
                progress.advance(tasks[phase], advance)

        yield report
