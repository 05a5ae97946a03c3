"""Metadata filters whose value jsonb cannot hold (a NUL character): PostgreSQL refused the value
itself and the whole lexical leg failed (exit 3); no stored value can hold it, so the filter is
decided without sending it (found by the hostile-client harness, CI seed 2908675482)."""

from __future__ import annotations

from psycopg import sql

from memoryctl.query.relational import where_sql
from memoryctl.query.spec import Where


def _text(fragment: sql.Composable) -> str:
    return repr(fragment)


def test_a_value_with_nul_matches_nothing_and_is_never_sent() -> None:
    frag, params = where_sql(Where.parse("note = 'a\x00b'"))
    assert "FALSE" in _text(frag) and params == []
    frag, params = where_sql(Where.parse("note != 'a\x00b'"))
    assert "IS NOT NULL" in _text(frag) and params == ["note"]


def test_an_ordinary_value_is_a_bound_parameter() -> None:
    frag, params = where_sql(Where.parse("note = 'a\\\\u0000b'"))  # the six characters, not a NUL
    assert "FALSE" not in _text(frag) and params == ["note", '"a\\\\\\\\u0000b"']


def test_the_service_client_refuses_an_argument_that_is_not_text() -> None:
    """A command line's non-UTF-8 bytes arrive as unpaired surrogates; JSON cannot carry them and
    the HTTP client's encoder raised a traceback. Now: exit 2 naming the argument, nothing sent."""
    import pytest

    from memoryctl.errors import ExitCode, InputError
    from memoryctl.serve.client import _check_text

    _check_text({"text": "fine ✓", "where": ["note = 'x'"], "limit": 3})
    with pytest.raises(InputError) as err:
        _check_text({"since": "a\udfffb"})
    assert "--since: not valid UTF-8 text" in str(err.value) and err.value.exit_code == ExitCode.USAGE


def test_a_number_json_cannot_carry_is_refused_before_it_is_sent_to_the_service() -> None:
    """``--threshold inf`` parses as a float; JSON has no spelling for it and the HTTP client's
    encoder raised a traceback (hostile-client seed 2396642252). Now: exit 2 naming the argument."""
    import math

    import pytest

    from memoryctl.errors import ExitCode, InputError
    from memoryctl.serve.client import _check_text

    _check_text({"threshold": 0.5, "limit": 3, "half_life": "7d"})
    for value in (math.inf, -math.inf, math.nan):
        with pytest.raises(InputError) as err:
            _check_text({"text": "x", "threshold": value})
        assert "--threshold:" in str(err.value) and "not a finite number" in str(err.value)
        assert err.value.exit_code == ExitCode.USAGE
