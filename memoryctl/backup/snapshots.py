"""``memoryctl backup qdrant`` and ``memoryctl restore qdrant``: snapshot sets of every collection.

Why back Qdrant up at all when PostgreSQL is the truth: rebuilding it means re-embedding every
memory, the expensive part (hours at 500k on CPU); restoring a snapshot set is a file copy plus a
catch-up of what changed since (``reconcile --repair`` re-delivers only the difference).

Backup: for every collection memoryctl made (every model version, not only the active one, so a
``migrate --rollback`` still works after a restore), one snapshot per shard is assembled in the
spool directory and shipped to the target with its ``manifest.json`` (collections, models, shard
files with sha256, point counts, which collection the alias pointed at); then sets beyond
``snapshot_keep`` are pruned. Restore: the newest complete set (or ``--set``) is fetched, each
collection recreated with memoryctl's own settings if missing, every shard uploaded to each of its
replicas, the alias set as it was, and the difference since the snapshot re-delivered.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memoryctl.backup.qdrant import QdrantSnapshots
from memoryctl.backup.target import MANIFEST, BackupError, SnapshotTarget, make_target
from memoryctl.config import revealed
from memoryctl.deadline import poll_until
from memoryctl.diskspace import cleaned_up
from memoryctl.errors import ConfigError, StoreError
from memoryctl.maintenance.runs import recorded_run
from memoryctl.stores.protocols import EmbeddingModelInfo

if TYPE_CHECKING:
    from memoryctl.stack import Stack

FORMAT = 1


def _api(stack: Stack) -> QdrantSnapshots:
    qs = stack.settings.qdrant
    if not qs.url:
        raise ConfigError(
            "Qdrant snapshots need a Qdrant server ([qdrant] url)",
            hint="the embedded profile keeps its vectors in the data directory: back that directory up instead",
        )
    return QdrantSnapshots(qs.url, revealed(qs.api_key))


def target_of(stack: Stack) -> SnapshotTarget:
    b = stack.settings.backup
    return make_target(b.snapshot_target, revealed(b.snapshot_password))


def spool_of(stack: Stack) -> Path:
    spool = stack.settings.backup.spool_dir or stack.settings.data_dir / "backup-spool"
    spool.mkdir(parents=True, exist_ok=True)
    return spool


def set_name(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def set_time(name: str) -> datetime:
    return datetime.strptime(name, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)


def backup_qdrant(stack: Stack) -> dict[str, Any]:
    """Snapshot every collection shard by shard, ship the set, prune old sets; recorded as a run."""
    target = target_of(stack)
    with recorded_run(stack.runs, "backup-qdrant") as rec:
        api = _api(stack)
        started = time.perf_counter()
        name = set_name(datetime.now(UTC))
        local = spool_of(stack) / name
        try:
            with cleaned_up(local):  # a full spool disk: the clear error, no half set left behind
                local.mkdir()
                manifest = _snapshot_all(stack, api, local, name)
                (local / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            snapshot_s = time.perf_counter() - started
            target.put(local)
        finally:
            shutil.rmtree(local, ignore_errors=True)
            api.close()
        keep = stack.settings.backup.snapshot_keep
        complete = target.sets()
        stale = [s for s in target.all_sets() if s not in complete[-keep:] and s != name]
        target.remove(stale)
        result = {
            "set": name,
            "target": target.describe(),
            "collections": len(manifest["collections"]),
            "shards": sum(len(c["shards"]) for c in manifest["collections"]),
            "points": sum(c["points"] for c in manifest["collections"]),
            "bytes": manifest["bytes"],
            "snapshot_s": round(snapshot_s, 2),
            "total_s": round(time.perf_counter() - started, 2),
            "pruned": stale,
        }
        rec.counts = {k: result[k] for k in ("collections", "shards", "points", "bytes")}
        rec.details = {k: result[k] for k in ("set", "target", "snapshot_s", "total_s", "pruned")}
    return result


def _snapshot_all(stack: Stack, api: QdrantSnapshots, local: Path, name: str) -> dict[str, Any]:
    vectors = stack.require_vectors()
    alias = stack.settings.qdrant.alias
    aliases = api.aliases()
    collections: list[dict[str, Any]] = []
    for info in vectors.collections():
        (local / info.name).mkdir()
        shards: list[dict[str, Any]] = []
        for shard_id, replicas in sorted(api.replicas(info.name).items()):
            dest = local / info.name / f"shard-{shard_id}.snapshot"
            shards.append(api.snapshot_shard(replicas[0], info.name, shard_id, dest).as_dict())
            shards[-1]["file"] = f"{info.name}/{dest.name}"
        collections.append(
            {
                "name": info.name,
                "model_id": info.model.model_id,
                "dim": info.model.dim,
                "distance": info.model.distance,
                "active": aliases.get(alias) == info.name,
                "points": api.count(info.name),
                "shards": shards,
            }
        )
    total = sum(int(shard["size"]) for coll in collections for shard in coll["shards"])
    return {
        "format": FORMAT,
        "set": name,
        "created_at": set_time(name).isoformat(),
        "alias": alias,
        "collections": collections,
        "bytes": total,
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def restore_qdrant(stack: Stack, *, name: str | None = None) -> dict[str, Any]:
    """Restore a snapshot set (the newest complete one by default); recorded as a run."""
    target = target_of(stack)
    sets = target.sets()
    if not sets:
        raise BackupError(
            f"no complete Qdrant snapshot set at {target.describe()}", hint="run `memoryctl backup qdrant`"
        )
    name = name or sets[-1]
    if name not in sets:
        raise BackupError(f"no complete snapshot set {name!r} at {target.describe()}", hint=f"sets: {', '.join(sets)}")
    with recorded_run(stack.runs, "restore-qdrant") as rec:
        started = time.perf_counter()
        api = _api(stack)
        local = target.fetch(name, spool_of(stack))
        try:
            fetched_s = time.perf_counter() - started
            manifest = json.loads((local / MANIFEST).read_text())
            restored = _restore_all(stack, api, local, manifest)
        finally:
            shutil.rmtree(local, ignore_errors=True)
            api.close()
        result = {
            "set": name,
            "target": target.describe(),
            "collections": restored,
            "fetch_s": round(fetched_s, 2),
            "total_s": round(time.perf_counter() - started, 2),
        }
        rec.counts = {"collections": len(restored), "points": sum(restored.values())}
        rec.details = {k: result[k] for k in ("set", "target", "fetch_s", "total_s")}
    return result


def _active_replicas(api: QdrantSnapshots, collection: str, wait_s: float = 60.0) -> dict[int, list[str]]:
    """The replicas of a collection just created on a cluster take a moment to become active."""
    polled = poll_until(
        lambda: api.replicas(collection), ready=lambda _: True, timeout_s=wait_s, interval_s=1.0, retry_on=(StoreError,)
    )
    if polled.error is not None:
        raise polled.error
    return polled.value or {}


def _settled(api: QdrantSnapshots, collection: str, placement: dict[int, list[str]], wait_s: float = 120.0) -> None:
    """Every replica active again. A snapshot uploaded with ``priority=snapshot`` to one replica
    makes the cluster mark the shard's other replicas out of date until they have caught up, and
    until then a read of the collection fails ("does not have enough active replicas")."""
    want = {shard: sorted(peers) for shard, peers in placement.items()}

    def now() -> dict[int, list[str]]:
        return {shard: sorted(peers) for shard, peers in api.replicas(collection).items()}

    polled = poll_until(now, ready=want.__eq__, timeout_s=wait_s, interval_s=1.0, retry_on=(StoreError,))
    if not polled.ok:
        raise BackupError(
            f"{collection}: replicas not all active {wait_s:.0f} s after the restore (now {polled.value or {}},"
            f" want {want})",
            hint="check `memoryctl health` (Qdrant cluster status), then run the restore again",
        )


def _restore_all(stack: Stack, api: QdrantSnapshots, local: Path, manifest: dict[str, Any]) -> dict[str, int]:
    if manifest.get("format") != FORMAT:
        raise BackupError(f"snapshot set {manifest.get('set')}: unknown format {manifest.get('format')!r}")
    vectors = stack.require_vectors()
    vectors.collections()  # also drops what this process remembers of collections that are gone
    restored: dict[str, int] = {}
    for coll in manifest["collections"]:
        model = EmbeddingModelInfo(coll["model_id"], int(coll["dim"]), coll["distance"])
        created = vectors.ensure_collection(model, activate_if_none=False)
        if created != coll["name"]:
            raise BackupError(
                f"collection {coll['name']} would be restored as {created}",
                hint="restore with the [qdrant] collection_prefix the set was taken with",
            )
        placement = _active_replicas(api, created)
        if len(placement) != len(coll["shards"]):
            raise BackupError(
                f"{created} has {len(placement)} shard(s) here, the snapshot {len(coll['shards'])}",
                hint="restore into a collection with the same [qdrant] shard_number (drop the new one first)",
            )
        for shard in coll["shards"]:
            path = local / shard["file"]
            if _sha256(path) != shard["sha256"]:
                raise BackupError(
                    f"{shard['file']}: checksum mismatch, the set is damaged", hint="restore another --set"
                )
            # One replica: with ``priority=snapshot`` the cluster marks the shard's other replicas
            # out of date and copies this one to them. Uploading to each replica raced (measured on
            # the local nodes: both replicas of a shard left Dead, the collection unreadable).
            api.restore_shard(placement[int(shard["shard_id"])][0], created, int(shard["shard_id"]), path)
        _settled(api, created, placement)
        restored[created] = api.count(created)
    active = [c for c in manifest["collections"] if c["active"]]
    if active:
        vectors.activate(active[0]["model_id"])
    return restored
