"""The README's table of exit codes and ``--json`` replies is the declarations' (issue 43): an
operation or a reply field changed without the README fails here, in milliseconds."""

from __future__ import annotations

from pathlib import Path

from memoryctl.declaration.contract import BEGIN, END, rewrite, table
from memoryctl.declaration.table import OPERATIONS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_table_is_generated_from_the_declarations() -> None:
    text = README.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert rewrite(text) == text, "run: python3 -m memoryctl.declaration.contract README.md"


def test_the_table_has_a_row_per_operation_with_a_reply() -> None:
    rows = [line for line in table().splitlines() if line.startswith("| `memoryctl ")]
    assert len(rows) == sum(op.reply is not None for op in OPERATIONS.values())
    assert any("`query_id`: this query's UUID" in row for row in rows)
