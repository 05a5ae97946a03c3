"""``memoryctl backup status``: per store, what was backed up when and the newest restorable point.

- PostgreSQL: pgBackRest's base backups, plus WAL archiving (``pg_stat_archiver``): restorable to
  any moment up to the last archived segment.
- Qdrant: the complete snapshot sets at the target; restorable to the newest set, and to "now"
  after the catch-up that ``restore qdrant`` runs (it re-delivers what changed since from PostgreSQL).
- Neo4j: no backup of its own: ``memoryctl rebuild graph`` rebuilds it from PostgreSQL, so its
  newest restorable point is PostgreSQL's (docs/backup.md says why).

A store is *stale* when its newest backup is older than ``[backup] max_age``; status exits 3 then
(1 when a backup store cannot be read at all), so cron, monitoring and an operator see the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memoryctl.backup.pgbackrest import archiver_state, stanza_info
from memoryctl.backup.snapshots import set_time, target_of
from memoryctl.errors import ExitCode, MemoryctlError
from memoryctl.health.exposition import Exposition
from memoryctl.model import parse_duration

if TYPE_CHECKING:
    from memoryctl.stack import Stack


@dataclass(slots=True)
class StoreBackups:
    store: str
    method: str
    configured: bool = True
    last_backup: datetime | None = None  # end of the newest complete backup
    restorable: datetime | None = None  # the newest point a restore reaches
    bytes: int | None = None  # what the kept backups take at the target
    count: int = 0
    archive_failing: bool = False
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def stale(self, max_age_s: float, now: datetime) -> bool:
        return self.configured and (self.last_backup is None or (now - self.last_backup).total_seconds() > max_age_s)

    def as_dict(self, max_age_s: float, now: datetime) -> dict[str, Any]:
        age = (now - self.last_backup).total_seconds() if self.last_backup else None
        return {
            "method": self.method,
            "configured": self.configured,
            "last_backup": self.last_backup.isoformat() if self.last_backup else None,
            "last_backup_age_s": round(age) if age is not None else None,
            "newest_restorable": self.restorable.isoformat() if self.restorable else None,
            "bytes": self.bytes,
            "count": self.count,
            "stale": self.stale(max_age_s, now) if self.error is None else None,
            "archive_failing": self.archive_failing,
            "error": self.error,
            **self.detail,
        }


@dataclass(slots=True)
class BackupReport:
    stores: dict[str, StoreBackups]
    max_age_s: float
    checked_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def exit_code(self) -> int:
        configured = [s for s in self.stores.values() if s.configured]
        if any(s.error for s in configured):
            return int(ExitCode.FAILURE)
        if any(s.stale(self.max_age_s, self.checked_at) or s.archive_failing for s in configured):
            return int(ExitCode.PARTIAL)
        return int(ExitCode.OK)

    def as_dict(self) -> dict[str, Any]:
        return {
            "checked_at": self.checked_at.isoformat(),
            "max_age_s": self.max_age_s,
            "stores": {name: s.as_dict(self.max_age_s, self.checked_at) for name, s in self.stores.items()},
        }


def postgres_backups(stack: Stack) -> StoreBackups:
    settings = stack.settings.backup
    res = StoreBackups("postgres", "pgbackrest", configured=settings.pgbackrest_stanza is not None)
    if not res.configured:
        res.error = None
        res.detail["note"] = "no [backup] pgbackrest_stanza: PostgreSQL is not backed up by pgBackRest here"
        return res
    try:
        archiver = archiver_state(stack.pool)
        info = stanza_info(settings)
    except MemoryctlError as exc:
        res.error = exc.message
        return res
    res.archive_failing = archiver.failing
    res.count = len(info.backups)
    res.bytes = sum(b.repository_bytes for b in info.backups)
    res.detail.update(
        stanza=settings.pgbackrest_stanza,
        pgbackrest_status=info.status,
        backups=[b.as_dict() for b in info.backups],
        wal_archived=archiver.archived_count,
        last_archived_wal=archiver.last_archived_wal,
        last_archived=archiver.last_archived.isoformat() if archiver.last_archived else None,
        wal_failed=archiver.failed_count,
    )
    if info.status_code != 0 and info.status_code != 2:  # 2 = no backup yet: stale, not unreadable
        res.error = f"pgBackRest: {info.status}"
        return res
    if info.backups:
        res.last_backup = info.backups[-1].finished
        points = [res.last_backup, *([archiver.last_archived] if archiver.last_archived else [])]
        res.restorable = max(points)
    return res


def qdrant_backups(stack: Stack) -> StoreBackups:
    settings = stack.settings.backup
    res = StoreBackups("qdrant", "shard snapshots", configured=settings.snapshot_target is not None)
    if not res.configured:
        res.detail["note"] = "no [backup] snapshot_target: Qdrant would be rebuilt by re-embedding"
        return res
    try:
        target = target_of(stack)
        sets = target.sets()
        newest = target.manifest(sets[-1]) if sets else None
    except MemoryctlError as exc:
        res.error = exc.message
        return res
    res.count = len(sets)
    res.detail.update(target=target.describe(), sets=sets)
    if newest is not None:
        res.last_backup = res.restorable = set_time(sets[-1])
        res.bytes = int(newest["bytes"])  # the newest set; sets are full copies
        res.detail["newest_points"] = sum(int(c["points"]) for c in newest["collections"])
    return res


def backup_status(stack: Stack) -> BackupReport:
    pg = postgres_backups(stack)
    graph = StoreBackups("neo4j", "rebuilt from PostgreSQL (memoryctl rebuild graph)", configured=False)
    graph.restorable = pg.restorable
    return BackupReport(
        stores={"postgres": pg, "qdrant": qdrant_backups(stack), "neo4j": graph},
        max_age_s=parse_duration(stack.settings.backup.max_age).total_seconds(),
    )


def prometheus(report: BackupReport) -> str:
    out = Exposition()
    configured = {name: s for name, s in report.stores.items() if s.configured}
    out.family("memoryctl_backup_status_ok", "1 if the store's backups could be read.")
    for name, s in configured.items():
        out.sample({"store": name}, 0 if s.error else 1)
    # 0 = no backup yet (so "too old" alerts fire for a store that was never backed up); nothing
    # when the store could not be read (BackupStatusUnknown covers that).
    out.family("memoryctl_backup_last_success_timestamp_seconds", "End of the newest complete backup (0: none).")
    for name, s in configured.items():
        if s.error is None:
            out.sample({"store": name}, s.last_backup.timestamp() if s.last_backup else 0)
    out.family("memoryctl_backup_newest_restorable_timestamp_seconds", "The newest point a restore reaches (0: none).")
    for name, s in configured.items():
        if s.error is None:
            out.sample({"store": name}, s.restorable.timestamp() if s.restorable else 0)
    out.family("memoryctl_backup_bytes", "Size of the kept backups at the target.")
    for name, s in configured.items():
        if s.bytes is not None:
            out.sample({"store": name}, s.bytes)
    out.family("memoryctl_backups_kept", "Backups (base backups / snapshot sets) kept.")
    for name, s in configured.items():
        out.sample({"store": name}, s.count)
    out.family("memoryctl_backup_archive_failing", "1 while PostgreSQL fails to archive WAL.")
    if "postgres" in configured:
        out.sample({"store": "postgres"}, int(configured["postgres"].archive_failing))
    return out.text()
