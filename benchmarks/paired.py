"""Two runs of one benchmark compared question by question (issue 27): which questions a change
made better, which worse, and whether the difference is more than a few questions.

A change to the ranking moves the overall recall@10 by a few thousandths, the size of one or two
questions out of LoCoMo's 1,305 (1/1,305 = 0.0008; one multi-hop question is 1/239 = 0.004); the
tables of ``benchmarks/locomo.py`` and ``benchmarks/recall.py`` cannot tell such a change from
noise. Both benchmarks run the same questions in the same order every time, so two runs can be
paired: per question the difference of its recall@10 (AFTER - BEFORE), and per group (overall,
per category, ``--dev`` conversations against the rest) how many questions got better and worse,
how many were reordered at all (the top 10 differs) and the MRR before and after,
the mean difference with its paired standard error, and the two-sided sign test over the
questions that changed (exact binomial, ties dropped). hit@5 is compared the same way as a count
of questions that gained or lost an evidence turn in the top 5.

Input: the ``--dump FILE`` of either benchmark (``{method: [{agent, question, category,
evidence, ranked}, ...]}``). Usage::

    python benchmarks/locomo.py --methods default --dump before.json      # on main
    python benchmarks/locomo.py --methods default --dump after.json       # on the branch
    python benchmarks/paired.py before.json after.json [--method default] [--against METHOD]
        [--dev locomo-41,locomo-42,locomo-43] [--json]

``--against METHOD`` compares two methods of one dump (BEFORE's ``--method`` with AFTER's
``--against``; give the same file twice), e.g. ``default`` against ``no-context``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

K = 10
LOCOMO_DEV = ("locomo-41", "locomo-42", "locomo-43")  # benchmarks/locomo.py's DEV conversations


@dataclass(frozen=True, slots=True)
class Paired:
    """One group of paired questions: recall@10 before and after, and how the questions moved."""

    n: int
    before: float
    after: float
    better: int
    worse: int
    mean_diff: float
    paired_se: float
    sign_p: float  # two-sided exact sign test over the questions that changed (1.0 when none did)
    hit5_gained: int
    hit5_lost: int
    mrr_before: float
    mrr_after: float
    reordered: int  # questions whose top 10 differs at all (in members or order)


def recall_at(ranked: Sequence[str], evidence: Sequence[str], k: int = K) -> float:
    """The share of the evidence in the first ``k`` (0 without evidence)."""
    wanted = set(evidence)
    return len(wanted & set(ranked[:k])) / len(wanted) if wanted else 0.0


def reciprocal_rank(ranked: Sequence[str], evidence: Sequence[str], k: int = K) -> float:
    """1 / the rank of the first evidence turn in the first ``k``, 0 beyond (the benchmarks' MRR)."""
    wanted = set(evidence)
    return next((1 / r for r, i in enumerate(ranked[:k], 1) if i in wanted), 0.0)


def hit_at(ranked: Sequence[str], evidence: Sequence[str], k: int) -> bool:
    return bool(set(evidence) & set(ranked[:k]))


def sign_test(better: int, worse: int) -> float:
    """Two-sided exact binomial p of ``better`` against ``worse`` at one half; 1.0 when both are 0."""
    n = better + worse
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(better, worse) + 1)) / float(1 << n)
    return min(1.0, 2 * tail)


def pair(before: Sequence[Mapping[str, object]], after: Sequence[Mapping[str, object]]) -> Paired:
    """The paired comparison of two runs of the same questions, in the same order."""
    if len(before) != len(after):
        raise ValueError(f"the runs have {len(before)} and {len(after)} questions: not the same questions")
    diffs: list[float] = []
    gained = lost = reordered = 0
    r_before = r_after = m_before = m_after = 0.0
    for b, a in zip(before, after, strict=True):
        if (b["agent"], b["question"]) != (a["agent"], a["question"]):
            raise ValueError(f"not the same question: {b['question']!r} against {a['question']!r}")
        evidence, ranked_b, ranked_a = _strings(b["evidence"]), _strings(b["ranked"]), _strings(a["ranked"])
        rb, ra = recall_at(ranked_b, evidence), recall_at(ranked_a, evidence)
        m_before += reciprocal_rank(ranked_b, evidence)
        m_after += reciprocal_rank(ranked_a, evidence)
        reordered += ranked_b[:K] != ranked_a[:K]
        r_before += rb
        r_after += ra
        diffs.append(ra - rb)
        hb, ha = hit_at(ranked_b, evidence, 5), hit_at(ranked_a, evidence, 5)
        gained += ha and not hb
        lost += hb and not ha
    n = len(diffs)
    if n == 0:
        return Paired(0, 0.0, 0.0, 0, 0, 0.0, 0.0, 1.0, 0, 0, 0.0, 0.0, 0)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    better = sum(d > 0 for d in diffs)
    worse = sum(d < 0 for d in diffs)
    return Paired(
        n,
        round(r_before / n, 3),
        round(r_after / n, 3),
        better,
        worse,
        round(mean, 4),
        round(sd / math.sqrt(n), 4),
        round(sign_test(better, worse), 4),
        gained,
        lost,
        round(m_before / n, 3),
        round(m_after / n, 3),
        reordered,
    )


def groups(
    before: Sequence[Mapping[str, object]], after: Sequence[Mapping[str, object]], dev: Sequence[str] = ()
) -> dict[str, Paired]:
    """``overall``, then ``dev`` and ``rest`` (when some question's agent is in ``dev``), then each
    category in the order it first appears (``kind <name>`` where a category is called like one of
    those: the generator has a kind ``all``)."""
    if len(before) != len(after):
        raise ValueError(f"the runs have {len(before)} and {len(after)} questions: not the same questions")
    rows = list(zip(before, after, strict=True))

    def of(keep: list[tuple[Mapping[str, object], Mapping[str, object]]]) -> Paired:
        return pair([b for b, _ in keep], [a for _, a in keep])

    out = {"overall": of(rows)}
    if dev and any(b["agent"] in dev for b, _ in rows):
        out["dev"] = of([r for r in rows if r[0]["agent"] in dev])
        out["rest"] = of([r for r in rows if r[0]["agent"] not in dev])
    for category in dict.fromkeys(str(b["category"]) for b, _ in rows):
        name = f"kind {category}" if category in ("overall", "dev", "rest") else category
        out[name] = of([r for r in rows if r[0]["category"] == category])
    return out


def table(report: Mapping[str, Paired], title: str) -> str:
    lines = [
        title,
        f"{'group':<12} {'n':>5} {'before':>7} {'after':>7} {'better':>7} {'worse':>6} {'mean':>8} {'SE':>7}"
        f" {'sign p':>7} {'hit@5 +/-':>10} {'MRR':>13} {'reordered':>9}",
    ]
    for name, p in report.items():
        lines.append(
            f"{name:<12} {p.n:>5} {p.before:>7.3f} {p.after:>7.3f} {p.better:>7} {p.worse:>6} {p.mean_diff:>+8.4f}"
            f" {p.paired_se:>7.4f} {p.sign_p:>7.3f} {f'+{p.hit5_gained}/-{p.hit5_lost}':>10}"
            f" {f'{p.mrr_before:.3f}->{p.mrr_after:.3f}':>13} {p.reordered:>9}"
        )
    return "\n".join(lines)


def _strings(value: object) -> list[str]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list of ids, got {type(value).__name__}")
    return [str(v) for v in value]


def _method(dump: Mapping[str, object], name: str, path: Path) -> list[Mapping[str, object]]:
    rows = dump.get(name)
    if not isinstance(rows, list):
        raise SystemExit(f"{path}: no method {name!r} in this dump (it has {', '.join(map(str, dump))})")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--method", default="default", help="the method compared (default)")
    ap.add_argument("--against", help="AFTER's method, when it is not --method (two methods of one dump)")
    ap.add_argument(
        "--dev", default=",".join(LOCOMO_DEV), help="agents reported apart as 'dev' (LoCoMo's 41-43; '' for none)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    before = _method(json.loads(args.before.read_text()), args.method, args.before)
    after = _method(json.loads(args.after.read_text()), args.against or args.method, args.after)
    dev = tuple(a.strip() for a in args.dev.split(",") if a.strip())
    try:
        report = groups(before, after, dev)
    except ValueError as exc:
        raise SystemExit(f"{args.before} / {args.after}: {exc}") from exc
    if args.json:
        print(json.dumps({name: asdict(p) for name, p in report.items()}, indent=1))
        return 0
    title = f"recall@{K} per question, {args.before} ({args.method}) -> {args.after} ({args.against or args.method})"
    print(table(report, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
