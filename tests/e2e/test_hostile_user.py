"""Issue 22, as a new user and an attacker tried it by hand, on the embedded default profile: each
item's command, its exit code and message, in-process and through ``memoryctl serve`` (the CLI
over its socket, and HTTP with the token). One data directory for the module: every test uses its
own agents and ids, so they do not see each other's memories.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from memoryctl.cli.main import _invoke
from tests.e2e.serving import Served, embedded_home, running_service

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    with embedded_home("memoryctl-hostile-user-") as config, pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMORYCTL_CONFIG", str(config))
        yield config.parent


@pytest.fixture(scope="module")
def service(home: Path) -> Iterator[Served]:
    with running_service(home / "memoryctl.toml", home / "d", log=home / "serve.log") as served:
        yield served


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = _invoke(list(args))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err, (args, captured.err)
    return code, captured.out, captured.err


def assert_user_error(code: int, err: str, *words: str) -> None:
    """Exit 2 with ``error:`` and ``hint:`` lines, and the words that say what was wrong."""
    assert code == 2, err
    assert "error:" in err and "hint:" in err, err
    for word in words:
        assert word in err, (word, err)


def jsonl(path: Path, *rows: object) -> Path:
    path.write_bytes(b"".join(r if isinstance(r, bytes) else json.dumps(r).encode() + b"\n" for r in rows))
    return path


# ---- item 1: refused at the door, in UTC ---------------------------------------------------------
@pytest.mark.parametrize("at", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:00:00-05:00"])
def test_1_a_timestamp_the_stores_cannot_give_back_is_refused(
    home: Path, capsys: pytest.CaptureFixture[str], at: str
) -> None:
    code, _, err = cli(capsys, "add", "x", "--agent", "dates", "--at", at)
    assert_user_error(code, err, "out of range", "UTC")
    path = jsonl(home / "dates.jsonl", {"text": "old", "created_at": at}, {"text": "fine", "created_at": "2026-01-01"})
    code, out, err = cli(capsys, "import", str(path), "--agent", "dates", "--json")
    assert code == 2, err
    assert [b["line"] for b in json.loads(out)["invalid"]] == [1] and json.loads(out)["inserted"] == 1
    code, _, err = cli(capsys, "query", "--agent", "dates", "--until", "2000-01-01")
    assert code == 0, err
    code, out, err = cli(capsys, "sync", "--json")
    assert code == 0 and not any(json.loads(out)["pending"].values()), err


# ---- item 2: an id of another agent is a conflict, never a move ---------------------------------
def test_2_an_id_of_another_agent_is_refused_on_the_command_line_and_in_an_import(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, victim_id, _ = cli(capsys, "add", "victim's secret", "--agent", "victim")
    victim_id = victim_id.strip()
    code, _, err = cli(capsys, "add", "attacker text", "--agent", "attacker", "--id", victim_id)
    assert_user_error(code, err, "another agent")
    new = str(uuid.uuid4())
    rows = ({"id": victim_id, "text": "moved"}, {"id": new, "text": "the attacker's own"})
    for args in (["--agent", "attacker"], []):  # forced agent, and the agent named by the line
        lines = [{**r, "agent_id": "attacker"} if not args else r for r in rows]
        code, out, err = cli(capsys, "import", str(jsonl(home / "steal.jsonl", *lines)), *args, "--json")
        report = json.loads(out)
        assert code == 2, err
        assert [(b["line"], "another agent" in b["error"]) for b in report["invalid"]] == [(1, True)]
    code, out, err = cli(capsys, "import", str(home / "steal.jsonl"), "--strict", "--json")
    assert code == 2 and json.loads(out)["inserted"] == 0
    code, out, _ = cli(capsys, "get", victim_id, "--json")
    stored = json.loads(out)
    assert (stored["agent_id"], stored["text"]) == ("victim", "victim's secret")
    code, out, _ = cli(capsys, "query", "secret", "--agent", "victim", "--json")
    assert [h["id"] for h in json.loads(out)["hits"]] == [victim_id]
    code, out, _ = cli(capsys, "get", new, "--json")
    assert json.loads(out)["agent_id"] == "attacker"


def test_2_over_http_and_through_the_service_socket(service: Served, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, data = service.request("/v1/add", {"text": "victim over http", "agent": "victim2"})
    assert status == 200
    victim_id = data["id"]
    status, _, data = service.request("/v1/add", {"text": "mine now", "agent": "attacker2", "id": victim_id})
    assert status == 409 and "another agent" in data["error"] and data["hint"] and data["exit_code"] == 2
    body = json.dumps({"id": victim_id, "text": "moved"}).encode() + b"\n" + b'{"text": "fresh"}\n'
    status, head, data = service.request("/v1/import?agent=attacker2", body, headers={"Content-Type": "x"})
    assert status == 200 and head.get("Memoryctl-Exit-Code") == "2"
    assert [b["line"] for b in data["invalid"]] == [1] and data["inserted"] == 1
    status, _, data = service.request("/v1/get", {"id": victim_id})
    assert (data["agent_id"], data["text"]) == ("victim2", "victim over http")
    # The CLI finds the service on its socket: the 409 is an error, not "the configuration differs".
    code, _, err = cli(capsys, "add", "again", "--agent", "attacker2", "--id", victim_id)
    assert_user_error(code, err, "another agent")


# ---- item 7: no tracebacks ---------------------------------------------------------------------
def test_7_invalid_utf8_lines_are_reported_and_skipped(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = jsonl(home / "utf8.jsonl", {"text": "first"}, b'{"text": "caf\xe9"}\n', b"\xff\xfe\n", {"text": "last"})
    code, out, err = cli(capsys, "import", str(path), "--agent", "utf8", "--json")
    report = json.loads(out)
    assert code == 2, err
    assert [b["line"] for b in report["invalid"]] == [2, 3]
    assert all("UTF-8" in b["error"] for b in report["invalid"]) and report["inserted"] == 2


def test_7_invalid_utf8_through_the_service(service: Served, home: Path) -> None:
    status, head, data = service.request("/v1/import?agent=utf8http", b'{"text": "ok"}\n\xff\n{"text": "ok2"}\n')
    assert status == 200 and head.get("Memoryctl-Exit-Code") == "2", data
    assert [b["line"] for b in data["invalid"]] == [2] and data["inserted"] == 2


@pytest.mark.parametrize(
    "args",
    [
        ["query", "x", "--since", "99999999d"],
        ["query", "x", "--since", "9999999999999d"],
        ["query", "x", "--where", "sentiment < NaN"],
        ["query", "x", "--where", "sentiment > -Infinity"],
        ["stats", "--since", "99999999d"],
        ["query", "x", "--hops", "9"],  # harness: a declared range or choice refused without a hint
        ["query", "x", "--combine", "xor"],
    ],
)
def test_7_values_out_of_range_are_usage_errors(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    code, _, err = cli(capsys, *args)
    assert_user_error(code, err)


def test_7_nan_over_http_is_a_400(service: Served) -> None:
    for where in ("sentiment < NaN", "sentiment > -Infinity"):
        status, _, data = service.request("/v1/query", {"text": "x", "where": [where]})
        assert status == 400 and data["hint"], data


# ---- item 8: text is never read as terminal markup ----------------------------------------------
@pytest.mark.parametrize("text", ["only [/] here", "Eve said [red]hello[/red] and [x] ok", "[bold]x[/bold] [link=y]z"])
def test_8_text_prints_as_written(capsys: pytest.CaptureFixture[str], text: str) -> None:
    code, mid, _ = cli(capsys, "add", text, "--agent", "markup", "--meta", f"note={text}", "--entity", f"User:{text}")
    assert code == 0
    code, out, err = cli(capsys, "get", mid.strip())
    assert code == 0 and text in out, (out, err)
    code, out, err = cli(capsys, "query", "--agent", "markup", "--where", f"note = {json.dumps(text)}")
    assert code == 0 and text in out.replace("\n", ""), out


def test_8_the_health_table_keeps_brackets(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = cli(capsys, "health")
    assert "[vllm] url is not configured" in out


# ---- item 9: --where quoting a user can predict --------------------------------------------------
def test_9_quotes_are_kept_or_refused(capsys: pytest.CaptureFixture[str]) -> None:
    value = "'; DROP TABLE memories; --"
    code, mid, _ = cli(capsys, "add", "quoted", "--agent", "quotes", "--meta", f"note={value}")
    code, _, err = cli(capsys, "query", "--agent", "quotes", "--where", f"note = {value}")
    assert_user_error(code, err, "unbalanced")
    sql_quoted = "'" + value.replace("'", "''") + "'"
    for where in (f"note = {sql_quoted}", f"note = {json.dumps(value)}", f"note in {sql_quoted}, other"):
        code, out, err = cli(capsys, "query", "--agent", "quotes", "--where", where, "--json")
        assert code == 0, err
        assert [h["id"] for h in json.loads(out)["hits"]] == [mid.strip()], where


# ---- item 10: the smaller ones ---------------------------------------------------------------------
def test_10_messages_and_exit_codes(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = jsonl(home / "ten.jsonl", {"text": "good"}, {"text": 123}, b"{not json\n")
    code, _, err = cli(capsys, "import", str(path), "--agent", "ten", "--strict")
    assert_user_error(code, err, "--strict")
    code, out, err = cli(capsys, "import", str(path), "--agent", "ten", "--json")
    assert code == 2, err  # only bad lines, every store healthy: bad input
    assert json.loads(out)["invalid"][0]["error"] == "memory text must be a string, not int"
    code, _, err = cli(capsys, "get", "not-a-uuid")
    assert_user_error(code, err, "not a UUID")


# ---- found by the hostile-client harness (tests/e2e/test_hostile_clients.py) ----------------------
def test_harness_a_non_ascii_token_is_a_401(service: Served) -> None:
    status, _, data = service.request("/v1/query", {"text": "x"}, token="\xab\xa1 \x86t")
    assert status == 401 and data["error"], data


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/add", {"text": "\ud800"}),
        ("/v1/add", {"text": "ok", "metadata": {"k": ["\udfff"]}}),
        ("/v1/add", {"text": "ok", "entities": ["User:a\ud800"]}),
        ("/v1/query", {"text": "\ud800"}),
        ("/v1/query", {"text": "x", "where": ["note = '\ud800'"]}),
        ("/v1/health", {"deadline": 9287082278146372.0}),
        ("/v1/health", {"deadline": -1}),
        ("/v1/query", {"text": "x", "hops": 9}),
        ("/v1/query", {"text": "x", "combine": "xor"}),
    ],
)
def test_harness_unpaired_surrogates_and_wild_deadlines_are_400s(
    service: Served, path: str, body: dict[str, object]
) -> None:
    """An unpaired surrogate is valid JSON (``"\\ud800"``) and no store can hold it: it was a 500
    with a traceback (UnicodeEncodeError), or a 503 from PostgreSQL's JSON parser."""
    status, _, data = service.request(path, body)
    assert status == 400 and data["hint"], data


def test_harness_an_import_line_with_a_surrogate_is_a_bad_line(service: Served) -> None:
    status, head, data = service.request("/v1/import?agent=surrogates", b'{"text": "\\ud800"}\n{"text": "fine"}\n')
    assert status == 200 and head.get("Memoryctl-Exit-Code") == "2"
    assert [b["line"] for b in data["invalid"]] == [1] and data["inserted"] == 1


def test_harness_forget_is_all_or_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """`forget KNOWN UNKNOWN` exited 1 "no memory UNKNOWN" and forgot KNOWN all the same."""
    _, known, _ = cli(capsys, "add", "keep me", "--agent", "forget")
    code, _, err = cli(capsys, "forget", known.strip(), str(uuid.uuid4()))
    assert code == 1 and "no memory" in err and "nothing was forgotten" in err
    _, out, _ = cli(capsys, "get", known.strip(), "--json")
    assert json.loads(out)["deleted_at"] is None


def test_harness_an_import_of_bad_lines_says_error_in_every_output_mode(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "import", str(jsonl(home / "bad-only.jsonl", {"nope": 1})), "--json")
    assert_user_error(code, err, "invalid line")
    assert json.loads(out)["invalid"][0]["line"] == 1


def test_harness_a_client_gone_mid_body_leaves_no_traceback(service: Served, home: Path) -> None:
    """Found after the move to uvicorn: a request cut short was logged as a failure with a
    traceback (starlette's ClientDisconnect); it is the client's doing, answered 400 if anyone listens."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(service.url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as conn:
        conn.sendall(
            b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {service.token}\r\nContent-Length: 100\r\n\r\n".encode()
            + b'{"text": '
        )
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(65536):
            pass
    status, _, _ = service.request("/v1/status", method="GET")  # the service is fine, and it logged no bug
    assert status == 200
    assert "Traceback" not in (home / "serve.log").read_text(errors="replace")


@pytest.mark.parametrize("pair", ["k=NaN", "k=[1, Infinity]", 'k={"x": -Infinity}'])
def test_harness_meta_nan_or_infinity_is_refused_through_the_service(
    service: Served, capsys: pytest.CaptureFixture[str], pair: str
) -> None:
    """Found by the harness (seed 2908675482): Python's JSON reader takes NaN/Infinity in a --meta
    value, the service's client cannot send it: a ValueError traceback through the socket."""
    code, _, err = cli(capsys, "add", "meta with a constant", "--agent", "consts", "--meta", pair)
    assert_user_error(code, err, "is not a number JSON can hold")
    code, out, err = cli(capsys, "add", "meta as text", "--agent", "consts", "--meta", 'k="NaN"', "--json")
    assert code == 0, err
    code, out, _ = cli(capsys, "get", json.loads(out)["id"], "--json")
    assert json.loads(out)["metadata"] == {"k": "NaN"}
