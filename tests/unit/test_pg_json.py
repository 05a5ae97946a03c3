"""The jsonb loader: orjson for speed, never at the price of a value that comes back different."""

from __future__ import annotations

import json
import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from memoryctl.stores.pg import _json_loads

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@example(None)  # boundaries: empty containers, -0.0, the int64 edges and past them, empty text
@example([])
@example({})
@example(-0.0)
@example(2**63 - 1)
@example(-(2**63) - 1)
@example("")
@given(json_values)
def test_same_values_as_the_standard_library(value: object) -> None:
    raw = json.dumps(value).encode()
    got = _json_loads(raw)
    assert got == json.loads(raw)
    assert json.dumps(got) == json.dumps(json.loads(raw))  # same types: an int stays an int
    assert _json_loads(memoryview(raw)) == got and _json_loads(raw.decode()) == got


def test_big_integers_stay_exact() -> None:
    # orjson 3.8 would return 1.2345678901234568e+29 here.
    assert _json_loads(b'{"n": 123456789012345678901234567890}') == {"n": 123456789012345678901234567890}
    assert _json_loads(b"[-9223372036854775809]") == [-9223372036854775809]


def test_what_only_the_standard_library_parses() -> None:
    assert math.isinf(_json_loads(b'{"x": 1e400}')["x"])
