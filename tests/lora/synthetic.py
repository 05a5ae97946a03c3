"""Synthetic agent history for the training tests (generated, deterministic, no downloads).

The data have a learnable regularity that the base model does not know: the user refers to
things by private nicknames ("the vault" = the PostgreSQL database, …). Every memory mentions a
person and a real component; every query names the person and the nickname. Distractors share the
person or the component, so retrieving the right memory needs the nickname → component mapping
— exactly what a nightly adapter should learn from the agent's own history, and it generalises to
held-out pairs because the nicknames recur with other people and days.
"""

from __future__ import annotations

import itertools
import random

PEOPLE = [
    "Maria",
    "Tomasz",
    "Aiko",
    "Kwame",
    "Lena",
    "Ravi",
    "Sofia",
    "Jonas",
    "Priya",
    "Diego",
    "Hana",
    "Omar",
    "Elena",
    "Felix",
    "Zara",
    "Ivan",
]
COMPONENTS = {
    "the vault": "PostgreSQL database",
    "the loom": "Neo4j graph store",
    "the lens": "Qdrant vector index",
    "the oracle": "vLLM generation server",
    "the tunnel": "WireGuard mesh",
    "the clock": "nightly cron job",
    "the gate": "nftables firewall",
    "the scribe": "outbox sync worker",
}
ACTIONS = ["repaired", "upgraded", "restarted", "reconfigured", "benchmarked", "migrated"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
QUERIES = [
    "what happened with {alias} when {person} touched it?",
    "did {person} change {alias}?",
    "{person} and {alias} — what was done?",
    "any news from {person} about {alias}?",
]


def embedding_rows(seed: int = 0) -> list[dict[str, str]]:
    """One row per (person, component): a query, its positive memory and ids."""
    rng = random.Random(seed)
    rows = []
    for i, (person, (alias, real)) in enumerate(itertools.product(PEOPLE, COMPONENTS.items())):
        action, day = rng.choice(ACTIONS), rng.choice(DAYS)
        memory = f"On {day} {person} {action} the {real} after an alert."
        query = rng.choice(QUERIES).format(person=person, alias=alias)
        rows.append({"id": f"ev{i:04d}", "query": query, "positive": memory, "positive_id": f"mem{i:04d}"})
    return rows


def generation_rows(n: int = 160, seed: int = 0) -> list[dict[str, str]]:
    """Instruction/response pairs with a fixed response style (what a generation adapter learns)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        person, (alias, real) = rng.choice(PEOPLE), rng.choice(list(COMPONENTS.items()))
        rows.append(
            {
                "id": f"turn{i:04d}",
                "instruction": f"Who looked after {alias} last?",
                "response": f"{person} took care of the {real}.",
            }
        )
    return rows
