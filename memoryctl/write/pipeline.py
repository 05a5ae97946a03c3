"""``Writes``: what ``add``, ``import`` and ``forget`` do, from the caller's memories to the stores.

A write lands in PostgreSQL first (one transaction with its outbox rows) and is then delivered
inline, best effort: the write's own rows, then a little of what else is due (the backlog a killed
import or an outage left behind); whatever could not be delivered stays in the outbox for the next
write or ``sync``. The outcome says what is pending, so callers (and the CLI's exit code 3) can
tell "stored" from "searchable". In the service on the cluster profile the delivery runs under a
budget, every store at once behind a breaker (``budget.py``); elsewhere one store after the other.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from memoryctl.errors import InputError, NotFoundError, StoreUnavailable
from memoryctl.model import BadLine, Memory, dedupe_entities, validate_agent_id
from memoryctl.stores.protocols import OpenedStores
from memoryctl.stores.records import UpsertResult
from memoryctl.vocabulary import Vocabulary
from memoryctl.write.budget import WriteDelivery
from memoryctl.write.importer import read_jsonl
from memoryctl.write.outbox import Deliverer, DeliveryReport

if TYPE_CHECKING:
    from memoryctl.embed import Embedder
    from memoryctl.extract import Extractor

IMPORT_BATCH = 500
# Batches of other pending deliveries a single add or forget takes along (an import takes them all):
# enough to drain what a killed process left within a few writes, bounded so one add stays quick.
BACKLOG_PER_WRITE = 1
# A commit takes 0.1-0.3 s on the cluster; one still running after this is waiting out a failover
# (or a lost standby): the service then asks the delivery stores whether they answer.
PROBE_AFTER_S = 1.0
# How long a write waits for its own outbox rows when another delivery holds them (a concurrent
# write's backlog batch, a `sync`): that delivery is moving them right now, so waiting tells the
# caller the truth ("searchable") instead of "pending"; longer than this, it says what holds them.
OWN_ROWS_WAIT_S = 15.0
TARGETS = ("vector", "graph")


class WriteStores(OpenedStores, Protocol):
    """What the write path takes from the composition root (``memoryctl.stack.Stack``): the opened
    stores, the embedder and the extractor."""

    @property
    def embedder(self) -> Embedder: ...

    @property
    def extractor(self) -> Extractor: ...


@dataclass(slots=True)
class WriteOutcome:
    ids: list[uuid.UUID] = field(default_factory=list)
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    invalid: list[BadLine] = field(default_factory=list)
    delivery: DeliveryReport = field(default_factory=DeliveryReport)
    pending: dict[str, int] = field(default_factory=dict)  # store -> memories awaiting delivery

    def add(self, result: UpsertResult) -> None:
        self.inserted += len(result.inserted)
        self.updated += len(result.updated)
        self.unchanged += len(result.unchanged)

    @property
    def degraded(self) -> list[str]:
        return sorted(store for store, n in self.pending.items() if n)

    def as_dict(self) -> dict[str, Any]:
        return {
            "inserted": self.inserted,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "invalid": [{"line": b.line, "error": b.error} for b in self.invalid],
            "pending": self.pending,
            "delivery": self.delivery.as_dict(),
        }


def _conflict_line(n: int, m: Memory) -> BadLine:
    return BadLine(n, f"id {m.id} already belongs to another agent: an id names one memory of one agent")


class Writes:
    """The write path of one client: ``add``, ``import_jsonl``, ``forget``, and the delivery
    ``sync`` drains the outbox with. ``budget_s``: how long a write waits for its delivery after
    the commit (None: as long as it takes); ``memoryctl serve`` sets ``[write] delivery_budget_s``
    on the cluster profile."""

    def __init__(
        self, stores: WriteStores, vocabulary: Vocabulary, *, default_agent: str, breaker_reset_s: float
    ) -> None:
        self.stores = stores
        self.vocabulary = vocabulary
        self.default_agent = default_agent
        self.breaker_reset_s = breaker_reset_s
        self.budget_s: float | None = None

    # ---- add, forget --------------------------------------------------------------------------
    def _enrich(self, m: Memory) -> Memory:
        """Add what the configured extractor finds to what the caller gave explicitly."""
        found = self.stores.extractor.extract(m.text, m.id)
        if found.entities:
            m.entities = dedupe_entities([*m.entities, *found.entities], m.agent_id)
        if found.relations:
            m.relations = [*m.relations, *found.relations]
        return m

    def add(self, memories: Sequence[Memory], *, deliver: bool = True, extract: bool = True) -> WriteOutcome:
        out = WriteOutcome()
        batch = [self.vocabulary.check_memory(self._enrich(m) if extract else m) for m in memories]
        with self._probe_if_slow(deliver):
            result = self.stores.records.upsert(batch)
        out.ids = [m.id for m in batch]
        out.add(result)
        self._settle(out, result.changed if deliver else [], pending_ids=out.ids)
        return out

    def forget(self, ids: Sequence[uuid.UUID], *, agent_id: str | None = None) -> WriteOutcome:
        """Soft delete: hidden from every query path at once; purged later by reconcile.

        All or nothing: an id that names no memory (of ``agent_id``, when given) is an error
        before anything is forgotten (the harness found ``forget KNOWN UNKNOWN`` exiting 1 "no
        memory" with KNOWN forgotten all the same). Forgetting a forgotten memory changes nothing.
        """
        records = self.stores.records
        owners = records.owners(ids)
        missing = [i for i in ids if i not in owners or (agent_id is not None and owners[i] != agent_id)]
        if missing:
            raise NotFoundError(
                f"no memory {', '.join(map(str, missing))}" + (f" for agent {agent_id!r}" if agent_id else ""),
                hint="check the id with `memoryctl get ID`; nothing was forgotten",
            )
        done = records.soft_delete(ids, agent_id=agent_id)
        out = WriteOutcome(ids=list(done), updated=len(done))
        self._settle(out, done, pending_ids=done)
        return out

    def _settle(
        self, out: WriteOutcome, changed: Sequence[uuid.UUID], *, pending_ids: Sequence[uuid.UUID] | None
    ) -> None:
        """Deliver what a committed write changed and count what is still pending.

        The write has committed by now, so losing PostgreSQL here (a failover's broken connection, a
        switchover's shutdown) must not report it as failed: the caller would take a stored memory
        for a lost one. Its outbox rows are committed with it, so the next write or ``sync``
        delivers them; the outcome says "stored, delivery pending" (exit 3) with the reason, and
        counts the changed memories as pending wherever their delivery was not confirmed (the
        drill found a switchover turning a committed add into exit 1, issue 26).
        """
        try:
            if changed:
                out.delivery = self._deliver_write(changed)
            out.pending = self.pending(pending_ids)
        except StoreUnavailable as exc:
            if exc.store != "postgres":
                raise
            reason = f"{exc.message}, after the write committed: its outbox entries deliver it later"
            behind = [t for t in TARGETS if t in out.delivery.failed or out.delivery.delivered[t] < len(changed)]
            for target in behind:
                out.delivery.failed.setdefault(target, reason)
            out.pending = {self.stores.store_names[t]: len(changed) if t in behind else 0 for t in TARGETS}

    # ---- import -------------------------------------------------------------------------------
    def import_jsonl(
        self,
        path: Path,
        *,
        agent_id: str | None = None,
        strict: bool = False,
        deliver: bool = True,
        progress: Callable[[int], None] | None = None,
    ) -> WriteOutcome:
        """Import a JSONL file in batches. Bad lines are skipped and reported (or, strict, refused)."""
        default_agent = validate_agent_id(agent_id) if agent_id is not None else self.default_agent
        out = WriteOutcome()
        try:
            stream = path.open("rb")
        except OSError as exc:
            raise InputError(f"cannot read {path}: {exc.strerror}") from None
        with stream:
            lines = self.vocabulary.screen(read_jsonl(stream, default_agent=default_agent, forced_agent=agent_id))
            if strict:
                parsed = list(lines)
                bad = [p for _, p in parsed if isinstance(p, BadLine)] + self._conflicting_lines(parsed)
                if bad:
                    out.invalid = sorted(bad, key=lambda b: b.line)
                    return out
                source: Iterable[tuple[int, Memory | BadLine]] = parsed
            else:
                source = lines
            batch: list[tuple[int, Memory]] = []
            for n, item in source:
                if isinstance(item, BadLine):
                    out.invalid.append(item)
                    if progress:
                        progress(1)
                    continue
                batch.append((n, item))
                if len(batch) >= IMPORT_BATCH:
                    self._import_batch(batch, out, deliver, progress)
                    batch = []
            if batch:
                self._import_batch(batch, out, deliver, progress)
        working = [t for t in TARGETS if t not in out.delivery.failed]
        if deliver and working:
            # What is still pending for a store that took this import: e.g. what a killed run of
            # the same import left behind (its lines are unchanged now, so nothing above sent them).
            out.delivery.merge(self.deliver([], targets=working, backlog=-1))
        out.invalid.sort(key=lambda b: b.line)
        out.pending = self.pending(None)
        return out

    def _conflicting_lines(self, parsed: Sequence[tuple[int, Memory | BadLine]]) -> list[BadLine]:
        """``--strict`` refuses a file before writing anything: the lines whose id is another agent's."""
        lines = [(n, m) for n, m in parsed if isinstance(m, Memory)]
        owners = self.stores.records.owners([m.id for _, m in lines])
        for _, m in lines:
            owners.setdefault(m.id, m.agent_id)  # the first line of a new id owns it within the file
        return [_conflict_line(n, m) for n, m in lines if owners[m.id] != m.agent_id]

    def _import_batch(
        self,
        batch: list[tuple[int, Memory]],
        out: WriteOutcome,
        deliver: bool,
        progress: Callable[[int], None] | None,
    ) -> None:
        result = self.stores.records.upsert([self._enrich(m) for _, m in batch], skip_conflicts=True)
        out.add(result)
        conflicts = set(result.conflicts)
        out.ids.extend(m.id for i, (_, m) in enumerate(batch) if i not in conflicts)
        out.invalid.extend(_conflict_line(*batch[i]) for i in result.conflicts)
        if deliver and result.changed:
            # A store that failed once in this import is not retried per batch: sync will.
            targets = [t for t in TARGETS if t not in out.delivery.failed]
            out.delivery.merge(self.deliver(result.changed, targets=targets))
        if progress:
            progress(len(batch))

    # ---- delivery -----------------------------------------------------------------------------
    def _deliverer(self, targets: Sequence[str]) -> Deliverer:
        vectors = self.stores.vectors() if "vector" in targets else None
        graph = self.stores.graph() if "graph" in targets else None
        return Deliverer(self.stores.records, vectors, graph, self.stores.embedder if vectors else None)

    def deliver(
        self,
        ids: Sequence[uuid.UUID] | None,
        *,
        batch: int = 256,
        targets: Sequence[str] = TARGETS,
        backlog: int = 0,
    ) -> DeliveryReport:
        """Deliver ``ids`` (None: everything due); then, to each store that just took them, up to
        ``backlog`` batches of what else is due (-1: all of it, deferred rows made due first).

        The backlog is work a killed import or an earlier outage left behind: a store that works
        again gets it from the next write, nobody has to know to run ``sync`` (issue 22, item 3).
        """
        deliverer = self._deliverer(targets)
        opened = {"vector": deliverer.vectors, "graph": deliverer.graph}
        usable = [t for t in targets if opened[t] is not None]
        report = deliverer.deliver(
            memory_ids=ids, batch=batch, targets=usable, wait_held_s=OWN_ROWS_WAIT_S if ids else None
        )
        working = [t for t in usable if t not in report.failed]
        if ids is not None and backlog and working:
            if backlog < 0:
                self.stores.records.retry_now(working)
            report.merge(deliverer.deliver(batch=batch, targets=working, max_batches=None if backlog < 0 else backlog))
        for target in targets:
            if target not in usable:
                report.failed[target] = self.stores.unavailable.get(self.stores.store_names[target], "unavailable")
        return report

    def pending(self, ids: Sequence[uuid.UUID] | None) -> dict[str, int]:
        """Per store name: how many of ``ids`` (None: of all memories) await delivery."""
        counts = self.stores.records.pending_count(ids)
        return {self.stores.store_names[t]: counts.get(t, 0) for t in TARGETS}

    @cached_property
    def _write_delivery(self) -> WriteDelivery:
        return WriteDelivery(reset_s=self.breaker_reset_s)

    def _deliver_write(self, ids: Sequence[uuid.UUID]) -> DeliveryReport:
        """A committed write's own delivery: in the service on the cluster profile both stores at
        once within ``budget_s`` (``budget.py`` says why), then a batch of backlog each; elsewhere
        one store after the other, as long as it takes."""
        if self.budget_s is None:
            # One store after the other, each connection held only for its own delivery: with both
            # at once a write holds two of the pool's connections, and the embedded service under 8
            # clients starved its queries of connections ("postgres: no answer within 2.0s",
            # tests/e2e/test_serve_load.py in the fresh-clone rehearsal).
            return self.deliver(ids, backlog=BACKLOG_PER_WRITE)
        # The budget is for a store that stopped answering, not for opening one: a store not open
        # yet (the service's first write) opens here, bounded by its own timeouts.
        self.stores.vectors()
        self.stores.graph()
        return self._write_delivery.run(
            TARGETS,
            own=lambda target: self.deliver(ids, targets=[target]),
            backlog=lambda target: self._deliverer([target]).deliver(targets=[target], max_batches=BACKLOG_PER_WRITE),
            store_name=lambda target: self.stores.store_names[target],
            budget_s=self.budget_s,
        )

    @contextmanager
    def _probe_if_slow(self, deliver: bool) -> Iterator[None]:
        """In the budgeted path: a commit still running after ``PROBE_AFTER_S`` has the delivery
        stores asked whether they answer (``budget.py`` says why)."""
        if self.budget_s is None or not deliver:
            yield
            return
        budget = self.budget_s
        timer = threading.Timer(PROBE_AFTER_S, lambda: self._write_delivery.probe(TARGETS, self._ping, budget))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _ping(self, target: str) -> None:
        store = self.stores.vectors() if target == "vector" else self.stores.graph()
        if store is not None:
            store.ping()
