"""The LLM extractor's contract with vLLM, pinned to one vLLM version (tests/fixtures/vllm-0.19.1),
the one the product deploys (deploy/versions.py).

The schema the extractor sends must compile with the structured-output engine that vLLM version
uses — xgrammar, at the version the deploy installs — the way vLLM's xgrammar backend compiles it; the grammar
must accept the pinned answer and refuse answers the extractor would have to drop; the request the
extractor sends and the response it understands are the pinned fixtures. vLLM itself needs a GPU and
does not run here; xgrammar is a CPU-only Python package and does.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from memoryctl.extract.llm import LLM_RELATION_TYPES, SCHEMA, SYSTEM_PROMPT, LlmExtractor
from memoryctl.model import EntityRef, MemoryRef, Relation

VLLM_VERSION = "0.19.1"
# The xgrammar each vLLM release runs with: 0.33.0 pins it (``xgrammar==0.2.8`` in the wheel's
# ``requires_dist``); 0.19.1 allows ``>=0.1.32,<1.0.0``, so the deploy pins the one tested here
# (tests/fixtures/vllm-0.19.1/README.md: unpinned, a deploy resolved 0.2.9 on 2026-12-01).
VLLM_XGRAMMAR = {"0.19.1": "0.2.8", "0.33.0": "0.2.8"}
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / f"vllm-{VLLM_VERSION}"

xgr = pytest.importorskip("xgrammar", reason="xgrammar (the dev extra) is not installed")


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


def answer() -> str:
    content: str = fixture("chat_response.json")["choices"][0]["message"]["content"]
    return content


@pytest.fixture(scope="module")
def compiled() -> Any:
    """The schema compiled as vLLM's xgrammar backend does it (``compile_json_schema`` on the JSON
    text, any whitespace), with the tokenizer info built by ``TokenizerInfo.from_huggingface``."""
    from memoryctl_lora.train_generation import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=True)
    return compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=True), tokenizer


def accepts(compiled: Any, text: str) -> bool:
    """Could the constrained model have written exactly ``text`` and stopped there?"""
    grammar, tokenizer = compiled
    matcher = xgr.GrammarMatcher(grammar)
    return bool(matcher.accept_string(text) and matcher.accept_token(tokenizer.eos_token_id))


def test_the_installed_xgrammar_is_the_one_the_pinned_vllm_uses() -> None:
    assert importlib.metadata.version("xgrammar") == VLLM_XGRAMMAR[VLLM_VERSION]
    assert FIXTURES.is_dir(), FIXTURES


def test_schema_passes_vllms_validation_step_and_compiles(compiled: Any) -> None:
    """vLLM validates a json_schema request with ``Grammar.from_json_schema`` before scheduling it;
    a schema that fails there is an HTTP 400 for every extraction."""
    grammar = xgr.Grammar.from_json_schema(SCHEMA)
    assert "root" in str(grammar)
    assert isinstance(compiled[0], xgr.CompiledGrammar)


def test_schema_uses_only_what_xgrammar_enforces() -> None:
    """Keywords outside this set are either dropped silently by xgrammar (a string with both a
    pattern and length bounds keeps only the pattern) or make vLLM fall back to another backend."""
    allowed = {"type", "properties", "required", "additionalProperties", "items", "maxItems"}
    allowed |= {"pattern", "minLength", "maxLength", "enum"}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            keys = set(node) - {"properties"} if "properties" in node else set(node)
            if node.get("type") in ("object", "array", "string"):
                assert keys <= allowed, keys - allowed
                assert not ("pattern" in node and {"minLength", "maxLength"} & set(node)), node
            for key, value in node.items():
                walk(value if key != "properties" else {"type": "props", **value})
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(copy.deepcopy(SCHEMA))


def test_the_pinned_answer_is_accepted_and_understood(compiled: Any) -> None:
    assert accepts(compiled, answer())
    assert accepts(compiled, json.dumps(json.loads(answer()), separators=(",", ":")))  # any whitespace
    assert accepts(compiled, '{"entities": [], "relations": []}')


def _answer_with(change: Any) -> str:
    data = json.loads(answer())
    change(data)
    return json.dumps(data)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["entities"][0].update(cypher="MATCH (n) DETACH DELETE n"),  # extra key
        lambda d: d["entities"][0].update(type="User; DROP TABLE memories"),  # type pattern
        lambda d: d["entities"][0].update(type="9Lives"),  # type must start with a letter
        lambda d: d["entities"][0].update(name=""),  # minLength
        lambda d: d["entities"][0].update(name="n" * 201),  # maxLength
        lambda d: d["relations"][0].update(type="DELETE_ALL"),  # not in the whitelist
        lambda d: d["relations"][0].update(type="MENTIONS"),  # memoryctl writes MENTIONS itself
        lambda d: d["relations"][0].pop("target"),  # required
        lambda d: d.pop("relations"),  # required
        lambda d: d.update(extra=[]),  # additionalProperties false
        lambda d: d.update(entities=[{"type": "Person", "name": f"p{i}"} for i in range(65)]),  # maxItems
        lambda d: d["entities"].append("Bob"),  # items are objects
    ],
)
def test_the_grammar_refuses_answers_the_extractor_would_drop(compiled: Any, change: Any) -> None:
    assert not accepts(compiled, _answer_with(change))


def test_relation_type_enum_is_the_whitelist() -> None:
    enum = SCHEMA["properties"]["relations"]["items"]["properties"]["type"]["enum"]
    assert enum == list(LLM_RELATION_TYPES) and "MENTIONS" not in enum


def test_request_is_the_pinned_request() -> None:
    pinned = fixture("chat_request.json")
    extractor = LlmExtractor("http://127.0.0.1:9/v1", pinned["body"]["model"])
    try:
        body = extractor.request_body(pinned["request_text"])
    finally:
        extractor.close()
    assert body["messages"][0]["content"] == SYSTEM_PROMPT
    assert body["response_format"]["json_schema"]["schema"] == SCHEMA
    body["messages"][0]["content"] = "<SYSTEM_PROMPT>"
    body["response_format"]["json_schema"]["schema"] = "<SCHEMA>"
    assert body == pinned["body"]


def test_pinned_response_through_the_extractor(tmp_path: Path) -> None:
    """The pinned response, served over HTTP, becomes exactly these entities and relations."""
    from tests.unit.test_extract import StandInChatServer

    srv = StandInChatServer()
    srv.reply = (200, fixture("chat_response.json"))
    mid = uuid.uuid4()
    try:
        extractor = LlmExtractor(srv.url, "Qwen/Qwen2.5-7B-Instruct", merge_fallback=False)
        ex = extractor.extract(fixture("chat_request.json")["request_text"], mid)
        extractor.close()
    finally:
        srv.shutdown()
        srv.server_close()
    alice, bob = EntityRef("Person", "Alice"), EntityRef("Person", "Bob")
    ops, payments = EntityRef("Ticket", "OPS-42"), EntityRef("Project", "payments service")
    assert (ex.degraded, ex.dropped) == (None, 0)
    assert ex.entities == [alice, bob, ops, payments]
    assert ex.relations == [
        Relation(alice, "WORKS_ON", ops),
        Relation(ops, "BELONGS_TO", payments),
        Relation(bob, "RELATES_TO", MemoryRef(mid)),
        Relation(alice, "AUTHORED", MemoryRef(mid)),
    ]
