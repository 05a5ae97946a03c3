"""Parsing and validating queries: whitelisted identifiers, values stay values."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from memoryctl.errors import InputError
from memoryctl.model import EntityRef, parse_duration
from memoryctl.query.fusion import rrf
from memoryctl.query.guard import Guard
from memoryctl.query.pushdown import pushdown
from memoryctl.query.relational import where_sql
from memoryctl.query.spec import GraphFilter, MemoryQuery, Where, parse_since


@pytest.mark.parametrize(
    ("text", "field", "op", "value"),
    [
        ("kind = ticket", "kind", "=", "ticket"),
        ("sentiment < 0", "meta.sentiment", "<", 0),
        ("meta.score >= 0.5", "meta.score", ">=", 0.5),
        ('kind in ["note","event"]', "kind", "in", ["note", "event"]),
        ("kind in note,event", "kind", "in", ["note", "event"]),
        ("team != 'infra'", "meta.team", "!=", "infra"),
        ("flag = true", "meta.flag", "=", True),
    ],
)
def test_where_parse(text: str, field: str, op: str, value: object) -> None:
    w = Where.parse(text)
    assert (w.field, w.op, w.value) == (field, op, value)


@pytest.mark.parametrize(
    "text",
    ["nonsense", "kind > x", "`x` = 1", "a-b = 1", "meta.x; DROP = 1", "x = [1,2]", "kind in []", "created_at = soon"],
)
def test_where_rejects(text: str) -> None:
    with pytest.raises(InputError):
        Where.parse(text)


def test_where_created_at_is_a_timestamp() -> None:
    w = Where.parse("created_at >= 2026-11-01T00:00:00Z")
    assert w.value == datetime(2026, 11, 1, tzinfo=UTC)


def test_durations() -> None:
    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration("90s") == timedelta(seconds=90)
    now = datetime(2026, 11, 29, tzinfo=UTC)
    assert parse_since("2d", now=now) == datetime(2026, 11, 27, tzinfo=UTC)
    with pytest.raises(InputError):
        parse_duration("7 days")


def test_query_needs_scope_and_something_to_ask() -> None:
    with pytest.raises(InputError, match="scoped"):
        MemoryQuery(text="x").validate()
    with pytest.raises(InputError, match="empty"):
        MemoryQuery(agent_id="a").validate()
    assert MemoryQuery(text="x", all_agents=True, agent_id="a").validate().agent_id is None
    with pytest.raises(InputError):
        GraphFilter(EntityRef("User", "A"), hops=4)
    for bad in ("NOT A REL", "KNOWS|MENTIONS", "`X`", "1ST", "", "X" * 65):
        with pytest.raises(InputError):
            GraphFilter(EntityRef("User", "A"), via=(bad,))
    # Any identifier of the documented shape is a relationship type, upper-cased.
    assert GraphFilter(EntityRef("Speaker", "A"), via=("said", "Attended_2")).via == ("SAID", "ATTENDED_2")


def test_pushdown_carries_every_payload_filter() -> None:
    ids = [uuid.uuid4()]
    q = MemoryQuery(
        text="x",
        agent_id="a",
        since=datetime(2026, 1, 1, tzinfo=UTC),
        where=[Where.parse("kind in note,event"), Where.parse("kind != event"), Where.parse("sentiment > 0")],
    )
    flt = pushdown(q, with_where=True, ids=ids)
    assert flt is not None
    assert flt.agent_id == "a" and flt.ids == ids and flt.kinds == ["event", "note"]
    assert flt.exclude_kinds == ["event"] and flt.created_from == q.since
    assert [(m.key, m.op, m.value) for m in flt.meta] == [("sentiment", ">", 0)]
    contradiction = MemoryQuery(text="x", agent_id="a", where=[Where.parse("kind = a"), Where.parse("kind = b")])
    assert pushdown(contradiction, with_where=True) is None


def test_rrf_rewards_agreement() -> None:
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    fused = rrf({"vector": [a, b, c], "graph": [c, b]})
    total = {k: sum(v.values()) for k, v in fused.items()}
    # b is second in both lists; a is first in one only; c is first and third
    assert total[b] > total[a]
    assert total[c] > total[b]
    assert set(fused[a]) == {"vector"}


def test_guard_times_out_and_opens_breaker() -> None:
    import threading

    from memoryctl.errors import StoreUnavailable

    g = Guard(timeout_s=0.1, failures=2, reset_s=60)
    stop = threading.Event()
    for _ in range(2):
        with pytest.raises(StoreUnavailable, match="no answer"):
            g.call("neo4j", lambda: stop.wait(5))
    with pytest.raises(StoreUnavailable, match="breaker"):
        g.call("neo4j", lambda: 1)
    assert g.call("qdrant", lambda: 42) == 42
    stop.set()


identifier_junk = st.lists(
    st.sampled_from([*list("abcXYZ_09 '\"`;{}()[]$-=<>!.,\\/*\n"), "MATCH", "DROP", "--", "/*", " OR 1=1"]),
    min_size=1,
    max_size=20,
).map("".join)


@settings(max_examples=600, deadline=None)
@example(field="meta.x", op="=", value="' OR 1=1")  # boundaries: a meta key, a quote, an empty-ish key
@example(field="meta.", op="in", value="x")
@example(field="kind", op="<", value="--")
@given(field=identifier_junk, op=st.sampled_from(["=", "!=", "<", "<=", ">", ">=", "in"]), value=identifier_junk)
def test_where_fuzz_never_reaches_sql_as_identifier(field: str, op: str, value: str) -> None:
    """Generated hostile where clauses: either refused, or compiled with the key and value as parameters."""
    try:
        w = Where.parse(f"{field} {op} {value}")
    except InputError:
        return
    frag, params = where_sql(w)
    text = frag.as_string(None)  # type: ignore[arg-type]
    if w.field.startswith("meta."):
        assert params[0] == w.field[5:]  # the key is a bound parameter …
        assert text in META_TEMPLATES  # … and the SQL text is one of the fixed templates
    else:
        assert w.field in ("kind", "agent_id", "created_at")
        assert text.split(" ")[0] == f'"{w.field}"'


META_TEMPLATES = {
    "metadata -> %s = ANY(%s::jsonb[])",
    *(f"metadata -> %s {op} %s::jsonb" for op in ("=", "<>", "<", "<=", ">", ">=")),
}


# ---- issue 22, items 7 and 9: --where values by rules a user can predict ------------------------
def _sql_quoted(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


@settings(max_examples=400, deadline=None)
@example("")  # boundaries: empty, only quotes, a comma and a bracket, a NUL
@example("''")
@example('"')
@example("a, b)")
@example("\x00")
@given(st.text())
def test_a_quoted_value_is_exactly_its_text(s: str) -> None:
    """Single quotes (SQL style, '' for a quote) and double quotes (a JSON string) give back the text
    byte for byte, alone and in an `in` list, whatever it holds: quotes, commas, brackets, SQL."""
    assert Where.parse(f"note = {_sql_quoted(s)}").value == s
    assert Where.parse(f"note = {json.dumps(s)}").value == s
    assert Where.parse(f"note in {_sql_quoted(s)}, {json.dumps(s)}").value == [s, s]
    assert Where.parse(f"note in ({_sql_quoted(s)})").value == [s]


def test_the_issue_s_value_keeps_its_quote_or_is_refused() -> None:
    """`--where "note = '; DROP TABLE memories; --"` silently became `; DROP TABLE memories; --`."""
    assert Where.parse("note = '; DROP TABLE memories; --'").value == "; DROP TABLE memories; --"
    assert Where.parse("note = ''''").value == "'"
    assert Where.parse("note = it's").value == "it's"  # unquoted: the text as written
    assert Where.parse("note = hello world").value == "hello world"
    assert Where.parse('note = "3"').value == "3" and Where.parse("note = 3").value == 3


@pytest.mark.parametrize(
    "text",
    [
        "note = '; DROP TABLE memories; --",  # the issue's: unbalanced
        "note = 'a'b'",
        'note = "abc',
        'note = "a" b',
        "note in 'a, b",
        "note in a, 'b",
    ],
)
def test_an_unbalanced_quote_is_an_error(text: str) -> None:
    with pytest.raises(InputError, match=r"unbalanced|malformed") as caught:
        Where.parse(text)
    assert caught.value.hint and "single quotes" in caught.value.hint


@pytest.mark.parametrize(
    "text",
    [
        "sentiment < NaN",
        "sentiment > -Infinity",
        "sentiment = Infinity",
        "sentiment < 1e999",
        "sentiment in [1, NaN]",
        "sentiment = null",
        "sentiment = 9007199254740993",
    ],
)
def test_values_no_store_compares_are_refused(text: str) -> None:
    """They reached PostgreSQL as JSON it refused (exit 1, 503 over HTTP)."""
    with pytest.raises(InputError) as caught:
        Where.parse(text)
    assert caught.value.hint


def test_quoted_nan_is_text() -> None:
    assert Where.parse('note = "NaN"').value == "NaN" and Where.parse("note = 'Infinity'").value == "Infinity"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"limit": 0}, "limit must be from 1 to 1000, not 0"),
        ({"limit": 1001}, "limit must be from 1 to 1000"),
        ({"threshold": 1.5}, "threshold must be from -1 to 1"),
        ({"combine": "xor"}, "combine must be one of and, or"),
        ({"retrieval": "sparse"}, "retrieval must be one of hybrid, dense, lexical"),
    ],
)
def test_a_query_is_checked_by_the_declaration(fields: dict[str, object], message: str) -> None:
    """The Python API gets the same check, and message, as the command line, HTTP and MCP: one
    place validates each field (memoryctl.declaration.table)."""
    with pytest.raises(InputError, match=message):
        MemoryQuery(text="x", agent_id="a", **fields).validate()  # type: ignore[arg-type]
    with pytest.raises(InputError, match="hops must be from 1 to 3, not 4"):
        GraphFilter(EntityRef("User", "Alice"), hops=4)


def test_the_query_operations_defaults_are_memory_querys() -> None:
    """A query sent with nothing but its text, through any surface, is ``MemoryQuery``'s default
    query: the declaration's defaults and the query model's agree."""
    from memoryctl.declaration.table import QUERY

    sent = MemoryQuery.from_params(QUERY.validate({"text": "where is Alice"}), agent_id="a")
    assert sent.as_dict() == MemoryQuery(text="where is Alice", agent_id="a").as_dict()


def test_the_query_operations_parameters_parse_into_memory_query() -> None:
    from memoryctl.declaration.table import QUERY

    params = QUERY.validate(
        {
            "text": "x",
            "entity": "User:Alice",
            "via": ["KNOWS"],
            "hops": 2,
            "direction": "out",
            "since": "2026-01-01T00:00:00Z",
            "until": "2026-02-01T00:00:00Z",
            "where": ["kind = note"],
            "combine": "or",
            "limit": 5,
            "retrieval": "dense",
            "half_life": "off",
        }
    )
    q = MemoryQuery.from_params(params, agent_id="a")
    assert q.graph == GraphFilter(EntityRef.parse("User:Alice"), ("KNOWS",), 2, "out")
    assert (q.since, q.until) == (datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC))
    assert q.where == (Where("kind", "=", "note"),)
    assert (q.combine, q.limit, q.retrieval, q.agent_id) == ("or", 5, "dense", "a")
    assert (q.half_life, q.decay) == (None, False)  # "off" overrides a configured half-life
