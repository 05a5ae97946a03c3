"""The console script's fast path parses the commands it answers exactly as typer does.

``memoryctl.cli.fast`` keeps its own table of options (typer would cost the start-up it saves);
this pins that table to typer's commands -- every option, its kind, default and range, and the
arguments -- so that a new or changed flag cannot make the two paths drift. (That they print the
same is shown against a live service in tests/e2e/test_serve.py.)
"""

from __future__ import annotations

from typing import Any

import pytest
import typer

from memoryctl.cli import fast
from memoryctl.cli.app import app
from memoryctl.config import Settings
from memoryctl.config_layers import SECTIONS


def _typer_options(command: Any) -> tuple[set[tuple[Any, ...]], tuple[str, str]]:
    options, arguments = set(), []
    for param in command.params:
        if param.param_type_name == "argument":
            arity = "many" if param.nargs == -1 else "one" if param.required else "optional"
            arguments.append((param.name, arity))
            continue
        assert len(param.opts) == 1 and not param.secondary_opts, param.opts  # the fast path knows one spelling
        annotation = param.type_descriptor.annotation
        kind = (
            "flag"
            if param.is_flag
            else "list"
            if param.multiple
            else {int: "int", float: "float"}.get(annotation, "str")
        )
        options.add((param.opts[0], param.name, kind, param.default, param.min, param.max))
    assert len(arguments) == 1
    return options, arguments[0]


@pytest.mark.parametrize("name", sorted(fast.COMMANDS))
def test_fast_table_is_typers(name: str) -> None:
    group = typer.main.get_command(app)
    options, argument = _typer_options(group.commands[name])  # type: ignore[attr-defined]
    spec = fast.COMMANDS[name]
    assert {(o.flag, o.name, o.kind, o.default, o.low, o.high) for o in spec.options} == options
    assert (spec.positional, spec.arity) == argument


def test_top_level_options_are_typers() -> None:
    group = typer.main.get_command(app)
    opts = {opt for p in group.params for opt in p.opts}
    assert opts == {"--config", "-c", "--profile", "--version"}  # fast.parse knows all but --version


@pytest.mark.parametrize(
    "argv",
    [
        ["query"],
        ["query", "a", "b"],
        ["query", "--limit", "0"],
        ["query", "--limit", "1001"],
        ["query", "--limit", "+5"],
        ["query", "--limit", " 5"],
        ["query", "--limit", "5_0"],
        ["query", "--threshold", "nan"],
        ["query", "--threshold", "1e-3"],
        ["query", "--hops"],
        ["query", "--", "x"],
        ["query", "-x"],
        ["query", "--json=1"],
        ["query", "--help"],
        ["-c=x.toml", "get", "5b0c2a9e-2f4e-4c59-9a53-3b0f7d1a0001"],
        ["--config", "", "get", "x"],
        ["--version"],
        ["health"],
        ["forget"],
        [],
    ],
)
def test_what_the_fast_path_leaves_to_typer(argv: list[str]) -> None:
    parsed = fast.parse(argv)
    assert parsed is None or argv == ["query"], parsed  # a bare query is valid (no text, filters only)


def test_parsed_values_are_typers() -> None:
    parsed = fast.parse(["-c", "x.toml", "query", "--via", "A", "hello", "--via=B", "--limit", "5", "--json"])
    assert parsed is not None
    top, name, values = parsed
    assert top == {"config": "x.toml", "profile": None} and name == "query"
    assert values["via"] == ["A", "B"] and values["limit"] == 5 and values["text"] == "hello"
    assert values["as_json"] is True and values["where"] is None and values["hops"] == 1
    _, _, values = fast.parse(["query", "--threshold", "-0.25", "--threshold=0.5"]) or ({}, "", {})
    assert values["threshold"] == 0.5


def test_environment_sections_are_the_settings_fields() -> None:
    assert set(Settings.model_fields) - {"source_file", "layers_digest"} == SECTIONS
