"""The words and bounds of a query that every layer speaks: its choices and its ceilings.

The declaration advertises them (``memoryctl.declaration.table``: the command line, OpenAPI, MCP),
``MemoryQuery`` types its fields with them and the stores check them again before a value becomes
part of a statement. One module below all three, so that none of them takes its terms from another
layer (the stores from the command line's table, say), and a choice is written once: each tuple is
read from its ``Literal``. Standard library only, and no dataclass: the console script's fast path
imports it on every call.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

Direction = Literal["out", "in", "both"]
Combine = Literal["and", "or"]
# Which legs rank a text query: both fused (the default), or one alone (to compare, or to debug).
Retrieval = Literal["hybrid", "dense", "lexical"]
MetaOp = Literal["=", "!=", "<", "<=", ">", ">=", "in"]

DIRECTIONS: Final[tuple[Direction, ...]] = get_args(Direction)
COMBINES: Final[tuple[Combine, ...]] = get_args(Combine)
RETRIEVALS: Final[tuple[Retrieval, ...]] = get_args(Retrieval)
OPS: Final[tuple[MetaOp, ...]] = get_args(MetaOp)

MAX_LIMIT: Final = 1000  # hits of one query
# The deepest traversal: its cost grows with the graph's fan-out to this power, and the graph
# stores paste it into their statements (so they check it again, whoever called them).
MAX_HOPS: Final = 3
