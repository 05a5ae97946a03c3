"""The rest stage's shards (tests/shard.py): each module taken by exactly one shard, measured
modules first and longest first, junit seconds summed per module."""

from __future__ import annotations

from pathlib import Path

from tests.shard import claim, seconds_per_module, take_order


def test_each_module_is_taken_by_exactly_one_shard(tmp_path: Path) -> None:
    modules = ["tests/unit/test_a.py", "tests/e2e/test_a.py", "tests/unit/test_b.py"]
    first = [claim(tmp_path, module) for module in modules]
    second = [claim(tmp_path, module) for module in [*modules, "tests/unit/test_c.py"]]
    assert first == [True, True, True]  # distinct modules, even with the same file name
    assert second == [False, False, False, True]


def test_measured_modules_come_first_longest_first_then_the_rest_as_collected() -> None:
    seconds = {"b.py": 10.0, "d.py": 90.0, "gone.py": 500.0}
    assert take_order(["a.py", "b.py", "c.py", "d.py"], seconds) == ["d.py", "b.py", "a.py", "c.py"]


def test_seconds_per_module_sums_a_junit_files_cases_by_module(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.unit.test_shard" name="a" time="1.5"/>'
        '<testcase classname="tests.unit.test_shard" name="b" time="2.0"/>'
        '<testcase classname="tests.unit.test_shard.TestX" name="c" time="0.5"/>'
        "</testsuite></testsuites>"
    )
    assert seconds_per_module([junit]) == {"tests/unit/test_shard.py": 4.0}
