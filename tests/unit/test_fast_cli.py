"""The console script's fast path parses a command exactly as the typer command does.

Both are generated from one declaration (``memoryctl.declaration.table``); this runs both parsers
on the same command lines and compares the values they hand on (typer's are caught at
``Ctx.execute``), so that neither can drift from the other or from the declaration.
"""

from __future__ import annotations

from typing import Any

import pytest

from memoryctl.cli import fast
from memoryctl.cli.context import Ctx
from memoryctl.cli.main import _invoke
from memoryctl.config import Settings
from memoryctl.config_layers import SECTIONS
from memoryctl.declaration.table import OPERATIONS

U1 = "5b0c2a9e-2f4e-4c59-9a53-3b0f7d1a0001"
LINES = [
    ["query"],
    ["query", "rollback", "--via", "A", "--entity", "User:Alice", "--via=B", "--limit", "5", "--json"],
    ["query", "x", "--hops", "7", "--threshold", "-0.25", "--threshold=0.5", "--all-agents", "--explain"],
    ["query", "x", "--rerank"],
    ["query", "x", "--no-rerank", "--retrieval", "dense"],
    ["query", "--where", "sentiment < 0", "--since", "7d", "--direction", "sideways", "--half-life", "off"],
    ["get", U1, "--agent", "support"],
    ["add", "Alice said", "--entity", "User:Alice", "--rel", "this -X-> User:Bob", "--meta", "a=1", "--id", U1],
    ["forget", U1, U1, "--json"],
    ["stats", "--bucket", "1h", "--metric", "sentiment", "--all-agents"],
    ["health", "--deadline", "2.5", "--prometheus"],
    ["reconcile", "--repair", "-a", "support", "--json"],
    ["migrate", "--to-model", "kind=hash,dim=256", "--batch", "64", "--min-recall", "0.5"],
    ["reembed", "--changed", "--agent", "x"],
    ["runs", "--limit", "3", "--command", "sync"],
    ["cypher", "MATCH (n) RETURN n", "--param", "k=1", "--agent", "a"],
    ["feedback", U1, U1, "--not-useful"],
    ["adapters", "embedding", "--rollback"],
    ["backup", "status", "--json"],
    ["restore", "qdrant", "--set", "s1", "--no-catch-up"],
    ["rebuild", "graph", "--batch", "10", "--no-prune"],
    ["token", "issue", "agent-a", "--name", "ci"],
    ["token", "revoke", "abcd", "ef01"],
    ["sync", "--json"],
    ["nightly"],
    ["init", "--json"],
    ["backup", "qdrant"],
    ["token", "list", "--json"],
    ["demo", "--explain"],
    ["outbox", "list", "--limit", "5", "--json"],
    ["outbox", "retry", "3", "4"],
    ["outbox", "drop", "--all"],
]


def _typers_values(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, Any]]:
    seen: list[tuple[str, dict[str, Any]]] = []

    def execute(self: Ctx, op: Any, values: Any) -> int:
        seen.append((op.name, dict(values)))
        return 0

    monkeypatch.setattr(Ctx, "execute", execute)
    assert _invoke(argv) == 0
    [found] = seen
    return found


@pytest.mark.parametrize("argv", LINES, ids=[" ".join(a[:2]) for a in LINES])
def test_fast_path_parses_as_typer_does(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = fast.parse(argv)
    assert parsed is not None, argv
    _, op, values = parsed
    assert (op.name, values) == _typers_values(argv, monkeypatch)


def test_every_shared_operation_is_in_the_list() -> None:
    parsed = {" ".join(a[:2]) if a[0] in ("backup", "restore", "rebuild", "token", "outbox") else a[0] for a in LINES}
    shared = {name for name, op in OPERATIONS.items() if not op.local and not op.upload}
    assert shared <= parsed


def test_top_level_options() -> None:
    parsed = fast.parse(["-c", "x.toml", "--profile=cluster", "get", U1])
    assert parsed is not None and parsed[0] == {"config": "x.toml", "profile": "cluster"}


@pytest.mark.parametrize(
    "argv",
    [
        ["query", "a", "b"],
        ["query", "--limit", "+5"],
        ["query", "--limit", " 5"],
        ["query", "--limit", "5_0"],
        ["query", "--limit", "ten"],
        ["query", "--threshold", "nan"],
        ["query", "--threshold", "1e-3"],
        ["query", "--hops"],
        ["query", "--", "x"],
        ["query", "-x"],
        ["query", "--json=1"],
        ["query", "--help"],
        ["-c=x.toml", "get", U1],
        ["--config", "", "get", "x"],
        ["--version"],
        ["get"],
        ["forget"],
        ["import", "x.jsonl"],  # an upload: the full command line streams the file
        ["serve"],
        ["config", "show"],
        ["backup"],
        ["nope"],
        [],
    ],
)
def test_what_the_fast_path_leaves_to_typer(argv: list[str]) -> None:
    assert fast.parse(argv) is None


def test_environment_sections_are_the_settings_fields() -> None:
    assert set(Settings.model_fields) - {"source_file", "layers_digest"} == SECTIONS
