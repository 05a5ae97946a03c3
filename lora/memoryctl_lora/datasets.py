"""Training sets built from plain rows (pure Python: no torch, no database driver).

The lead's nightly job reads PostgreSQL (recall/feedback events joined to memories, or dialogue
memories) and hands the rows here as mappings. Keeping the builders free of I/O makes them easy to
unit-test and lets the same code run on exported JSONL.

Two decisions worth knowing:

* **Held-out split by hashing an id**, not by random sampling: an example stays on the same side
  of the split across nightly runs and machines, so "recall@k on the held-out slice" measured for
  yesterday's adapter and today's candidate is measured on comparable data, and a query never leaks
  from held-out into training when the data set grows.
* **Too little data is a normal outcome**, returned as :class:`Skipped` with the reason and the
  counts — the nightly run records "skipped", it does not fail (and cron does not page anyone).
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .manifest import DataWindow


@dataclass(frozen=True)
class Skipped:
    """Training was not attempted; ``reason`` is for the run record and the operator."""

    reason: str
    counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class EmbeddingPair:
    """A query and the memory text that answered it (recalled and judged useful).

    ``group`` decides the split side: all pairs of one query share it, so a query is never
    in both training and held-out data.
    """

    id: str
    query: str
    positive_id: str
    positive: str
    group: str


@dataclass(frozen=True)
class GenerationExample:
    """An instruction and the response the model should learn to produce."""

    id: str
    instruction: str
    response: str
    group: str


_E = TypeVar("_E", EmbeddingPair, GenerationExample)


@dataclass(frozen=True)
class _Dataset(Generic[_E]):
    """Examples on the two sides of the held-out split, each sorted by id."""

    train: tuple[_E, ...]
    heldout: tuple[_E, ...]
    window: DataWindow | None = None
    dropped: int = 0  # rows rejected (empty text, duplicates)

    def counts(self) -> dict[str, int]:
        return {"train": len(self.train), "heldout": len(self.heldout), "dropped": self.dropped}


class EmbeddingDataset(_Dataset[EmbeddingPair]):
    """(query, positive) pairs for contrastive training."""


class GenerationDataset(_Dataset[GenerationExample]):
    """Instruction/response pairs for causal-LM training."""


def split_bucket(key: str, salt: str = "memoryctl-lora-heldout-v1") -> float:
    """Map ``key`` to a stable number in [0, 1): the held-out side is ``bucket < fraction``.

    sha256 rather than ``hash()``: Python's string hash is randomised per process.
    """
    digest = hashlib.sha256(f"{salt}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def is_heldout(key: str, fraction: float) -> bool:
    return split_bucket(key) < fraction


def _text(row: Mapping[str, Any], name: str) -> str:
    value = row.get(name)
    return value.strip() if isinstance(value, str) else ""


def build_embedding_dataset(
    rows: Iterable[Mapping[str, Any]],
    *,
    min_examples: int,
    min_heldout: int,
    heldout_fraction: float,
    window: DataWindow | None = None,
) -> EmbeddingDataset | Skipped:
    """Build (query, positive) pairs for contrastive training with in-batch negatives.

    Each row: ``id`` (unique, e.g. the feedback event id), ``query``, ``positive`` (memory text),
    ``positive_id`` (memory UUID) and optionally ``query_id`` (groups pairs of one query; defaults
    to the query text itself, so identical queries land on the same side of the split).
    Rows with empty text and repeated (query, positive_id) pairs are dropped.
    """
    train, heldout, dropped = _split(rows, _embedding_pair, lambda p: (p.query, p.positive_id), heldout_fraction)
    skipped = _too_small(train, heldout, dropped, min_examples, min_heldout)
    return skipped or EmbeddingDataset(train, heldout, window, dropped)


def _embedding_pair(row: Mapping[str, Any]) -> EmbeddingPair | None:
    query, positive = _text(row, "query"), _text(row, "positive")
    positive_id = str(row.get("positive_id") or "")
    if not query or not positive or not positive_id:
        return None
    group = str(row.get("query_id") or query)
    return EmbeddingPair(str(row.get("id") or f"{group}:{positive_id}"), query, positive_id, positive, group)


def build_generation_dataset(
    rows: Iterable[Mapping[str, Any]],
    *,
    min_examples: int,
    min_heldout: int,
    heldout_fraction: float,
    window: DataWindow | None = None,
) -> GenerationDataset | Skipped:
    """Build instruction/response pairs. Each row: ``id``, ``instruction``, ``response``, optional
    ``group`` (e.g. the conversation id, so one conversation is not split across both sides)."""
    train, heldout, dropped = _split(rows, _generation_example, lambda e: (e.instruction, e.response), heldout_fraction)
    skipped = _too_small(train, heldout, dropped, min_examples, min_heldout)
    return skipped or GenerationDataset(train, heldout, window, dropped)


def _generation_example(row: Mapping[str, Any]) -> GenerationExample | None:
    instruction, response = _text(row, "instruction"), _text(row, "response")
    if not instruction or not response:
        return None
    ex_id = str(row.get("id") or hashlib.sha256(f"{instruction}\0{response}".encode()).hexdigest()[:16])
    return GenerationExample(ex_id, instruction, response, str(row.get("group") or ex_id))


def _split(
    rows: Iterable[Mapping[str, Any]],
    example: Callable[[Mapping[str, Any]], _E | None],
    key: Callable[[_E], tuple[str, str]],
    heldout_fraction: float,
) -> tuple[tuple[_E, ...], tuple[_E, ...], int]:
    """Each row's example (``example`` gives None for an unusable row) on its group's side of the split,
    the sides sorted by id; rows without an example and repeats of an earlier ``key`` are dropped.
    Returns (train, heldout, dropped)."""
    seen: set[tuple[str, str]] = set()
    train: list[_E] = []
    heldout: list[_E] = []
    dropped = 0
    for row in rows:
        ex = example(row)
        if ex is None or key(ex) in seen:
            dropped += 1
            continue
        seen.add(key(ex))
        (heldout if is_heldout(ex.group, heldout_fraction) else train).append(ex)
    return _by_id(train), _by_id(heldout), dropped


def pairs_from_turns(turns: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Turn an ordered dialogue (rows with ``id``, ``role``, ``text``, optional ``conversation_id``)
    into instruction/response rows: each user turn followed by an assistant turn becomes one pair.
    Useful when the generation data are memories of kind "dialogue turn"."""
    out: list[dict[str, str]] = []
    for prev, cur in itertools.pairwise(turns):
        same_conv = prev.get("conversation_id") == cur.get("conversation_id")
        if same_conv and prev.get("role") == "user" and cur.get("role") == "assistant":
            out.append(
                {
                    "id": str(cur.get("id")),
                    "instruction": str(prev.get("text") or ""),
                    "response": str(cur.get("text") or ""),
                    "group": str(cur.get("conversation_id") or cur.get("id")),
                }
            )
    return out


def _too_small(
    train: Sequence[Any], heldout: Sequence[Any], dropped: int, min_examples: int, min_heldout: int
) -> Skipped | None:
    counts = {"train": len(train), "heldout": len(heldout), "dropped": dropped}
    if len(train) < min_examples:
        return Skipped(f"only {len(train)} training examples (minimum {min_examples})", counts)
    if len(heldout) < min_heldout:
        return Skipped(f"only {len(heldout)} held-out examples (minimum {min_heldout})", counts)
    return None


def _by_id(items: list[_E]) -> tuple[_E, ...]:
    """Sorted by id so the dataset (and hence training) does not depend on the order rows came in."""
    return tuple(sorted(items, key=lambda e: e.id))


def contrastive_batches(
    pairs: Sequence[EmbeddingPair], batch_size: int, *, seed: int, epoch: int = 0
) -> Iterator[list[EmbeddingPair]]:
    """Yield shuffled batches in which no memory and no query appears twice.

    With in-batch negatives every other positive in the batch is a negative for a query; two pairs
    sharing a positive (or the same query) would teach the model to push a correct answer away.
    Deterministic for a given (seed, epoch). Pairs that cannot be placed without a clash carry
    over to the next batch; a final batch with a single pair (no negative) is dropped.
    """
    order = list(pairs)
    random.Random(f"{seed}:{epoch}").shuffle(order)
    pending = order
    while pending:
        batch: list[EmbeddingPair] = []
        used_pos: set[str] = set()
        used_q: set[str] = set()
        rest: list[EmbeddingPair] = []
        for p in pending:
            if len(batch) < batch_size and p.positive_id not in used_pos and p.query not in used_q:
                batch.append(p)
                used_pos.add(p.positive_id)
                used_q.add(p.query)
            else:
                rest.append(p)
        if len(batch) < 2:
            return
        yield batch
        pending = rest


def endless_contrastive_batches(
    pairs: Sequence[EmbeddingPair], batch_size: int, *, seed: int
) -> Iterator[list[EmbeddingPair]]:
    """Cycle through epochs (re-shuffled each epoch) so training is driven by a step count."""
    epoch = 0
    while True:
        produced = False
        for batch in contrastive_batches(pairs, batch_size, seed=seed, epoch=epoch):
            produced = True
            yield batch
        if not produced:
            raise ValueError("not enough distinct pairs to form a batch of two")
        epoch += 1
