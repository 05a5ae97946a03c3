"""Terminal charts for trends: a bar per row and a one-line sparkline.

Why bars drawn with block characters instead of a plotting library: the trend has to be readable
in the place `memoryctl stats` is run (an SSH session, a cron mail, a CI log), next to the exact
numbers. Eighth-block characters give 8 steps per cell, so a 20-cell bar resolves 160 levels. A
series that crosses zero (a sentiment average) is drawn from a zero axis, so the sign is visible.
"""

from __future__ import annotations

from collections.abc import Sequence

_EIGHTHS = " ▏▎▍▌▋▊▉█"
_SPARKS = "▁▂▃▄▅▆▇█"
BAR_WIDTH = 20


def _blocks(fraction: float, width: int) -> str:
    """``fraction`` (0..1) of ``width`` cells, left-aligned, in eighth-block steps."""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    return ("█" * full + (_EIGHTHS[rest] if rest else "")).ljust(width)


def bars(values: Sequence[float | None], width: int = BAR_WIDTH) -> list[str]:
    """One bar per value, on one scale for the whole series; None (no data) is a blank bar.

    All values >= 0: bars grow from the left edge. Any value < 0: half the width on each side of a
    ``│`` axis, negative values growing leftwards, so -0.4 and +0.4 read as mirror images.
    """
    known = [v for v in values if v is not None]
    if not known:
        return [" " * width for _ in values]
    if min(known) >= 0:
        top = max(known) or 1.0
        return [" " * width if v is None else _blocks(v / top, width) for v in values]
    half = (width - 1) // 2
    reach = max(abs(v) for v in known) or 1.0
    out = []
    for v in values:
        if v is None:
            out.append(" " * half + "│" + " " * half)
        elif v < 0:  # whole cells: there are no right-aligned eighth blocks to end a leftward bar
            out.append(("█" * round(-v / reach * half)).rjust(half) + "│" + " " * half)
        else:
            out.append(" " * half + "│" + _blocks(v / reach, half))
    return out


def sparkline(values: Sequence[float | None]) -> str:
    """The whole series on one line, lowest to highest value mapped to ▁..█ (None: a space)."""
    known = [v for v in values if v is not None]
    if not known:
        return " " * len(values)
    lo, hi = min(known), max(known)
    span = hi - lo
    return "".join(
        " " if v is None else _SPARKS[0 if span == 0 else round((v - lo) / span * (len(_SPARKS) - 1))] for v in values
    )
