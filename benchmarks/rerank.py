"""The rerank stage on LoCoMo: depth and blend against recall, and its cost (issue 45).

Collect once, sweep offline: per question the engine's default (``--no-rerank``) top ``--depth``
with its first-stage scores, and the cross-encoder's logit for each of them
(``memoryctl.query.rerank.passage``: speaker, date, text), the two timed apart. Then every (depth, blend)
of the grid re-ranks those candidates with ``memoryctl.query.rerank.rerank`` itself (a scorer that
returns the logits already computed), so the figures are those of the engine's code path, without
the time budget (its cost is reported as the stage's p50/p95 per depth instead).

The same collection also scores each candidate read with the turn written just before it (issue 45's
"the turn with its neighbours": LoCoMo turns are often short replies whose meaning is in the turn
before): ``"Speaker (8 May 2023): previous text || Speaker: text"``, the previous turn being the
memory of the same agent written last before it within ``query/turns.py``'s ``CONTEXT_WITHIN`` (on
LoCoMo the turn before it in its session), truncated at ``--context-tokens`` (256; the longest pair
measured is 188 tokens, the current passage's 122). Both passes are timed, and the sweep prints the
cross-encoder's cost per pair both ways; the with-context methods are named ``ctx-d30-b0.5``…
(a collection made before this has no with-context logits, and its sweep has no such methods).

One grid for all conversations: nothing is chosen per conversation. ``--dump FILE`` writes every
method's ranking in ``benchmarks/paired.py``'s format (methods ``first-stage`` and ``d30-b0.5``…),
``--collected FILE`` keeps the collected candidates and logits so a sweep can be rerun without the
model (``--from FILE``). ``--embedder KIND`` builds the store with that embedder (as
``benchmarks/locomo.py --embedder``: the first stage is then that embedder's), and every collected row
records the embedder kind it was collected with (``"embedder"``; rows collected before this have none:
the default, ``onnx``). ``--context-tokens 0`` leaves the with-context pass out (half the cost).

    python benchmarks/rerank.py [--conversations 41,42] [--depth 30] [--depths 10,20,30]
        [--blends 0,0.25,0.5,0.75,1] [--dump FILE] [--collected FILE | --from FILE]
        [--context-tokens 256] [--sample-depths 10,20] [--embedder KIND] [--neighbour-weights 0.3]

``--neighbour-weights`` also sweeps a rule measured and not taken into the product (docs/retrieval.md,
"A candidate's neighbours"): the blended score plus a weight times the best cross-encoder
probability of the read turns right before and after it in its session.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import locomo  # noqa: E402
import recall  # noqa: E402
from conversations import SPEAKER_TYPE, Conversation  # noqa: E402

from memoryctl.model import EntityRef, Memory  # noqa: E402
from memoryctl.query.rerank import CrossEncoder, Reranked, RerankSettings, passage, rerank  # noqa: E402
from memoryctl.query.results import Hit  # noqa: E402
from memoryctl.query.spec import MemoryQuery  # noqa: E402
from memoryctl.query.turns import CONTEXT_WITHIN  # noqa: E402

SAMPLE = 10  # every tenth question also times the cross-encoder over the top 10 and 20
CONTEXT_TOKENS = 256  # question + previous turn + candidate (the current passage keeps rerank.MAX_TOKENS)


class Known:
    """A scorer answering with logits computed before, by passage."""

    def __init__(self, logits: dict[str, float]) -> None:
        self.logits = logits

    def scores(self, question: str, passages: Sequence[str]) -> list[float]:
        return [self.logits[p] for p in passages]

    def ready(self) -> None:
        pass


def context_passage(memory: Memory, before: Memory | None) -> str:
    """The candidate read after the turn written just before it (the with-context passage):
    ``"Speaker (8 May 2023): previous text || Speaker: text"``; the current passage when there is
    no such turn."""
    if before is None:
        return passage(memory)
    speaker = next((e.name for e in memory.entities if e.type == "Speaker"), None)
    return f"{passage(before)} || {speaker}: {memory.text}" if speaker else f"{passage(before)} || {memory.text}"


def previous_turns(conv: Conversation) -> dict[str, Memory]:
    """Per turn id, the memory written just before it by the same agent within the engine's context
    window (``query/turns.py`` ``CONTEXT_WITHIN``): the turn before it in its session (LoCoMo's
    sessions are more than a day apart, so no turn reaches into the session before)."""
    out: dict[str, Memory] = {}
    for a, b in zip(conv.turns, conv.turns[1:], strict=False):
        if a.agent_id == b.agent_id and timedelta(0) <= b.created_at - a.created_at <= CONTEXT_WITHIN:
            out[str(b.id)] = Memory(
                text=a.text,
                agent_id=a.agent_id,
                id=a.id,
                created_at=a.created_at,
                entities=[EntityRef(SPEAKER_TYPE, a.speaker)],
            )
    return out


def collect(
    conversations: Sequence[str],
    depth: int,
    keep: Path | None = None,
    *,
    context_tokens: int = CONTEXT_TOKENS,
    sample: Sequence[int] = (10, 20),
    embedder: str | None = None,
) -> list[dict[str, object]]:
    """Per question the engine's top ``depth`` and the cross-encoder's logits, for the current
    passage and for the with-context one (each timed); written to ``keep`` every ``SAMPLE``
    questions too, so an interrupted run leaves what it measured."""
    loaded = [locomo.read(n).conversation for n in conversations]
    model = CrossEncoder()
    wide = CrossEncoder(max_tokens=context_tokens) if context_tokens > 0 else None
    rows: list[dict[str, object]] = []
    with recall.open_client("embedded", embedder) as client:
        kind = client.settings.embedder.kind
        locomo.load(client, loaded)
        for conv in loaded:
            before = previous_turns(conv)
            for q in conv.questions:
                t0 = time.perf_counter()
                hits = client.engine.run(MemoryQuery(text=q.text, agent_id=q.agent_id, limit=depth, rerank=False)).hits
                engine_ms = (time.perf_counter() - t0) * 1000
                texts = [passage(h.memory) for h in hits]
                wider = [context_passage(h.memory, before.get(str(h.id))) for h in hits]
                t0 = time.perf_counter()
                logits = model.scores(q.text, texts[:depth])
                stage_ms = {str(depth): (time.perf_counter() - t0) * 1000}
                context: dict[str, object] = {}
                context_logits: list[float | None] = [None] * len(hits)
                if wide is not None:
                    t0 = time.perf_counter()
                    context_logits = list(wide.scores(q.text, wider[:depth]))
                    context = {"context_ms": {str(depth): (time.perf_counter() - t0) * 1000}}
                if sample and len(rows) % SAMPLE == 0:  # the shallower depths' cost, on a sample
                    for d in sample:
                        t0 = time.perf_counter()
                        model.scores(q.text, texts[:d])
                        stage_ms[str(d)] = (time.perf_counter() - t0) * 1000
                rows.append(
                    {
                        "embedder": kind,
                        "agent": q.agent_id,
                        "question": q.text,
                        "category": q.kind,
                        "evidence": [str(i) for i in q.evidence],
                        "candidates": [
                            {
                                "id": str(h.id),
                                "score": h.score,
                                "passage": t,
                                "logit": lg,
                            }
                            | ({"context_passage": w, "context_logit": cl} if wide is not None else {})
                            for h, t, lg, w, cl in zip(hits, texts, logits, wider, context_logits, strict=False)
                        ],
                        "engine_ms": engine_ms,
                        "stage_ms": stage_ms,
                        **context,
                        "pairs": min(depth, len(hits)),
                    }
                )
                print(f"\r{len(rows)} questions", end="", file=sys.stderr, flush=True)
                if keep is not None and len(rows) % SAMPLE == 0:
                    keep.write_text(json.dumps(rows))
    print(file=sys.stderr)
    return rows


def ranked(row: dict[str, object], depth: int | None, blend: float, logit: str = "logit") -> list[str]:
    """The row's candidates, first stage (depth None) or re-ranked by ``memoryctl.query.rerank.rerank``
    with the cross-encoder's logits of the current passage (``logit``) or the with-context one
    (``context_logit``)."""
    if depth is None:
        cands = row["candidates"]
        assert isinstance(cands, list)
        return [c["id"] for c in cands]
    return [str(h.id) for h in staged(row, depth, blend, logit).hits]


def staged(row: dict[str, object], depth: int, blend: float, logit: str = "logit") -> Reranked:
    """The row's candidates through the product's stage, with the collected logits as its scorer."""
    cands = row["candidates"]
    assert isinstance(cands, list)
    hits = []
    for c in cands:  # a stand-in memory: rerank reads only the hit's score and its passage
        hits.append(Hit(uuid.UUID(c["id"]), c["score"], {}, Memory(text=c["passage"], agent_id="x"), []))
    scorer = Known({passage(h.memory): c[logit] for h, c in zip(hits, cands, strict=True)})
    return rerank(hits, str(row["question"]), scorer, RerankSettings(depth, blend, budget_s=1e9))


def turn_positions(rows: Sequence[dict[str, object]]) -> dict[str, tuple[str, int, int]]:
    """Per turn id of the rows' conversations: (agent, session, position in the conversation)."""
    out: dict[str, tuple[str, int, int]] = {}
    for agent in sorted({str(r["agent"]) for r in rows}):
        for i, t in enumerate(locomo.read(agent.removeprefix("locomo-")).conversation.turns):
            out[str(t.id)] = (agent, t.session, i)
    return out


def neighbour_ranked(
    row: dict[str, object], depth: int, blend: float, weight: float, where: dict[str, tuple[str, int, int]]
) -> list[str]:
    """The stage's order with a second-order rule tried on top (not in the product: measured, see
    docs/retrieval.md): each read candidate's blended score plus ``weight`` times the best
    cross-encoder probability among the read candidates right before or after it in its session
    (a turn and the reply that answers it are often one piece of evidence)."""
    out = staged(row, depth, blend)
    read = out.hits[: out.read]
    ce = {where[str(h.id)]: h.scores["rerank"] for h in read}

    def lifted(h: Hit) -> float:
        agent, session, i = where[str(h.id)]
        near = [ce.get((agent, session, i + d), 0.0) for d in (-1, 1)]
        return h.score + weight * max(near)

    return [str(h.id) for h in sorted(read, key=lambda h: -lifted(h))] + [str(h.id) for h in out.hits[out.read :]]


def metrics(rows: Sequence[dict[str, object]], rankings: Sequence[list[str]]) -> dict[str, float]:
    r10 = h5 = 0.0
    for row, ids in zip(rows, rankings, strict=True):
        wanted = set(row["evidence"])  # type: ignore[arg-type]
        r10 += len(wanted & set(ids[:10])) / len(wanted)
        h5 += bool(wanted & set(ids[:5]))
    n = max(1, len(rows))
    return {"recall@10": round(r10 / n, 3), "hit@5": round(h5 / n, 3), "n": len(rows)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", default=",".join(locomo.CONVERSATIONS))
    ap.add_argument("--depth", type=int, default=30)
    ap.add_argument("--depths", default="10,20,30")
    ap.add_argument("--blends", default="0.25,0.5,0.75,1")
    ap.add_argument("--dump", type=Path)
    ap.add_argument("--collected", type=Path, help="write the collected candidates and logits here")
    ap.add_argument("--from", dest="source", type=Path, nargs="+", help="sweep collected rows (files) instead")
    ap.add_argument(
        "--context-tokens",
        type=int,
        default=CONTEXT_TOKENS,
        help="truncation of a with-context pair (0: no with-context pass)",
    )
    ap.add_argument("--embedder", help="embedder kind instead of the configured one (as benchmarks/locomo.py)")
    ap.add_argument("--sample-depths", default="10,20", help="depths timed on every tenth question ('' for none)")
    ap.add_argument(
        "--neighbour-weights",
        default="",
        help="also sweep the neighbour rule (neighbour_ranked) with these weights, e.g. 0.2,0.3 (methods nbW-dD-bB)",
    )
    args = ap.parse_args(argv)
    if args.source:
        rows = [r for f in args.source for r in json.loads(f.read_text())]
    else:
        sample = [int(d) for d in args.sample_depths.split(",") if d.strip()]
        rows = collect(
            [c.strip() for c in args.conversations.split(",")],
            args.depth,
            args.collected,
            context_tokens=args.context_tokens,
            sample=sample,
            embedder=args.embedder,
        )
        if args.collected:
            args.collected.write_text(json.dumps(rows))
    with_context = all("context_logit" in c for r in rows for c in r["candidates"])  # type: ignore[attr-defined]
    grid: list[tuple[str, int | None, float, str]] = [("first-stage", None, 0.0, "logit")]
    for key, prefix in [("logit", ""), *([("context_logit", "ctx-")] if with_context else [])]:
        grid += [
            (f"{prefix}d{d}-b{b}", int(d), float(b), key)
            for d in args.depths.split(",")
            for b in args.blends.split(",")
        ]
    rankings = {name: [ranked(r, d, b, key) for r in rows] for name, d, b, key in grid}
    weights = [float(w) for w in args.neighbour_weights.split(",") if w.strip()]
    if weights:
        where = turn_positions(rows)
        for w in weights:
            for d in args.depths.split(","):
                for b in args.blends.split(","):
                    name = f"nb{w}-d{d}-b{b}"
                    rankings[name] = [neighbour_ranked(r, int(d), float(b), w, where) for r in rows]
                    grid.append((name, int(d), float(b), "logit"))
    cats = sorted({str(r["category"]) for r in rows})
    kinds = sorted({str(r.get("embedder", "onnx")) for r in rows})
    print(
        f"LoCoMo {len(rows)} questions, first stage by {', '.join(kinds)};"
        " columns: recall@10 / hit@5, overall then per category"
    )
    print(f"{'method':<18}{'overall':>14}" + "".join(f"{c:>16}" for c in cats))
    for name, *_ in grid:
        cells = [metrics(rows, rankings[name])]
        for c in cats:
            idx = [i for i, r in enumerate(rows) if r["category"] == c]
            cells.append(metrics([rows[i] for i in idx], [rankings[name][i] for i in idx]))
        print(f"{name:<18}" + "".join(f"{m['recall@10']:>9.3f}/{m['hit@5']:.3f}" for m in cells))
    engine = [float(r["engine_ms"]) for r in rows]  # type: ignore[arg-type]
    print(f"engine (first stage, top {args.depth}): p50 {statistics.median(engine):.1f} ms")
    for d in sorted({k for r in rows for k in r["stage_ms"]}, key=int):  # type: ignore[attr-defined]
        ms = sorted(float(r["stage_ms"][d]) for r in rows if d in r["stage_ms"])  # type: ignore[index,operator]
        print(
            f"cross-encoder over the top {d}: p50 {statistics.median(ms):.1f} ms, p95 {ms[int(len(ms) * 0.95)]:.1f} ms"
        )
    for label, key in (("current passage", "stage_ms"), ("with context", "context_ms")):
        timed = [r for r in rows if key in r and "pairs" in r and str(args.depth) in r[key]]  # type: ignore[operator]
        if timed:  # every question's pairs over the same top --depth
            per = sorted(float(r[key][str(args.depth)]) / max(1, int(r["pairs"])) for r in timed)  # type: ignore[index,call-overload]
            total = sum(float(r[key][str(args.depth)]) for r in timed)  # type: ignore[index]
            pairs = sum(int(r["pairs"]) for r in timed)  # type: ignore[call-overload]
            print(
                f"cross-encoder per pair, {label}: mean {total / max(1, pairs):.1f} ms,"
                f" p50 {statistics.median(per):.1f} ms ({pairs} pairs)"
            )
    if args.dump:
        dump = {
            name: [
                {**{k: r[k] for k in ("agent", "question", "category", "evidence")}, "ranked": ids}
                for r, ids in zip(rows, rankings[name], strict=True)
            ]
            for name, *_ in grid
        }
        args.dump.write_text(json.dumps(dump))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
