"""Dataset builders: deterministic split, de-duplication, skips, clash-free contrastive batches."""

from __future__ import annotations

from datetime import UTC, datetime

from memoryctl_lora.datasets import (
    EmbeddingDataset,
    GenerationDataset,
    Skipped,
    build_embedding_dataset,
    build_generation_dataset,
    contrastive_batches,
    endless_contrastive_batches,
    is_heldout,
    pairs_from_turns,
    split_bucket,
)
from memoryctl_lora.manifest import DataWindow


def _rows(n: int, *, shared_positive_every: int = 0) -> list[dict[str, str]]:
    rows = []
    for i in range(n):
        pid = f"m{i // shared_positive_every}" if shared_positive_every else f"m{i}"
        rows.append(
            {"id": f"e{i}", "query": f"question number {i}", "positive": f"memory text {pid}", "positive_id": pid}
        )
    return rows


def test_split_is_stable_and_close_to_fraction() -> None:
    # Same key → same side, independent of process (sha256, not hash()).
    assert split_bucket("abc") == split_bucket("abc")
    assert 0.0 <= split_bucket("abc") < 1.0
    share = sum(is_heldout(f"k{i}", 0.2) for i in range(5000)) / 5000
    assert 0.17 < share < 0.23


def test_embedding_dataset_split_dedup_and_order_independence() -> None:
    rows = _rows(200)
    rows.append(dict(rows[0]))  # duplicate (query, positive_id)
    rows.append({"id": "bad", "query": "  ", "positive": "x", "positive_id": "m"})  # empty query
    window = DataWindow(None, datetime(2026, 11, 29, tzinfo=UTC))
    ds = build_embedding_dataset(rows, min_examples=10, min_heldout=5, heldout_fraction=0.2, window=window)
    assert isinstance(ds, EmbeddingDataset)
    assert ds.dropped == 2
    assert len(ds.train) + len(ds.heldout) == 200
    assert not {p.group for p in ds.train} & {p.group for p in ds.heldout}
    assert ds.window == window
    ds2 = build_embedding_dataset(list(reversed(rows)), min_examples=10, min_heldout=5, heldout_fraction=0.2)
    assert isinstance(ds2, EmbeddingDataset)
    assert ds2.train == ds.train and ds2.heldout == ds.heldout
    # Growing the data never moves an existing example across the split.
    ds3 = build_embedding_dataset(_rows(400), min_examples=10, min_heldout=5, heldout_fraction=0.2)
    assert isinstance(ds3, EmbeddingDataset)
    assert {p.id for p in ds.heldout} <= {p.id for p in ds3.heldout}


def test_query_id_groups_pairs_on_one_side() -> None:
    rows = [
        {
            "id": f"e{i}",
            "query_id": f"q{i // 3}",
            "query": f"q{i // 3} text",
            "positive": f"m{i}",
            "positive_id": f"m{i}",
        }
        for i in range(300)
    ]
    ds = build_embedding_dataset(rows, min_examples=10, min_heldout=5, heldout_fraction=0.3)
    assert isinstance(ds, EmbeddingDataset)
    assert not {p.group for p in ds.train} & {p.group for p in ds.heldout}


def test_too_little_data_is_skipped_not_raised() -> None:
    s = build_embedding_dataset(_rows(5), min_examples=32, min_heldout=1, heldout_fraction=0.2)
    assert isinstance(s, Skipped) and "minimum 32" in s.reason
    assert s.counts["train"] + s.counts["heldout"] == 5
    s2 = build_embedding_dataset(_rows(40), min_examples=1, min_heldout=39, heldout_fraction=0.2)
    assert isinstance(s2, Skipped) and "held-out" in s2.reason
    assert isinstance(build_generation_dataset([], min_examples=1, min_heldout=1, heldout_fraction=0.2), Skipped)


def test_contrastive_batches_have_no_duplicate_positive_or_query() -> None:
    ds = build_embedding_dataset(
        _rows(120, shared_positive_every=3), min_examples=1, min_heldout=1, heldout_fraction=0.1
    )
    assert isinstance(ds, EmbeddingDataset)
    batches = list(contrastive_batches(ds.train, 8, seed=1))
    assert all(2 <= len(b) <= 8 for b in batches)
    for b in batches:
        assert len({p.positive_id for p in b}) == len(b)
        assert len({p.query for p in b}) == len(b)
    placed = [p.id for b in batches for p in b]
    assert len(placed) == len(set(placed))
    assert batches == list(contrastive_batches(ds.train, 8, seed=1))  # deterministic
    assert batches != list(contrastive_batches(ds.train, 8, seed=2))
    gen = endless_contrastive_batches(ds.train, 8, seed=1)
    assert len([next(gen) for _ in range(3 * len(batches))]) == 3 * len(batches)


def test_generation_dataset_and_turn_pairing() -> None:
    turns = []
    for c in range(60):
        turns += [
            {"id": f"{c}a", "conversation_id": f"c{c}", "role": "user", "text": f"hello {c}"},
            {"id": f"{c}b", "conversation_id": f"c{c}", "role": "assistant", "text": f"hi {c}!"},
        ]
    rows = pairs_from_turns(turns)
    assert len(rows) == 60  # never pairs across conversations
    assert rows[0] == {"id": "0b", "instruction": "hello 0", "response": "hi 0!", "group": "c0"}
    ds = build_generation_dataset(rows, min_examples=10, min_heldout=3, heldout_fraction=0.25)
    assert isinstance(ds, GenerationDataset)
    assert ds.counts()["train"] + ds.counts()["heldout"] == 60
