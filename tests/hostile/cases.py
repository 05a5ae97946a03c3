"""What the harness sends: hypothesis strategies over every operation's parameters.

Each parameter is drawn either from its *valid* strategy (inside the documented rules, so the
answer must be a success) or from its *hostile* one (anything: injection strings, markup, control
characters, unpaired surrogates, out-of-range numbers and timestamps, wrong JSON types). A case is
``valid`` when all its parameters came from valid strategies; the harness then expects exit 0
(HTTP 200), and for any other case one of the documented refusals -- never a traceback, never a
5xx while every store is up.

Ids that must name existing memories are drawn as references (``Known``) and resolved when the
case runs, against the memories the run has written so far (of the same agent, or of another one:
a conflict).
"""

from __future__ import annotations

import json
import math
import string
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Literal

from hypothesis import strategies as st

Channel = Literal["cli", "http", "raw"]

AGENTS = ("h-alice", "h-bob", "h.carol", "h:dave@x", "h_eve")
KINDS = ("note", "dialogue", "event", "t-1")
TEXT_WORDS = ("rollback", "deploy", "canary", "payments", "Alice", "Bob", "GPU", "ticket", "lunch")
META_KEYS = ("note", "score", "team", "x_1")

# Strings that have broken someone somewhere: SQL/Cypher injection, terminal markup, quoting,
# JSON look-alikes, control and format characters, the limits of the text types.
NASTY = (
    "Robert'); DROP TABLE memories;--",
    "'; DROP TABLE memories; --",
    "}) MATCH (n) DETACH DELETE n //",
    "x' OR 1=1 --",
    '{"$ne": null}',
    "$agent_id",
    "only [/] here",
    "Eve said [red]hello[/red] and [x] ok",
    "[bold]x[/bold] [link=file:///etc/passwd]y[/link]",
    "\x1b[31mred\x1b[0m",
    "a\x00b",
    "\ud800",
    "a\udfffb",
    "\u202eevil",
    "zero\u200bwidth",
    "\ufeffbom",
    "line\nbreak\r\n",
    "tab\there",
    "NaN",
    "Infinity",
    "-Infinity",
    "null",
    "true",
    "1e999",
    "-0",
    "9007199254740993",
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59-12:00",
    "99999999d",
    "-",
    "--",
    "--help",
    "-x",
    " ",
    "",
    "é" * 600,
    "%s %d %x",
    "{0} {1}",
    "../../etc/passwd",
    "C:\\Windows",
    "\\u0000",
    "'",
    '"',
    "''",
    "a,b",
    "(a, 'b,c')",
)


@dataclass(frozen=True, slots=True)
class Known:
    """An id the run has written: the ``n``-th (modulo how many exist) of ``agent`` (or of another
    agent when ``foreign``), or a fresh one when none exists yet."""

    n: int
    foreign: bool = False


@dataclass(slots=True)
class Case:
    op: str
    channel: Channel
    params: dict[str, Any] = field(default_factory=dict)
    valid: bool = False
    lines: list[Any] | None = None  # import: JSON values, or raw bytes for a garbage line
    raw: bytes | None = None  # raw channel: bytes on the wire
    pace: Literal["whole", "partial", "slow"] = "whole"
    argv: list[str] | None = None  # CLI garbage: argv as given


class Draw:
    """Draws a case's parameters: half the cases entirely valid, in the others each parameter
    hostile with probability 1/3 (so that a refusal names one thing, usually)."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.all_valid = draw(st.booleans())
        self.valid = True

    def __call__(self, valid: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any]) -> Any:
        ok = self.all_valid or self.draw(st.integers(0, 2)) > 0
        self.valid = self.valid and ok
        return self.draw(valid if ok else hostile)


# ---- parameter strategies ------------------------------------------------------------------------
def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def _storable(text: str) -> bool:
    """Valid memory text: not blank, no NUL, no unpaired surrogate."""
    return bool(text.strip()) and "\x00" not in text and not _has_surrogate(text)


any_text = st.one_of(st.text(max_size=60), st.sampled_from(NASTY), st.text(alphabet=string.printable, max_size=30))
valid_text = st.one_of(
    st.lists(st.sampled_from(TEXT_WORDS), min_size=1, max_size=8).map(" ".join),
    st.text(
        alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1, max_size=120
    ).filter(_storable),
    st.sampled_from([t for t in NASTY if _storable(t)]),
)
valid_agent = st.sampled_from(AGENTS)
valid_kind = st.sampled_from(KINDS)
valid_key = st.sampled_from(META_KEYS)


_offsets = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
valid_instant = st.builds(
    lambda dt, tz: dt.replace(tzinfo=UTC).astimezone(tz),
    st.datetimes(min_value=datetime(1, 1, 3), max_value=datetime(9999, 12, 29)),
    _offsets,
)
valid_at = valid_instant.map(lambda d: d.isoformat())
hostile_at = st.one_of(
    any_text, st.sampled_from(["0001-01-01T00:00:00+14:00", "9999-12-31T23:00:00-05:00", "2026-13-01"])
)

json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
)
valid_json_value = st.recursive(
    st.one_of(
        st.booleans(),
        st.integers(-(2**63), 2**63),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=30),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(valid_key, inner, max_size=3)),
    max_leaves=6,
)
hostile_json_value = st.recursive(
    json_scalar | st.sampled_from(NASTY) | st.just(math.nan) | st.just(math.inf),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)
entity_type = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,10}", fullmatch=True)
valid_entity_name = st.text(alphabet=st.characters(exclude_categories=("Cs", "Cc")), min_size=1, max_size=40).filter(
    lambda t: t.strip() != ""
)
valid_entity = st.builds(lambda t, n: f"{t}:{n.strip()}", entity_type, valid_entity_name)
valid_relation = st.builds(
    lambda t, n, rel: f"{t}:{n.strip()} -{rel}-> this",
    entity_type,
    valid_entity_name.filter(lambda n: " -" not in n and "->" not in n),
    st.sampled_from(["AUTHORED", "SAID", "works_on", "RELATES_TO"]),
)
valid_id = st.one_of(st.builds(Known, st.integers(0, 10**6)), st.builds(lambda: str(uuid.uuid4())))
hostile_id = st.one_of(
    any_text,
    st.builds(lambda n: Known(n, foreign=True), st.integers(0, 10**6)),
    st.builds(lambda: str(uuid.uuid4()).upper()),
)


def _quoted_sql(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


valid_where = st.one_of(
    st.builds(
        lambda op, n: f"score {op} {n}",
        st.sampled_from(["=", "!=", "<", "<=", ">", ">="]),
        st.one_of(st.integers(-(2**53), 2**53), st.floats(-1e300, 1e300, allow_nan=False)),
    ),
    st.builds(
        lambda t: f"note = {_quoted_sql(t)}", st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=20)
    ),
    st.builds(
        lambda t: f"note = {json.dumps(t)}", st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=20)
    ),
    st.builds(lambda ks: "kind in " + ",".join(ks), st.lists(valid_kind, min_size=1, max_size=3)),
    st.builds(lambda d: f"created_at >= {d}", valid_at),
)
hostile_where = st.one_of(
    any_text,
    st.builds(lambda f, op, v: f"{f} {op} {v}", any_text, st.sampled_from(["=", "<", "in", "~", ""]), any_text),
)


# ---- operations ----------------------------------------------------------------------------------
def _params(values: dict[str, Any]) -> dict[str, Any]:
    """Parameters without the ones left out (None, empty)."""
    return {k: v for k, v in values.items() if v not in (None, [], {})}


@st.composite
def add_case(draw: st.DrawFn, channel: Channel) -> Case:
    d = Draw(draw)
    params = {
        "text": d(valid_text, any_text),
        "agent": d(valid_agent, any_text),
        "kind": d(valid_kind, any_text),
        "at": d(st.none() | valid_at, hostile_at),
        "entities": d(st.lists(valid_entity, max_size=3), st.lists(any_text, min_size=1, max_size=3)),
        "relations": d(st.lists(valid_relation, max_size=2), st.lists(any_text, min_size=1, max_size=2)),
        "metadata": d(
            st.dictionaries(valid_key, valid_json_value, max_size=3),
            st.dictionaries(st.text(max_size=10), hostile_json_value, min_size=1, max_size=3),
        ),
        "id": d(st.none() | valid_id, hostile_id),
    }
    return Case("add", channel, _params(params), d.valid)


@st.composite
def import_case(draw: st.DrawFn, channel: Channel) -> Case:
    """A JSONL body: valid lines, lines of another agent's ids, garbage bytes, invalid UTF-8."""
    d = Draw(draw)
    lines: list[Any] = []
    for _ in range(draw(st.integers(1, 8))):
        line: Any = {"id": draw(valid_id), "text": draw(valid_text)}
        if draw(st.booleans()):
            line["created_at"] = draw(valid_at)
        if draw(st.booleans()):
            line["metadata"] = draw(st.dictionaries(valid_key, valid_json_value, max_size=2))
        if draw(st.booleans()):
            line["kind"] = draw(valid_kind)
        hostile = st.one_of(
            st.dictionaries(
                st.sampled_from(["id", "text", "agent_id", "kind", "created_at", "metadata", "entities", "x"]),
                hostile_json_value | hostile_id | hostile_at,
                max_size=5,
            ),
            hostile_json_value,
            st.fixed_dictionaries({"text": any_text, "id": hostile_id}),
            st.binary(max_size=40).map(lambda b: b.replace(b"\n", b" ")),
            st.sampled_from([b"\xe9", b"\xff\xfe", b"\xc3"]).map(lambda b: b'{"text": "caf' + b + b'"}'),
        )
        lines.append(d(st.just(line), hostile))
    params = {"agent": d(valid_agent, any_text), "strict": draw(st.booleans()) or None}
    return Case("import", channel, _params(params), d.valid, lines)


@st.composite
def get_case(draw: st.DrawFn, channel: Channel) -> Case:
    d = Draw(draw)
    return Case("get", channel, _params({"id": d(valid_id, hostile_id), "agent": d(st.none(), any_text)}), d.valid)


@st.composite
def forget_case(draw: st.DrawFn, channel: Channel) -> Case:
    d = Draw(draw)
    ids = [d(valid_id, hostile_id) for _ in range(draw(st.integers(1, 3)))]
    return Case("forget", channel, {"ids": ids}, d.valid)


@st.composite
def query_case(draw: st.DrawFn, channel: Channel) -> Case:
    d = Draw(draw)
    params = {
        "text": d(valid_text, st.none() | any_text),
        "agent": d(valid_agent, any_text),
        "since": d(st.none() | st.sampled_from(["7d", "90s", "2w", "0001-01-03T00:00:00Z"]), any_text),
        "where": d(st.lists(valid_where, max_size=2), st.lists(hostile_where, min_size=1, max_size=2)),
        "combine": d(st.sampled_from(["and", "or", None]), any_text),
        "limit": d(st.none() | st.integers(1, 1000), st.integers(-(2**40), 2**40)),
        "threshold": d(st.none() | st.floats(-1, 1), st.floats(allow_nan=True, allow_infinity=True) | st.integers()),
        "retrieval": d(st.sampled_from(["hybrid", "dense", "lexical", None]), any_text),
        "half_life": d(st.sampled_from(["off", "30d", "12h", None]), any_text),
        "entity": d(st.none() | valid_entity, any_text),
    }
    if params["entity"] is not None:
        params["via"] = d(
            st.lists(st.sampled_from(["AUTHORED", "SAID"]), max_size=2), st.lists(any_text, min_size=1, max_size=2)
        )
        params["hops"] = d(st.integers(1, 3), st.integers(-5, 50))
        params["direction"] = d(st.sampled_from(["out", "in", "both"]), any_text)
    return Case("query", channel, _params(params), d.valid)


@st.composite
def stats_case(draw: st.DrawFn, channel: Channel) -> Case:
    d = Draw(draw)
    params = {
        "agent": d(valid_agent, any_text),
        "bucket": d(st.sampled_from(["1h", "1d", "15m", None]), any_text),
        "since": d(st.sampled_from(["7d", "30d", None]), any_text),
        "metric": d(st.sampled_from(["score", None]), any_text),
        "kind": d(st.none() | valid_kind, any_text),
    }
    return Case("stats", channel, _params(params), d.valid)


@st.composite
def health_case(draw: st.DrawFn, channel: Channel) -> Case:
    d = Draw(draw)
    deadline = d(st.floats(0.5, 3.0), st.floats(allow_nan=True, allow_infinity=True) | st.integers())
    return Case("health", channel, {"deadline": deadline}, d.valid)


def sync_case(channel: Channel) -> st.SearchStrategy[Case]:
    return st.just(Case("sync", channel, {}, True))


OPERATIONS = {
    "add": add_case,
    "import": import_case,
    "get": get_case,
    "forget": forget_case,
    "query": query_case,
    "stats": stats_case,
    "health": health_case,
    "sync": sync_case,
}
# How often each operation is drawn: writes and reads dominate, as in use.
WEIGHTS = {"add": 6, "import": 2, "get": 4, "forget": 1, "query": 6, "stats": 1, "health": 1, "sync": 1}


@st.composite
def garbage_argv(draw: st.DrawFn) -> Case:
    """A command line with nothing meant: real command names, flags and hostile words."""
    words = st.one_of(
        st.sampled_from([*OPERATIONS, "--json", "--agent", "--where", "--since", "--id", "--limit", "--", "-h"]),
        any_text,
    )
    return Case("argv", "cli", argv=draw(st.lists(words, min_size=1, max_size=6)))


@st.composite
def http_garbage(draw: st.DrawFn) -> Case:
    """A request to the HTTP API with a body that is not what the operation takes."""
    op = draw(st.sampled_from([*OPERATIONS, "status", "openapi.json", "nope", "../etc/passwd"]))
    body = draw(
        st.one_of(
            st.binary(max_size=200),
            hostile_json_value.map(lambda v: json.dumps(v).encode()),
            st.dictionaries(st.text(max_size=10), hostile_json_value, max_size=4).map(lambda v: json.dumps(v).encode()),
            st.integers(1, 400).map(lambda depth: b"[" * depth + b"]" * depth),
        )
    )
    method = draw(st.sampled_from(["POST", "POST", "GET", "PUT", "DELETE"]))
    return Case("http-garbage", "http", {"path": "/v1/" + op, "method": method, "body": body})


@st.composite
def raw_request(draw: st.DrawFn) -> Case:
    """Bytes on the socket: garbage, a request cut short, or a valid one sent slowly."""
    pace = draw(st.sampled_from(["whole", "whole", "partial", "slow"]))
    body = json.dumps({"text": draw(valid_text), "agent": draw(valid_agent)}).encode()
    request = (
        b"POST /v1/query HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer {token}\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    if pace == "whole":
        request = draw(
            st.one_of(
                st.binary(min_size=1, max_size=300),
                st.builds(lambda junk: request[: len(request) // 2] + junk, st.binary(max_size=50)),
                st.just(b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 70_000 + b"\r\n\r\n"),
                st.just(b"POST /v1/query HTTP/1.1\r\nContent-Length: -5\r\n\r\n"),
                st.just(b"POST /v1/query HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n"),
            )
        )
    elif pace == "partial":
        request = request[: draw(st.integers(1, len(request) - 1))]
    return Case("raw", "raw", raw=request, pace=pace)


def cases(channels: tuple[Channel, ...] = ("cli", "http")) -> st.SearchStrategy[Case]:
    """One case: an operation through one of ``channels``, or garbage (argv, HTTP, raw bytes)."""
    ops = [name for name, weight in WEIGHTS.items() for _ in range(weight)]
    operation = st.tuples(st.sampled_from(ops), st.sampled_from(channels)).flatmap(lambda p: OPERATIONS[p[0]](p[1]))
    garbage: list[st.SearchStrategy[Case]] = []
    if "cli" in channels:
        garbage.append(garbage_argv())
    if "http" in channels:
        garbage += [http_garbage(), raw_request()]
    return st.one_of(operation, operation, operation, operation, *garbage) if garbage else operation
