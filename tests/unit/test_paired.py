"""benchmarks/paired.py: two runs of a benchmark compared question by question (issue 27).

Pure arithmetic over two ``--dump`` files; the figures are worked out by hand here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

PAIRED = Path(__file__).resolve().parents[2] / "benchmarks" / "paired.py"


@pytest.fixture(scope="module")
def paired() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_paired", PAIRED)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def row(agent: str, question: str, category: str, evidence: list[str], ranked: list[str]) -> dict[str, object]:
    return {"agent": agent, "question": question, "category": category, "evidence": evidence, "ranked": ranked}


FILLER = [f"x{i}" for i in range(20)]

BEFORE = [
    row("locomo-41", "q1", "multi-hop", ["a", "b"], ["a", *FILLER]),  # recall 0.5, hit@5
    row("locomo-41", "q2", "single-hop", ["c"], [*FILLER[:5], "c"]),  # recall 1.0 at rank 6: no hit@5
    row("locomo-44", "q3", "multi-hop", ["d", "e"], ["d", "e"]),  # recall 1.0
    row("locomo-44", "q4", "single-hop", ["f"], ["f"]),  # unchanged
]
AFTER = [
    row("locomo-41", "q1", "multi-hop", ["a", "b"], ["a", "b"]),  # 0.5 -> 1.0
    row("locomo-41", "q2", "single-hop", ["c"], ["c"]),  # 1.0 -> 1.0, hit@5 gained
    row("locomo-44", "q3", "multi-hop", ["d", "e"], [*FILLER[:10], "d", "e"]),  # 1.0 -> 0.0, hit@5 lost
    row("locomo-44", "q4", "single-hop", ["f"], ["f"]),
]


def test_sign_test_is_the_exact_binomial(paired: ModuleType) -> None:
    assert paired.sign_test(0, 0) == 1.0
    assert paired.sign_test(5, 0) == pytest.approx(2 / 32)
    assert paired.sign_test(0, 5) == pytest.approx(2 / 32)
    assert paired.sign_test(3, 3) == 1.0
    assert paired.sign_test(9, 1) == pytest.approx(2 * 11 / 1024)


def test_pair_counts_each_question_once(paired: ModuleType) -> None:
    p = paired.pair(BEFORE, AFTER)
    assert (p.n, p.better, p.worse, p.hit5_gained, p.hit5_lost) == (4, 1, 1, 1, 1)
    assert p.before == pytest.approx((0.5 + 1 + 1 + 1) / 4, abs=1e-3)
    assert p.after == pytest.approx((1 + 1 + 0 + 1) / 4, abs=1e-3)
    assert p.mean_diff == pytest.approx(-0.125)
    # diffs +0.5, 0, -1, 0: sample sd sqrt(((0.625)^2 + 2 (0.125)^2 + (0.875)^2) / 3), over sqrt(4)
    assert p.paired_se == pytest.approx(((0.625**2 + 2 * 0.125**2 + 0.875**2) / 3) ** 0.5 / 2, abs=1e-4)
    assert p.sign_p == 1.0
    # first evidence at ranks 1, 6, 1, 1 -> 1, 1, 11 (none in the top 10: 0), 1; q4 alone is not reordered
    assert (p.mrr_before, p.mrr_after) == (pytest.approx((1 + 1 / 6 + 1 + 1) / 4, abs=1e-3), 0.75)
    assert p.reordered == 3


def test_groups_split_dev_and_categories(paired: ModuleType) -> None:
    report = paired.groups(BEFORE, AFTER, dev=("locomo-41",))
    assert list(report) == ["overall", "dev", "rest", "multi-hop", "single-hop"]
    assert (report["dev"].better, report["dev"].worse, report["dev"].hit5_gained) == (1, 0, 1)
    assert (report["rest"].better, report["rest"].worse, report["rest"].hit5_lost) == (0, 1, 1)
    assert report["multi-hop"].n == 2 and report["single-hop"].mean_diff == 0.0
    assert "dev" not in paired.groups(BEFORE, AFTER, dev=("gen-1",))


def test_a_category_named_like_a_group_keeps_both(paired: ModuleType) -> None:
    """The generator has a question kind called ``all``; a kind ``overall`` must not hide the total."""
    before = [{**r, "category": "overall"} if r["question"] == "q1" else r for r in BEFORE]
    after = [{**r, "category": "overall"} if r["question"] == "q1" else r for r in AFTER]
    report = paired.groups(before, after)
    assert report["overall"].n == 4 and report["kind overall"].n == 1 and report["kind overall"].better == 1


def test_other_questions_are_refused(paired: ModuleType) -> None:
    with pytest.raises(ValueError, match="not the same questions"):
        paired.pair(BEFORE, AFTER[:3])
    swapped = [AFTER[1], AFTER[0], *AFTER[2:]]
    with pytest.raises(ValueError, match="not the same question"):
        paired.pair(BEFORE, swapped)


def test_main_reads_two_dumps(paired: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps({"default": BEFORE}))
    after.write_text(json.dumps({"default": AFTER, "no-context": BEFORE}))
    assert paired.main([str(before), str(after), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["overall"]["better"] == 1 and got["overall"]["worse"] == 1 and got["dev"]["n"] == 2
    # two methods of one dump: no-context against itself changes nothing
    assert paired.main([str(after), str(after), "--method", "no-context", "--against", "no-context"]) == 0
    line = capsys.readouterr().out.splitlines()[2].split()
    assert line[:2] == ["overall", "4"] and line[4:6] == ["0", "0"] and line[-1] == "0"
    with pytest.raises(SystemExit, match="no method 'dense'"):
        paired.main([str(before), str(after), "--method", "dense"])
