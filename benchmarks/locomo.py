"""Retrieval quality of ``memoryctl query`` on LoCoMo, a public benchmark (issue 27).

LoCoMo (snap-research, Maharana et al., "Evaluating Very Long-Term Conversational Memory of LLM
Agents", ACL 2024): two people talk over 19-32 dated sessions; each question's ``evidence`` names
the dialogue turns that answer it. The data is evaluation-only and is never copied into this
repository: it is read from ``$MEMORYCTL_LOCOMO``, else ``/work/shared/data/locomo``, else
``<repo>/../shared/data/locomo`` (its README says what it holds; files are checked against its
SHA256SUMS before use).

Loading, as an agent builder would store a chat log through the public API (``import_jsonl``,
what ``memoryctl import`` runs; the rule-based extractor on, as by default):

- one memory per dialogue turn, kind ``dialogue``, the conversation as the agent
  (``locomo-41``); its text is what was said, and for a turn that shares a photo the photo's
  automatic caption after it (``[photo: a dog on a beach]``: an agent stores what it was shown as
  text, and several answers are only in the caption; ``--no-captions`` leaves it out);
- the speaker as an entity (``Speaker:Maria``) with an ``AUTHORED`` relation to the turn;
- ``created_at``: the session's date and time, and the turns of a session follow it
  ``TURN_GAP`` apart in the order they were said (the data gives one time per session only).
  ``--session-stamped`` measures the alternative, every turn stamped with the session's time
  exactly, ordered only by the order they were written in (schema 0008: the import writes them in
  the conversation's order).

Questions: categories 1-4 (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop; 5, adversarial
questions with no answer in the conversation, are left out as in the benchmark's own retrieval
scores), asked with the conversation's agent, top 10. A few evidence ids are malformed in the
release (``D:11:26``, ``D30:05``, several ids in one string): they are read leniently, and an id
that names no turn is dropped (a question left with no evidence is not asked; the count is
printed).

Methods: ``default`` (``memoryctl query TEXT``), ``dense``, ``lexical`` (one leg, as
``--retrieval``), ``graph`` (``default`` plus ``--entity Speaker:<name> --via AUTHORED`` when the
question names exactly one of the two speakers; the others run as ``default``), ``no-context``
(``[query] context_turns = 0``), ``no-dates`` (``[query] dates_named = false``), ``no-sessions``
(``[query] session_context = false``), and ``bm25``: Okapi BM25 (k1 1.2, b 0.75) over the same turns
in Python, a reference, not the engine. ``--rescore KIND`` (experiment, as in ``benchmarks/recall.py``):
``rescore``, ``default``'s top ``--rescore-depth`` re-ranked by its score fused with a second
embedder's cosine, and ``second``, by that cosine alone; the stage's own latency is timed on every
tenth question. Metrics as ``benchmarks/recall.py``: recall@10, hit@1,
hit@5, MRR, overall and per category; query p50/p95 of the engine (the query embedding is cached per
question, so it is timed apart, on its first computation, and printed in the title).

Development and report: ``--conversations`` picks the conversations (default: all eight). Methods
are developed on ``DEV`` (41, 42, 43) only; the others (44, 47, 48, 49, 50) are reported, and
LoCoMo's two conversations missing from this folder are the held-out check nobody tuned to.

Usage::

    python benchmarks/locomo.py [--conversations 41,42] [--methods default,dense,...]
        [--session-stamped] [--no-captions] [--json] [--dump FILE]
        [--rescore local|onnx|minilm [--rescore-depth N]]

Embeddings are cached on disk keyed by model and text (``recall.EmbeddingCache``), so a second run
costs the queries only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, Path(__file__).resolve().parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import recall  # noqa: E402
from conversations import SPEAKER_TYPE, Conversation, Question, Turn  # noqa: E402

from memoryctl.client import MemoryClient  # noqa: E402

NAMESPACE = uuid.UUID("0b7f2a9e-41c3-4d5e-8f0a-6c1d2e3f4a5b")
AUTHORED = "AUTHORED"
STAGE_SAMPLE = 130  # questions the --rescore stage's own latency is timed on (of 1,305: 0.5-0.75 s each)
CONVERSATIONS = ("41", "42", "43", "44", "47", "48", "49", "50")
DEV = ("41", "42", "43")  # what methods are developed on; the rest are reported only
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
METHODS = ("default", "dense", "lexical", "graph", "no-context", "no-dates", "no-sessions", "bm25")
# The data gives one time per session; the turns of a session are spaced this far apart, in the
# order they were said (within the engine's context window: query/turns.py CONTEXT_WITHIN).
TURN_GAP = timedelta(seconds=30)
_SESSION_DATE = re.compile(r"(\d{1,2}):(\d{2})\s*([ap]m)\s+on\s+(\d{1,2})\s+(\w+),\s*(\d{4})", re.IGNORECASE)
_MONTHS = {
    m: n
    for n, m in enumerate(
        ("january february march april may june july august september october november december").split(), start=1
    )
}
_DIA = re.compile(r"D:?(\d+):0*(\d+)")


def data_dir() -> Path:
    """Where the LoCoMo files are: ``$MEMORYCTL_LOCOMO``, else the shared folder of this machine."""
    import os

    env = os.environ.get("MEMORYCTL_LOCOMO")
    shared = [Path("/work/shared/data/locomo"), ROOT.parent / "shared" / "data" / "locomo"]
    for candidate in [Path(env)] if env else shared:
        if (candidate / "SHA256SUMS").is_file():
            return candidate
    raise SystemExit("LoCoMo data not found: set MEMORYCTL_LOCOMO to the folder holding conv-*.json and SHA256SUMS")


def _checked(folder: Path, name: str) -> bytes:
    """The file's bytes, refused unless they match SHA256SUMS (figures are about these bytes)."""
    sums = dict(reversed(line.split()) for line in (folder / "SHA256SUMS").read_text().splitlines() if line.strip())
    raw = (folder / name).read_bytes()
    if hashlib.sha256(raw).hexdigest() != sums.get(name):
        raise SystemExit(f"{folder / name} does not match SHA256SUMS")
    return raw


def session_time(text: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` as a UTC datetime (the data names no time zone)."""
    m = _SESSION_DATE.search(text)
    if m is None:
        raise SystemExit(f"unreadable session date {text!r}")
    hour, minute, half, day, month, year = m.groups()
    h = int(hour) % 12 + (12 if half.lower() == "pm" else 0)
    return datetime(int(year), _MONTHS[month.lower()], int(day), h, int(minute), tzinfo=UTC)


def turn_text(turn: dict[str, object], *, captions: bool) -> str:
    text = str(turn["text"])
    caption = turn.get("blip_caption")
    if captions and isinstance(caption, str) and caption.strip():
        text = f"{text} [photo: {caption.strip()}]"
    return text


def evidence_ids(raw: Sequence[str]) -> list[str]:
    """The ``dia_id``s a question's evidence names, read leniently (the release has a few malformed)."""
    return [f"D{s}:{t}" for item in raw for s, t in _DIA.findall(item)]


@dataclass(frozen=True, slots=True)
class Loaded:
    conversation: Conversation
    dropped_questions: int  # questions of categories 1-4 with no evidence id that names a turn


def read(name: str, *, stamped: bool = False, captions: bool = True) -> Loaded:
    """One LoCoMo conversation as the generator's ``Conversation`` (the shapes benchmarks/recall.py
    evaluates): its turns, and its questions of categories 1-4 with their evidence as memory ids."""
    folder = data_dir()
    raw = json.loads(_checked(folder, f"conv-{name}.json"))
    conv = raw.get("conversation", raw)  # the release nests it; this folder keeps it at the top
    agent = f"locomo-{name}"
    speakers = [conv["speaker_a"], conv["speaker_b"]]
    sessions = sorted(int(k.split("_")[1]) for k in conv if re.fullmatch(r"session_\d+", k) and conv[k])
    turns: list[Turn] = []
    ids: dict[str, uuid.UUID] = {}
    for s in sessions:
        start = session_time(conv[f"session_{s}_date_time"])
        for n, t in enumerate(conv[f"session_{s}"]):
            mid = uuid.uuid5(NAMESPACE, f"{agent}/{t['dia_id']}")
            ids[t["dia_id"]] = mid
            at = start if stamped else start + n * TURN_GAP
            turns.append(Turn(mid, agent, t["speaker"], turn_text(t, captions=captions), at, s, ()))
    questions, dropped = [], 0
    for qa in raw["qa"]:
        if qa.get("category") not in CATEGORIES:
            continue
        evidence = tuple(dict.fromkeys(ids[d] for d in evidence_ids(qa.get("evidence", [])) if d in ids))
        if not evidence:
            dropped += 1
            continue
        named = [s for s in speakers if re.search(rf"\b{re.escape(s)}\b", qa["question"])]
        about = named[0] if len(named) == 1 else None
        questions.append(Question(agent, qa["question"], CATEGORIES[qa["category"]], evidence, about))
    return Loaded(Conversation(agent, "locomo", speakers, turns, questions), dropped)


def jsonl_lines(conv: Conversation) -> list[str]:
    """The import file of one conversation: one line per turn (the ``memoryctl import`` format)."""
    out = []
    for t in conv.turns:
        speaker = {"type": SPEAKER_TYPE, "name": t.speaker}
        out.append(
            json.dumps(
                {
                    "id": str(t.id),
                    "text": t.text,
                    "kind": "dialogue",
                    "created_at": t.created_at.isoformat(),
                    "entities": [speaker],
                    "relations": [{"from": speaker, "type": AUTHORED, "to": "this"}],
                }
            )
        )
    return out


def load(client: MemoryClient, convs: Sequence[Conversation]) -> float:
    """Every conversation through ``import_jsonl`` (``memoryctl import FILE --agent A``)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memoryctl-locomo-") as tmp:
        for conv in convs:
            path = Path(tmp) / f"{conv.agent_id}.jsonl"
            path.write_text("\n".join(jsonl_lines(conv)) + "\n", encoding="utf-8")
            outcome = client.import_jsonl(path, agent_id=conv.agent_id)
            if outcome.invalid or any(outcome.pending.values()):
                raise SystemExit(f"import of {conv.agent_id}: invalid {outcome.invalid}, pending {outcome.pending}")
    return time.perf_counter() - t0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", default=",".join(CONVERSATIONS), help="e.g. 41,42 or dev (41,42,43)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--session-stamped", action="store_true", help="every turn at its session's time exactly")
    ap.add_argument("--no-captions", action="store_true", help="leave the photos' captions out of the turns")
    ap.add_argument("--embedder", help="embedder kind instead of the configured one (local, onnx, minilm)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--rescore",
        metavar="KIND",
        choices=("local", "onnx", "minilm"),
        help="experiment: also re-rank default's top N with this embedder (methods rescore, second)",
    )
    ap.add_argument("--rescore-depth", type=int, default=50, metavar="N", help="candidates re-ranked (50)")
    ap.add_argument(
        "--dump", type=Path, help="write every question's ranked ids and evidence here (benchmarks/paired.py)"
    )
    args = ap.parse_args(argv)
    names = DEV if args.conversations == "dev" else tuple(c.strip() for c in args.conversations.split(","))
    unknown = set(names) - set(CONVERSATIONS)
    if unknown:
        ap.error(f"unknown conversations {sorted(unknown)}: choose from {', '.join(CONVERSATIONS)}")
    chosen = [m.strip() for m in args.methods.split(",") if m.strip()]
    known = (*METHODS, *recall.RESCORE_METHODS) if args.rescore else METHODS
    if args.rescore:
        chosen += [m for m in recall.RESCORE_METHODS if m not in chosen]
    if set(chosen) - set(known):
        ap.error(f"unknown methods {sorted(set(chosen) - set(known))}: choose from {', '.join(known)}")
    second = recall.SecondStage(args.rescore, args.rescore_depth) if args.rescore else None
    loaded = [read(n, stamped=args.session_stamped, captions=not args.no_captions) for n in names]
    convs = [x.conversation for x in loaded]
    dumped: dict[str, list[dict[str, object]]] = {}
    with recall.open_client("embedded", args.embedder) as client:
        load_s = load(client, convs)
        fns = recall.methods(client, convs, said=AUTHORED, second=second)
        if args.dump:
            fns = {name: recall.dumping(fns[name], dumped.setdefault(name, [])) for name in chosen}
        overall, by_kind = recall.evaluate(convs, fns, chosen)
        stage = recall.stage_latency(client, convs, second, sample=STAGE_SAMPLE) if second else {}
        embedder = client.stack.embedder
        embed_ms = embedder.query_ms() if isinstance(embedder, recall.QueryVectors) else {}
    turns = sum(len(c.turns) for c in convs)
    questions = sum(len(c.questions) for c in convs)
    if args.dump:
        args.dump.write_text(json.dumps(dumped))
    report = {
        "conversations": list(names),
        "turns": turns,
        "questions": questions,
        "dropped_questions": sum(x.dropped_questions for x in loaded),
        "load_s": round(load_s, 1),
        "query_embedding_ms": embed_ms,
        "overall": overall,
        "by_category": by_kind,
    } | ({"rescore_stage": stage} if stage else {})
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    title = (
        f"LoCoMo {','.join(names)}: {turns} turns, {questions} questions (categories 1-4;"
        f" {report['dropped_questions']} without a readable evidence id left out); load {load_s:.1f} s;"
        f" {'session-stamped' if args.session_stamped else f'turns {TURN_GAP.seconds} s apart'};"
        f" query embedding p50/p95 {embed_ms.get('p50_ms')}/{embed_ms.get('p95_ms')} ms (not in p50_ms/p95_ms)"
    )
    print(recall.table(overall, title))
    for depth, ms in stage.items():
        print(f"  rescore stage ({args.rescore}), {depth}: p50 {ms['p50_ms']} ms, p95 {ms['p95_ms']} ms")
    for cat in CATEGORIES.values():
        print(recall.table({m: by_kind[m][cat] for m in chosen if cat in by_kind[m]}, f"  {cat}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
