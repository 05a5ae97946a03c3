"""The end-to-end data set: 1,000 memories with entities and relations, and the answers it implies.

Deterministic (no randomness, fixed ids and timestamps), so every expected answer is computed from
the records themselves, not written down by hand:

- every memory is AUTHORED by one of 30 people and mentions one project; ``atlas`` is mentioned
  by 70% of them (700: above ``VECTOR_FIRST_MIN_FANOUT``, the threshold the vector-first test
  queries with), the others by 100 each;
- kinds ``incident`` / ``decision`` / ``note`` by position; created over 300 days of 2026;
- the texts are sentences about twelve everyday work topics, and three "needles" with vocabulary
  found nowhere else, whose paraphrased queries must find them first.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

AGENT = "e2e"
# Why 1,000 and not more: every memory is embedded on the nodes' one-thread stand-in several times
# per session (import, migrate and back, the night's migration), the bulk of the deploy stage's
# minutes at 3,000; what the tests prove (plans, exact answers, counts, drift, restores) does not
# depend on the size. Scale is the benchmarks' job (benchmarks/, docs/deploy.md).
COUNT = 1000
# The vector-first test's threshold (``MEMORYCTL_QUERY__VECTOR_FIRST_MIN_FANOUT`` for that query,
# run in-process):
# atlas (700) is above it, every person (about 33) far below; the default (2,000) is the
# planner's unit tests' business (tests/unit).
VECTOR_FIRST_MIN_FANOUT = 500
START = datetime(2026, 1, 1, 9, 0, tzinfo=UTC)
PEOPLE = [f"p{n:02d}" for n in range(30)]
TOPICS = {
    "billing": ("invoice", "refund", "payment run", "subscription renewal"),
    "release": ("release branch", "canary rollout", "build pipeline", "version tag"),
    "hiring": ("interview loop", "job offer", "candidate shortlist", "onboarding plan"),
    "database": ("index rebuild", "replication lag", "vacuum schedule", "slow query"),
    "office": ("desk booking", "coffee machine", "meeting room", "parking permit"),
    "security": ("access review", "password rotation", "phishing report", "audit log"),
    "support": ("customer ticket", "escalation", "response template", "satisfaction survey"),
    "design": ("colour palette", "wireframe", "icon set", "usability test"),
    "travel": ("train booking", "hotel receipt", "visa letter", "conference trip"),
    "finance": ("quarterly budget", "expense report", "forecast sheet", "cost centre"),
    "network": ("VPN tunnel", "DNS record", "load balancer", "firewall rule"),
    "legal": ("contract draft", "privacy notice", "licence review", "signature page"),
}
VERBS = ("reviewed", "updated", "postponed", "approved", "questioned", "summarised")
NEEDLES = (
    # (text, author, project, created_at, the query that must find it first)
    (
        "The lighthouse keeper on Skerry Point logged the storm surge and relit the lamp by hand.",
        "p07",
        "atlas",
        datetime(2026, 3, 15, 6, 30, tzinfo=UTC),
        "lighthouse keeper relighting the lamp during the storm",
    ),
    (
        "Marta's sourdough starter needs feeding with rye flour every twelve hours.",
        "p03",
        "borealis",
        datetime(2026, 6, 2, 12, 0, tzinfo=UTC),
        "how often to feed the sourdough starter with rye flour",
    ),
    (
        "The Kyoto team translated the onboarding manual into Japanese before the spring festival.",
        "p11",
        "atlas",
        datetime(2026, 4, 20, 8, 15, tzinfo=UTC),
        "Japanese translation of the onboarding manual in Kyoto",
    ),
)


@dataclass(frozen=True)
class Record:
    id: str
    text: str
    author: str
    project: str
    kind: str
    created_at: datetime
    query: str | None = None  # needles: the query that must rank it first

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "agent_id": AGENT,
            "text": self.text,
            "kind": self.kind,
            "created_at": self.created_at.isoformat(),
            "entities": [{"type": "project", "name": self.project}],
            "relations": [{"from": {"type": "person", "name": self.author}, "type": "AUTHORED", "to": "this"}],
            "metadata": {"author": self.author},
        }


@dataclass
class DataSet:
    records: list[Record] = field(default_factory=list)

    def jsonl(self) -> str:
        return "".join(json.dumps(r.as_json()) + "\n" for r in self.records)

    def ids(self, **where: Any) -> set[str]:
        return {r.id for r in self.records if all(getattr(r, k) == v for k, v in where.items())}

    def created_between(self, start: datetime, end: datetime, **where: Any) -> set[str]:
        return {r.id for r in self.records if start <= r.created_at < end} & self.ids(**where)

    def needles(self) -> list[Record]:
        return [r for r in self.records if r.query is not None]


def _kind(i: int) -> str:
    return "incident" if i % 13 == 0 else "decision" if i % 7 == 0 else "note"


def _project(i: int) -> str:
    return "atlas" if i % 10 < 7 else ("borealis", "cirrus", "delta")[i % 10 - 7]


def build() -> DataSet:
    data = DataSet()
    topics = list(TOPICS.items())
    for i in range(COUNT - len(NEEDLES)):
        topic, nouns = topics[i % len(topics)]
        noun = nouns[(i // len(topics)) % len(nouns)]
        author, project = PEOPLE[i % len(PEOPLE)], _project(i)
        text = (
            f"{author} {VERBS[i % len(VERBS)]} the {noun} ({topic}) for project {project}; "
            f"follow-up number {i} is due on day {i % 300 + 1}."
        )
        created = START + timedelta(days=i % 300, minutes=i)
        data.records.append(Record(str(uuid.UUID(int=i + 1)), text, author, project, _kind(i), created))
    for n, (text, author, project, created, query) in enumerate(NEEDLES):
        needle_id = str(uuid.UUID(int=10**9 + n))
        data.records.append(Record(needle_id, text, author, project, "note", created, query))
    return data
