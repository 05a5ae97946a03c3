"""What pgBackRest holds for PostgreSQL, and how far WAL archiving has got.

Two sources, because each answers a different question:

- ``pgbackrest info`` (JSON), run through the configured command (``sudo -n -u postgres pgbackrest``:
  pgBackRest's files belong to postgres; the deploy allows exactly this one command): which base
  backups exist, when each finished, their size in the repository.
- ``pg_stat_archiver`` (plain SQL, any role may read it): when the last WAL segment was archived.
  With continuous archiving, the newest point a restore can reach is the later of the last backup's
  end and the last archived segment.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memoryctl.errors import MemoryctlError
from memoryctl.stores.pg import pg_errors

if TYPE_CHECKING:
    from memoryctl.config import BackupSettings
    from memoryctl.stores.pg import Pool

INFO_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class BaseBackup:
    label: str
    type: str  # full | diff | incr
    started: datetime
    finished: datetime
    database_bytes: int
    repository_bytes: int  # what this backup added to the repository (compressed, encrypted)

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "type": self.type,
            "started": self.started.isoformat(),
            "finished": self.finished.isoformat(),
            "seconds": round((self.finished - self.started).total_seconds(), 1),
            "database_bytes": self.database_bytes,
            "repository_bytes": self.repository_bytes,
        }


@dataclass(slots=True)
class StanzaInfo:
    status_code: int
    status: str
    backups: list[BaseBackup] = field(default_factory=list)
    wal_min: str | None = None
    wal_max: str | None = None


def parse_info(data: Any, stanza: str) -> StanzaInfo:
    """``pgbackrest --output=json info`` for one stanza."""
    entry = next((e for e in data if e.get("name") == stanza), None) if isinstance(data, list) else None
    if entry is None:
        raise MemoryctlError(f"pgbackrest info has no stanza {stanza!r}")
    backups = [
        BaseBackup(
            label=b["label"],
            type=b["type"],
            started=datetime.fromtimestamp(b["timestamp"]["start"], UTC),
            finished=datetime.fromtimestamp(b["timestamp"]["stop"], UTC),
            database_bytes=int(b["info"]["size"]),
            repository_bytes=int(b["info"]["repository"]["delta"]),
        )
        for b in entry.get("backup", [])
        if not b.get("error", False)
    ]
    archive = entry.get("archive") or [{}]
    return StanzaInfo(
        status_code=int(entry["status"]["code"]),
        status=str(entry["status"]["message"]),
        backups=sorted(backups, key=lambda b: b.finished),
        wal_min=archive[-1].get("min"),
        wal_max=archive[-1].get("max"),
    )


def stanza_info(settings: BackupSettings) -> StanzaInfo:
    assert settings.pgbackrest_stanza is not None
    command = [*settings.pgbackrest_command, f"--stanza={settings.pgbackrest_stanza}", "--output=json", "info"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=INFO_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MemoryctlError(f"{' '.join(command)}: {exc}") from None
    if result.returncode != 0:
        raise MemoryctlError(
            f"{' '.join(command)} exited {result.returncode}: {(result.stderr or result.stdout).strip()[:300]}",
            hint="the deploy allows the memoryctl user exactly this command (/etc/sudoers.d/memoryctl-pgbackrest)",
        )
    try:
        return parse_info(json.loads(result.stdout), settings.pgbackrest_stanza)
    except (ValueError, KeyError, TypeError) as exc:
        raise MemoryctlError(f"pgbackrest info: unexpected output ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True, slots=True)
class ArchiverState:
    archived_count: int
    last_archived_wal: str | None
    last_archived: datetime | None
    failed_count: int
    last_failed: datetime | None

    @property
    def failing(self) -> bool:
        """The last attempt failed (a failure newer than the last success)."""
        return self.last_failed is not None and (self.last_archived is None or self.last_failed > self.last_archived)


def archiver_state(pool: Pool) -> ArchiverState:
    with pg_errors(), pool.connection() as conn:
        row = conn.execute(
            "SELECT archived_count, last_archived_wal, last_archived_time, failed_count, last_failed_time"
            " FROM pg_stat_archiver"
        ).fetchone()
    assert row is not None
    return ArchiverState(
        archived_count=int(row["archived_count"]),
        last_archived_wal=row["last_archived_wal"],
        last_archived=row["last_archived_time"],
        failed_count=int(row["failed_count"]),
        last_failed=row["last_failed_time"],
    )
