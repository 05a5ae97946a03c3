"""``Memory`` validation at its edges: what PostgreSQL cannot hold is refused, nothing more."""

from __future__ import annotations

import pytest

from memoryctl.errors import InputError
from memoryctl.model import Memory


@pytest.mark.parametrize("value", ["\\u0000", "a\\u0000b", "\\\\u0000", {"k": "\\u0000"}, ["x\\u0000"]])
def test_the_text_backslash_u0000_is_data(value: object) -> None:
    """Six characters, not a NUL: jsonb stores them (found by the hostile-input suite, which wrote it)."""
    assert Memory(text="t", agent_id="a", metadata={"k": value}).metadata == {"k": value}


@pytest.mark.parametrize(
    "metadata", [{"k": "\x00"}, {"k": "a\\\x00"}, {"k\x00": 1}, {"k": ["\x00"]}, {"k": {"x": "\x00"}}]
)
def test_a_real_nul_is_refused(metadata: dict[str, object]) -> None:
    with pytest.raises(InputError, match="metadata contains a NUL character"):
        Memory(text="t", agent_id="a", metadata=metadata)
