"""The terminal trend of `memoryctl stats`: bars on one scale, a zero axis for signed series."""

from __future__ import annotations

from memoryctl.cli.chart import BAR_WIDTH, bars, sparkline


def test_bars_share_one_scale_and_resolve_eighths() -> None:
    got = bars([0, 5, 10, None], width=10)
    assert all(len(b) == 10 for b in got)
    assert got[0].strip() == "" and got[3].strip() == ""  # zero and no data: empty
    assert got[2] == "█" * 10 and got[1] == "█" * 5 + " " * 5
    assert bars([1, 8], width=1)[0] == "▏"  # 1/8 of one cell


def test_signed_series_grow_from_a_zero_axis() -> None:
    neg, pos, none = bars([-0.4, 0.4, None], width=BAR_WIDTH)
    axis = neg.index("│")
    assert axis == pos.index("│") == none.index("│")
    assert neg[:axis].rstrip("█").strip() == "" and neg[axis - 1] == "█" and neg[axis + 1 :].strip() == ""
    assert pos[axis + 1] == "█" and pos[:axis].strip() == ""
    assert neg[:axis].count("█") == pos[axis + 1 :].count("█")  # mirror images


def test_sparkline_maps_lowest_to_highest() -> None:
    assert sparkline([1, 2, None, 3]) == "▁▅ █"
    assert sparkline([2, 2]) == "▁▁" and sparkline([None]) == " "
