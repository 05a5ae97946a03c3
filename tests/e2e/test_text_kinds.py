"""Text that is not English words, on the embedded default (real PostgreSQL, Qdrant Edge, the
onnx MiniLM): Chinese, Japanese and Korean are scored by the lexical leg (schema 0010's character
bigrams), and a question of only emoji, which the model sees as its unknown token alone, is not
ranked by a meaningless vector (issue 27, item 3)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from memoryctl.client import MemoryClient
from memoryctl.config import load_settings
from memoryctl.model import Memory
from memoryctl.query.spec import MemoryQuery

pytestmark = pytest.mark.slow

AGENT = "texts"
TEXTS = {
    "zh-cat": "我喜欢猫\uff0c它们很可爱",
    "zh-weather": "今天天气很好\uff0c我们去公园吧",
    "zh-work": "明天上午开会讨论预算",
    "ja-cat": "猫が好きです",
    "ja-rain": "昨日は一日中雨でした",
    "ko-cat": "고양이가 정말 좋아요",
    "en-weather": "The weather is nice today, let's go to the park",
    "emoji-smile": "😀",
    "emoji-party": "🎉🎉",
    "en-party": "party time tonight 🎉",
}

Loaded = tuple[MemoryClient, dict[uuid.UUID, str]]  # the client and the name of each memory id


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    data = tmp_path_factory.mktemp("texts")
    with MemoryClient(load_settings(Path(os.devnull), profile="embedded", data_dir=data)) as c:
        c.init()
        ids = {uuid.uuid5(uuid.NAMESPACE_URL, name): name for name in TEXTS}
        c.add([Memory(id=i, agent_id=AGENT, text=TEXTS[n]) for i, n in ids.items()], extract=False)
        yield c, ids


def ask(c: Loaded, text: str, retrieval: str = "hybrid") -> list[tuple[str, dict[str, float]]]:
    client, ids = c
    result = client.query(MemoryQuery(text=text, agent_id=AGENT, limit=5, retrieval=retrieval))  # type: ignore[arg-type]
    assert result.degraded == []
    return [(ids[h.id], h.scores) for h in result.hits]


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("喜欢", {"zh-cat"}),  # a two-character word inside a clause
        ("天气怎么样", {"zh-weather"}),
        ("预算会议", {"zh-work"}),  # its words in another order
        ("猫", {"zh-cat", "ja-cat"}),  # one character: a word of its own
        ("好き", {"ja-cat"}),
        ("雨", {"ja-rain"}),
        ("고양이", {"ko-cat"}),  # Korean glues particles on (고양이가): the bigrams see through
    ],
)
def test_the_lexical_leg_scores_cjk_text(client: Loaded, question: str, expected: set[str]) -> None:
    hits = ask(client, question, "lexical")
    found = {name for name, scores in hits if scores.get("lexical", 0) > 0}
    assert found == expected, hits
    assert {name for name, _ in hits[: len(expected)]} == expected, hits


def test_cjk_in_the_hybrid_ranking(client: Loaded) -> None:
    hits = ask(client, "今天天气")
    assert hits[0][0] == "zh-weather", hits
    assert hits[0][1]["lexical"] > 0


def test_a_question_of_only_emoji_gets_no_vector_score(client: Loaded) -> None:
    c, _ = client
    result = c.query(MemoryQuery(text="🎉", agent_id=AGENT, limit=5))
    assert all("vector" not in h.scores for h in result.hits), [(h.memory.text, h.scores) for h in result.hits]
    assert any("dense leg did not rank" in n for n in result.notes), result.notes
    assert ask(client, "😀", "dense") == []
    # A question with words still ranks by meaning, emoji and all.
    party = ask(client, "party 🎉")
    assert party[0][0] == "en-party" and 0 < party[0][1]["vector"] < 1.0, party
