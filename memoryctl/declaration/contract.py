"""The README's table of replies and exit codes, generated from the declarations (a test fails when
the README differs): ``python3 -m memoryctl.declaration.contract README.md`` rewrites it in place.
"""

from __future__ import annotations

import sys
from pathlib import Path

from memoryctl.declaration.declare import Operation
from memoryctl.declaration.shape import described
from memoryctl.declaration.table import OPERATIONS

BEGIN = "<!-- contract: generated from memoryctl/declaration/table.py; do not edit by hand -->"
END = "<!-- contract: end -->"


def _row(op: Operation) -> str:
    fields = "; ".join(f"`{name}`: {help}" for name, help in described(op.reply))
    if str(op.reply).startswith("list["):
        fields = f"a list of rows — {fields}" if fields else "a list of rows"
    elif not fields:
        fields = "a document (see the command's docs)"
    exits = "; ".join(f"{code} {what}" for code, what in op.exits)
    return f"| `memoryctl {op.name}` | {exits} | {fields} |".replace("\n", " ")


def table() -> str:
    """The table, between its markers."""
    rows = [_row(op) for op in OPERATIONS.values() if op.reply is not None]
    return "\n".join([BEGIN, "| command | exit codes | `--json` prints |", "|---|---|---|", *rows, END])


def rewrite(text: str) -> str:
    """``text`` (the README) with its table replaced by the generated one."""
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + table() + tail


if __name__ == "__main__":
    readme = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    readme.write_text(rewrite(readme.read_text()))
