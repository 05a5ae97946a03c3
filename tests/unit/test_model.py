"""``Memory`` validation at its edges: what PostgreSQL cannot hold is refused, nothing more."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memoryctl.errors import InputError
from memoryctl.model import Memory, parse_datetime, parse_uuid
from memoryctl.query.spec import parse_since


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


# ---- issue 22: what the stores cannot hold is refused at the door --------------------------------
@pytest.mark.parametrize(
    "at",
    [
        "0001-01-01T00:00:00+14:00",  # UTC: 0001 BC, which PostgreSQL stored and psycopg could not read
        "0001-01-01T00:00:00Z",  # year 1, read back at a positive session offset: BC again
        "9999-12-31T23:00:00-05:00",  # UTC: year 10000
        "9999-12-31T00:00:00Z",  # read back at a negative offset: year 10000
    ],
)
def test_timestamps_the_stores_cannot_give_back_are_refused(at: str) -> None:
    with pytest.raises(InputError, match="out of range") as caught:
        parse_datetime(at)
    assert caught.value.hint and "UTC" in caught.value.hint
    with pytest.raises(InputError, match="out of range"):
        Memory(text="t", agent_id="a", created_at=datetime.fromisoformat(at))


@pytest.mark.parametrize("at", ["0001-01-02T00:00:00Z", "0001-01-02T12:00:00+11:00", "9999-12-30T23:59:59Z"])
def test_the_edges_of_the_range_are_accepted(at: str) -> None:
    assert parse_datetime(at) == datetime.fromisoformat(at)


def test_a_naive_datetime_from_the_python_api_is_utc() -> None:
    memory = Memory(text="t", agent_id="a", created_at=datetime(2026, 1, 1))
    assert memory.created_at == datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "message"), [(123, "must be a string, not int"), (None, "not NoneType"), ("  ", "empty")]
)
def test_text_that_is_not_a_string_says_so(text: object, message: str) -> None:
    with pytest.raises(InputError, match=message):
        Memory(text=text, agent_id="a")  # type: ignore[arg-type]


def test_a_bad_uuid_has_a_hint() -> None:
    with pytest.raises(InputError, match="is not a UUID") as caught:
        parse_uuid("not-a-uuid")
    assert caught.value.hint and "memoryctl add" in caught.value.hint


@pytest.mark.parametrize("text", ["99999999d", "9999999999999d", "999999999999w"])
def test_durations_beyond_the_calendar_are_an_input_error(text: str) -> None:
    with pytest.raises(InputError):
        parse_since(text)
