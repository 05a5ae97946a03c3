"""The question the dense leg embeds (``memoryctl.query.dense_question``), without stores."""

from __future__ import annotations

from memoryctl.query.dense_question import MAX_NAME_WORDS, grams, without


def test_grams_are_the_runs_of_words_a_name_could_be() -> None:
    assert grams("Bob's  Acme-Corp deal?") == [
        "bob",
        "s",
        "acme",
        "corp",
        "deal",
        "bob s",
        "s acme",
        "acme corp",
        "corp deal",
        "bob s acme",
        "s acme corp",
        "acme corp deal",
        "bob s acme corp",
        "s acme corp deal",
        "bob s acme corp deal",
    ]
    assert grams("a a a") == ["a", "a a", "a a a"]  # each once
    assert max(len(g.split()) for g in grams(" ".join(["w"] * 9) + " x")) == MAX_NAME_WORDS
    assert grams("?!") == []


def test_names_are_removed_as_whole_words_with_their_possessive() -> None:
    assert without("All the risks Bob raised", ["bob"]) == "All the risks raised"
    assert without("What is Bob's current team?", ["bob"]) == "What is current team?"
    assert without("what did bob\u2019s team ship", ["bob"]) == "what did team ship"
    # a name inside a word is no occurrence of it
    assert without("Bobby tables and bobsleigh", ["bob"]) is None
    # several words, whatever punctuation or spacing joins them; longest names first
    assert without("Did Acme  Corp. renew with Acme?", ["acme", "acme corp"]) == "Did . renew with ?"
    assert without("Alice and Bob at the summit", ["alice", "bob"]) == "and at the summit"


def test_a_question_that_is_only_names_is_kept() -> None:
    # nothing removed, or nothing but names and punctuation left: the caller embeds the question
    assert without("Alice", ["alice"]) is None
    assert without("Alice & Bob?", ["alice", "bob"]) is None
    assert without("rollback plan", ["alice"]) is None
    assert without("rollback plan", []) is None
