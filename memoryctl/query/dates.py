"""The dates a question names, as time windows, and how close a memory's time is to them.

"Who did Maria have dinner with on May 3, 2023?", "What did Nate organise in June 2022?", "What
happened last week?": a question that names a time asks about what was said then. The memory of
it was written at that time or soon after (people tell what happened after it happened), so a
memory's ``created_at`` near the named time is evidence that it is the one asked about. The
engine uses it as a soft preference among the candidates the text legs found
(``fusion.with_preference``), never as a filter: a question's date can be wrong or loose ("the
week before August 3"), and a memory from another time that answers the words still ranks.

Recognised (English, the language of the question words the lexical leg keeps too):

- a day: ``May 3, 2023``, ``3 May 2023``, ``3rd of May, 2023``, ``2023-05-03``;
- a month: ``May 2023``, ``in May, 2023``; a year: ``in 2023``, ``2023``;
- without a year, ``May 3`` / ``3 May`` / ``in May``: that day or month in any year (the
  memories' own years decide which one is meant);
- relative to the time of the question (``now``): ``today``, ``yesterday``, ``this/last
  week|month|year``, ``last weekend``, ``N days|weeks|months|years ago``.

Closeness is 1 inside a window and halves with every window length (at least a day) outside it:
a day named leaves a memory of the next day at 0.5, of a week later at 1/128; a month named
leaves the first days of the next month near 1. No constant depends on a data set.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

MONTHS = {name.lower(): n for n, name in enumerate(calendar.month_name) if name}
MONTHS |= {name.lower(): n for n, name in enumerate(calendar.month_abbr) if name and name.lower() != "may"}
_MONTH = r"(?P<month>" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
_UNITS = {"day": 1, "week": 7, "month": 30, "year": 365}
_I = re.IGNORECASE

# Most specific first; a span of the question that one pattern read is not read again by another.
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("iso", re.compile(r"\b(?P<year>(?:19|20)\d\d)-(?P<month>[01]\d)-(?P<day>[0-3]\d)\b")),
    ("day", re.compile(rf"\b{_MONTH}\s+{_DAY}\s*,?\s*{_YEAR}\b", re.IGNORECASE)),
    ("day", re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}\s*,?\s*{_YEAR}\b", re.IGNORECASE)),
    ("month", re.compile(rf"\b{_MONTH}\s*,?\s*{_YEAR}\b", re.IGNORECASE)),
    ("any-day", re.compile(rf"\b{_MONTH}\s+{_DAY}\b(?!\s*:)", re.IGNORECASE)),
    ("any-day", re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}\b", re.IGNORECASE)),
    # A month alone only after a preposition of time: "may" is also a verb.
    ("any-month", re.compile(rf"\b(?:in|during|since|until|before|after|by|early|late|mid|of)\s+{_MONTH}\b", _I)),
    ("year", re.compile(rf"\b{_YEAR}\b")),
    (
        "relative",
        re.compile(r"\b(?P<rel>today|yesterday|(?:this|last|past|previous)\s+(?:week(?:end)?|month|year))\b", _I),
    ),
    ("ago", re.compile(r"\b(?P<n>\d+|a|an|one|two|three|four|five|six)\s+(?P<unit>day|week|month|year)s?\s+ago\b", _I)),
]


@dataclass(frozen=True, slots=True)
class Window:
    """``[start, end)``; ``yearly``: the same days in every year (a date named without its year)."""

    start: datetime
    end: datetime
    yearly: bool = False

    @property
    def length(self) -> timedelta:
        return max(self.end - self.start, timedelta(days=1))

    def distance(self, at: datetime) -> timedelta:
        """How far ``at`` lies outside the window (zero inside it)."""
        if self.yearly:
            return min(_shifted(self, year).distance(at) for year in (at.year - 1, at.year, at.year + 1))
        if at < self.start:
            return self.start - at
        if at >= self.end:
            return at - self.end
        return timedelta(0)


def _shifted(w: Window, year: int) -> Window:
    start = _replace_year(w.start, year)
    return Window(start, start + (w.end - w.start))


def _replace_year(at: datetime, year: int) -> datetime:
    try:
        return at.replace(year=year)
    except ValueError:  # 29 February in another year
        return at.replace(year=year, day=28)


def _month_window(year: int, month: int) -> Window:
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=UTC)
    return Window(start, end)


def _read(kind: str, m: re.Match[str], now: datetime | None) -> Window | None:
    g = m.groupdict()
    month = int(g["month"]) if kind == "iso" else MONTHS.get((g.get("month") or "").lower().rstrip("."), 0)
    try:
        if kind in ("iso", "day"):
            start = datetime(int(g["year"]), month, int(g["day"]), tzinfo=UTC)
            return Window(start, start + timedelta(days=1))
        if kind == "month":
            return _month_window(int(g["year"]), month)
        if kind == "any-day":  # a leap year, so that 29 February is a day too; the year is any
            start = datetime(2000, month, int(g["day"]), tzinfo=UTC)
            return Window(start, start + timedelta(days=1), yearly=True)
        if kind == "any-month":
            w = _month_window(2000, month)
            return Window(w.start, w.end, yearly=True)
    except ValueError:  # 31 June, month 13: not a date
        return None
    if kind == "year":
        year = int(g["year"])
        return Window(datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC))
    if now is None:  # relative to nothing known
        return None
    today = datetime(now.year, now.month, now.day, tzinfo=UTC)
    if kind == "ago":
        n = int(g["n"]) if g["n"].isdigit() else _NUMBER_WORDS[g["n"].lower()]
        unit = timedelta(days=_UNITS[g["unit"].lower()])
        return Window(today - n * unit, today - n * unit + unit)
    rel = " ".join(g["rel"].lower().split())
    if rel == "today":
        return Window(today, today + timedelta(days=1))
    if rel == "yesterday":
        return Window(today - timedelta(days=1), today)
    span = rel.split()[1]
    if span == "weekend":
        saturday = today - timedelta(days=(today.weekday() - 5) % 7 or 7)
        return Window(saturday, saturday + timedelta(days=2))
    days = _UNITS[span]
    this = rel.startswith("this")
    return Window(today - timedelta(days=0 if this else days), today + timedelta(days=1) if this else today)


def _spans(text: str, now: datetime | None) -> list[tuple[Window, tuple[int, int]]]:
    """Each time window ``text`` names and where it says it, most specific reading of each span first."""
    found: list[tuple[Window, tuple[int, int]]] = []
    for kind, pattern in _PATTERNS:
        for m in pattern.finditer(text):
            if any(m.start() < e and s < m.end() for _, (s, e) in found):
                continue
            w = _read(kind, m, now)
            if w is not None:
                found.append((w, m.span()))
    return found


def windows(text: str, now: datetime | None) -> list[Window]:
    """The time windows ``text`` names; relative ones ("last week") only when ``now`` is known."""
    return [w for w, _ in _spans(text, now)]


def closeness(at: datetime, named: Sequence[Window]) -> float:
    """1 inside one of the windows, halving with every window length outside (the nearest counts)."""
    return max((0.5 ** (w.distance(at) / w.length) for w in named), default=0.0)


def scope(named: Sequence[Window]) -> tuple[datetime, datetime] | None:
    """Where a time-scoped second search looks: the named windows' hull, widened by each window's
    length on both sides (where ``closeness`` is at least 0.5: the day named and the days either
    side of it, the month named and its neighbours); None when every window is a date without its
    year (no single range holds "May 3" of every year).

    Why a second search: the preference reorders only the candidates the text legs return, and
    they rank by words and meaning alone, so the turns written at the named time sit below the
    text's top candidates ("What did Maria do on May 3, 2023?" shares few words with what she did).
    The same legs asked again within the time hand the preference that time's best matches however
    low the whole scope ranks them, with no depth constant to tune to a data set.
    """
    dated = [w for w in named if not w.yearly]
    if not dated:
        return None
    return min(w.start - w.length for w in dated), max(w.end + w.length for w in dated)
