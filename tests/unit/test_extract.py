"""Extractors: the rules on real and hostile text; the LLM extractor against a stand-in vLLM.

``StandInChatServer`` is a stand-in for vLLM's POST /v1/chat/completions on 127.0.0.1: it records
the request (so the JSON-schema request shape is checked) and answers with whatever assistant
content the test scripts — valid, invalid, hostile — since a real Qwen cannot be run here.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from memoryctl.config import ExtractorSettings, VllmSettings
from memoryctl.errors import ConfigError
from memoryctl.extract import (
    THIS_MEMORY,
    Extraction,
    Extractor,
    LlmExtractor,
    NoExtractor,
    RulesExtractor,
    make_extractor,
)
from memoryctl.extract.base import MAX_ENTITIES
from memoryctl.extract.llm import LLM_RELATION_TYPES, SCHEMA
from memoryctl.http_service import Retry
from memoryctl.model import EntityRef, MemoryRef, Relation


def pairs(ex: Extraction) -> set[tuple[str, str]]:
    return {(e.type, e.name) for e in ex.entities}


RULES = RulesExtractor()

# ------------------------------------------------------------------------------------- rules


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ping @alice and @bob_2 about it", {("User", "alice"), ("User", "bob_2")}),
        ("mail alice@example.com, not @example", {("Email", "alice@example.com"), ("User", "example")}),
        ("thanks @here and @channel", set()),
        ("#release-2 and #Infra, not #1 or #ff0000 or &#39;", {("Topic", "release-2"), ("Topic", "Infra")}),
        ("fixed in OPS-42 and PAY-7; see ABC-123.", {("Ticket", "OPS-42"), ("Ticket", "PAY-7"), ("Ticket", "ABC-123")}),
        ("UTF-8, SHA-256, ISO-8601, COVID-19, GPT-4, CVE-2024-1234, ab-12, AB-012", set()),
        (
            "docs at https://example.com/a_(b) and (https://x.org/p?q=1#frag).",
            {("Document", "https://example.com/a_(b)"), ("Document", "https://x.org/p?q=1#frag")},
        ),
        ("javascript:alert(1) ftp://x.org www.example.com", set()),
        ("Reviewed Alice Smith's PR with Bob Jones on Monday.", {("Entity", "Alice Smith"), ("Entity", "Bob Jones")}),
        (
            "Yesterday Grace Hopper met Zoë Åström in New York.",
            {("Entity", "Grace Hopper"), ("Entity", "Zoë Åström"), ("Entity", "New York")},
        ),
        ("The Quick Brown Fox Jumps Over The Lazy Dog", set()),  # a Title Case Headline
        ("I think This Is fine. The meeting is on Monday.", set()),
        ("Alice said hi. Bob left.", set()),  # single capitalised words are not names
        ("", set()),
    ],
)
def test_rules_cases(text: str, expected: set[tuple[str, str]]) -> None:
    ex = RULES.extract(text)
    assert pairs(ex) == expected
    assert ex.relations == [] and ex.dropped == 0


def test_rules_masks_urls_and_emails_before_other_rules() -> None:
    ex = RULES.extract("see https://jira.example.com/browse/OPS-1#comment-2 and ops-team@corp.example.com")
    assert pairs(ex) == {
        ("Document", "https://jira.example.com/browse/OPS-1#comment-2"),
        ("Email", "ops-team@corp.example.com"),
    }


def test_rules_dedupes_by_normalised_name() -> None:
    ex = RULES.extract("@Alice @alice @ALICE #Ops #ops")
    assert [(e.type, e.name) for e in ex.entities] == [("User", "Alice"), ("Topic", "Ops")]


def test_rules_is_deterministic_and_can_skip_names() -> None:
    text = "Ada Lovelace asked @bob about OPS-9"
    assert RULES.extract(text) == RULES.extract(text)
    assert pairs(RulesExtractor(proper_names=False).extract(text)) == {("User", "bob"), ("Ticket", "OPS-9")}


@pytest.mark.parametrize(
    "text",
    [
        "a" * 100_000,
        "@" * 100_000,
        "#" * 100_000,
        "a." * 50_000,
        ("a" * 60 + "@") * 1_600,
        "a@" + "b." * 49_990,
        "Aa " * 33_000,
        "http://" + "a" * 99_990,
        "A-1 AB-" * 14_000,
        "\x00\x01@x\x02 #y\x7f \u202e ABC-1\u200b " * 8_000,
        "'" * 50_000 + "Ab" * 25_000,
    ],
)
@pytest.mark.timeout(300)  # a hang guard, not a figure: a quadratic pattern takes far longer on these
def test_rules_hostile_text_is_safe(text: str) -> None:
    ex = RULES.extract(text)
    assert len(ex.entities) <= MAX_ENTITIES
    for e in ex.entities:  # everything that came out is a valid, re-constructible EntityRef
        assert EntityRef(e.type, e.name) == e and len(e.name) <= 512


def test_rules_caps_entities_and_counts_the_rest() -> None:
    ex = RULES.extract(" ".join(f"@user{i}" for i in range(MAX_ENTITIES + 10)))
    assert len(ex.entities) == MAX_ENTITIES and ex.dropped == 10


def test_none_extractor_and_factory() -> None:
    assert NoExtractor().extract("@alice OPS-1") == Extraction()
    assert isinstance(make_extractor(ExtractorSettings()), RulesExtractor)  # the default
    assert isinstance(make_extractor(ExtractorSettings(kind="none")), NoExtractor)
    with pytest.raises(ConfigError, match=r"vllm\.url"):
        make_extractor(ExtractorSettings(kind="llm"), VllmSettings())  # off unless configured
    llm = make_extractor(ExtractorSettings(kind="llm"), VllmSettings(url="http://127.0.0.1:9"))
    assert isinstance(llm, LlmExtractor) and isinstance(llm, Extractor)
    llm.close()


def test_bind_replaces_the_placeholder() -> None:
    mid = uuid.uuid4()
    alice = EntityRef("User", "Alice")
    ex = Extraction([alice], [Relation(alice, "AUTHORED", THIS_MEMORY)]).bind(mid)
    assert ex.relations == [Relation(alice, "AUTHORED", MemoryRef(mid))]


# ----------------------------------------------------------------------- llm: stand-in server


class _Handler(BaseHTTPRequestHandler):
    server: StandInChatServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        status, payload = self.server.reply
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.server.release.wait()  # a test can hold the answer back (the client's timeout)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        try:
            self.wfile.write(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up first (the timeout test)


class StandInChatServer(ThreadingHTTPServer):
    """A stand-in for vLLM's POST /v1/chat/completions returning scripted assistant content."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[dict[str, Any]] = []
        self.reply: tuple[int, Any] = (200, completion({"entities": [], "relations": []}))
        self.release = threading.Event()
        self.release.set()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def answer(self, content: Any) -> None:
        self.reply = (200, completion(content))


def completion(content: Any) -> dict[str, Any]:
    text = content if isinstance(content, str) else json.dumps(content)
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion",
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
    }


@pytest.fixture()
def vllm() -> Iterator[StandInChatServer]:
    srv = StandInChatServer()
    yield srv
    srv.shutdown()
    srv.server_close()


def llm_for(srv: StandInChatServer, *, retries: int = 1, **kw: Any) -> LlmExtractor:
    """The extractor's default retries, with a short backoff so the failing cases finish quickly."""
    return LlmExtractor(
        srv.url + "/v1", "Qwen/Qwen2.5-7B-Instruct", api_key="k", retry=Retry(retries, backoff_s=0.01), **kw
    )


def test_llm_request_shape_is_vllm_json_schema(vllm: StandInChatServer) -> None:
    llm_for(vllm).extract("Alice fixed the login bug.")
    (req,) = vllm.requests
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer k"
    body = req["body"]
    assert body["model"] == "Qwen/Qwen2.5-7B-Instruct" and body["temperature"] == 0
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "memoryctl_extraction", "schema": SCHEMA, "strict": True},
    }
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][1]["content"] == "Alice fixed the login bug."
    assert "MENTIONS" not in LLM_RELATION_TYPES


def test_llm_valid_answer(vllm: StandInChatServer) -> None:
    vllm.answer(
        {
            "entities": [{"type": "Person", "name": "Alice"}, {"type": "Project", "name": "Login"}],
            "relations": [
                {"source": "Alice", "type": "works_on", "target": "login"},
                {"source": "alice", "type": "AUTHORED", "target": "this"},
            ],
        }
    )
    mid = uuid.uuid4()
    ex = llm_for(vllm, merge_fallback=False, fallback=RULES).extract("Alice fixed the login bug.", mid)
    alice, login = EntityRef("Person", "Alice"), EntityRef("Project", "Login")
    assert ex.entities == [alice, login] and ex.dropped == 0 and ex.degraded is None
    assert ex.relations == [Relation(alice, "WORKS_ON", login), Relation(alice, "AUTHORED", MemoryRef(mid))]
    # without a memory id the placeholder is used
    assert llm_for(vllm).extract("Alice fixed the login bug.").relations[1].target == THIS_MEMORY


def test_llm_merges_exact_rule_entities(vllm: StandInChatServer) -> None:
    vllm.answer({"entities": [{"type": "Person", "name": "Bob"}], "relations": []})
    ex = llm_for(vllm, fallback=RULES).extract("Bob closed OPS-7, see https://x.org/a")
    assert pairs(ex) == {("Person", "Bob"), ("Ticket", "OPS-7"), ("Document", "https://x.org/a")}


def test_llm_invalid_items_are_dropped_and_counted(vllm: StandInChatServer) -> None:
    vllm.answer(
        {
            "entities": [
                {"type": "Person", "name": "Alice"},
                {"type": "User; DETACH DELETE n //", "name": "Mallory"},  # not an identifier
                {"type": "Person", "name": "bad\x00name"},  # control character
                {"type": "Person", "name": "   "},  # blank
                {"type": "Person", "name": "Eve", "cypher": "MATCH (n) DELETE n"},  # extra key
                {"type": "Company", "name": "alice"},  # same name, other type: ambiguous
                "Bob",  # not an object
            ],
            "relations": [
                {"source": "Alice", "type": "DELETE_ALL", "target": "this"},  # not whitelisted
                {"source": "Alice", "type": "MENTIONS", "target": "this"},  # memoryctl's own
                {"source": "Alice", "type": "KNOWS", "target": "Nobody"},  # unknown endpoint
                {"source": "Alice", "type": "KNOWS", "target": "Alice"},  # self loop
                {"source": "Alice", "type": "KNOWS", "target": "this", "x": 1},  # extra key
                {"source": "Alice", "type": "AUTHORED", "target": "this"},  # the one valid relation
                {"source": "Alice", "type": "AUTHORED", "target": "this"},  # duplicate: kept once
            ],
        }
    )
    ex = llm_for(vllm, merge_fallback=False, fallback=RULES).extract("text", uuid.UUID(int=5))
    assert ex.entities == [EntityRef("Person", "Alice")]
    assert ex.relations == [Relation(EntityRef("Person", "Alice"), "AUTHORED", MemoryRef(uuid.UUID(int=5)))]
    assert ex.dropped == 6 + 5 and ex.degraded is None


@pytest.mark.parametrize(
    "content",
    ["not json at all", '```json\n{"entities": []}\n```', json.dumps([1, 2]), json.dumps({"entities": "x"})],
)
def test_llm_malformed_answer_falls_back_to_rules(vllm: StandInChatServer, content: str) -> None:
    vllm.answer(content)
    ex = llm_for(vllm, fallback=RULES).extract("ping @alice about OPS-3")
    assert pairs(ex) == {("User", "alice"), ("Ticket", "OPS-3")}
    assert ex.degraded and ex.dropped == 1
    bare = llm_for(vllm).extract("ping @alice")  # no fallback: nothing, but says why
    assert bare.entities == [] and bare.degraded


def test_llm_server_errors_degrade_with_bounded_retries(vllm: StandInChatServer) -> None:
    vllm.reply = (500, {"error": {"message": "boom"}})
    ex = llm_for(vllm, fallback=RULES, retries=2).extract("@carol")
    assert pairs(ex) == {("User", "carol")} and ex.degraded and "unavailable" in ex.degraded
    assert len(vllm.requests) == 3
    vllm.requests.clear()
    vllm.reply = (400, {"error": {"message": "response_format not supported"}})
    ex = llm_for(vllm, fallback=RULES, retries=2).extract("@carol")
    assert len(vllm.requests) == 1 and ex.degraded and "400" in ex.degraded  # not retried
    vllm.reply = (200, {"choices": []})
    assert "malformed" in (llm_for(vllm, fallback=RULES).extract("@carol").degraded or "")


def test_llm_timeout_degrades(vllm: StandInChatServer) -> None:
    vllm.release.clear()  # the server holds its answer until the client has given up
    try:
        ex = llm_for(vllm, fallback=RULES, timeout_s=0.2, retries=0).extract("@dave")
    finally:
        vllm.release.set()
    assert len(vllm.requests) == 1
    assert pairs(ex) == {("User", "dave")} and ex.degraded and "timed out" in ex.degraded
