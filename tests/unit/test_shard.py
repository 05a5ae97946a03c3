"""The rest stage's split into shards (tests/shard.py): every module in exactly one shard, the
longest modules spread, the same split every time, bad ``--shard`` values refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shard import assign, parse, seconds_per_module


def test_every_module_lands_in_exactly_one_shard_and_the_loads_are_balanced() -> None:
    seconds = {"a.py": 100.0, "b.py": 90.0, "c.py": 60.0, "d.py": 40.0, "e.py": 10.0}
    shards = assign([*seconds, "new.py", "a.py"], seconds, 2)  # a module named twice counts once
    assert sorted(m for shard in shards for m in shard) == sorted([*seconds, "new.py"])
    loads = [sum(seconds.get(m, 5.0) for m in shard) for shard in shards]
    assert shards[0][:1] == ["a.py"] and shards[1][:1] == ["b.py"]  # the two longest apart
    assert abs(loads[0] - loads[1]) <= 10.0, (shards, loads)


def test_the_split_does_not_depend_on_the_order_modules_are_met_in() -> None:
    seconds = {f"m{i}.py": float(i % 7) for i in range(40)}
    assert assign(list(seconds), seconds, 2) == assign(list(reversed(seconds)), seconds, 2)


@pytest.mark.parametrize("value", ["2", "0/2", "3/2", "a/b", "1/2/3", ""])
def test_a_bad_shard_option_is_a_usage_error(value: str) -> None:
    with pytest.raises(pytest.UsageError):
        parse(value)


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
