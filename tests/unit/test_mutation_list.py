"""The mutation re-run's list stays applicable (issue 42): every mutant's text is found exactly
once where it says, changes something, and names tests that exist. The re-run itself applies them
(``scripts/mutants``, minutes: on demand); this keeps a refactor from silently retiring one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mutation import MUTANTS, ROOT, Mutant, locate, main


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_every_mutant_applies_once_and_names_real_tests(mutant: Mutant) -> None:
    assert locate(ROOT, mutant) > 0
    assert mutant.new != mutant.old and mutant.new not in (ROOT / mutant.path).read_text()
    for target in mutant.tests:
        path, _, test = target.partition("::")
        assert (ROOT / path).is_file(), target
        if test:
            assert f"def {test}(" in (ROOT / path).read_text(), target


def test_the_names_are_distinct_and_the_audits_four_survivors_are_listed() -> None:
    assert len({m.name for m in MUTANTS}) == len(MUTANTS) == 12
    assert sum(m.audit_survivor for m in MUTANTS) == 4


def test_a_mutant_whose_text_moved_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\nx = 1\n")
    with pytest.raises(LookupError, match="occurs 2 times"):
        locate(tmp_path, Mutant("twice", "-", "a.py", "x = 1\n", "x = 2\n", ("t",)))
    assert main(["no-such-mutant"]) == 2
