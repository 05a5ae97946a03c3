"""Qdrant shard snapshots through its REST API: taken and restored per shard.

Why shards and not collection snapshots: on a cluster a collection snapshot holds only the shards
of the peer it was taken on, so a whole collection needs one per peer, and with replication factor
2 every point would be stored twice. One snapshot per *shard*, taken on a peer holding an active
replica of it, is the collection exactly once. Restoring recreates the collection (memoryctl's own
``ensure_collection``: same sharding, payload indexes) and uploads each shard's snapshot to one
peer holding a replica of it (``priority=snapshot``: the snapshot's data wins, and the cluster
copies it to the shard's other replicas; the restore waits until they are all active).

This talks to Qdrant with httpx directly: the snapshot endpoints stream files, which qdrant-client
does not, and the peers' REST addresses come from ``GET /cluster`` (their p2p URIs, on the REST
port of the configured URL).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from memoryctl.diskspace import atomic_file
from memoryctl.errors import StoreError, StoreUnavailable

CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class ShardSnapshot:
    collection: str
    shard_id: int
    file: str  # relative to the set directory
    size: int
    sha256: str
    points: int
    peer: str  # REST URL of the peer it was taken on

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class QdrantSnapshots:
    def __init__(self, url: str, api_key: str | None, *, timeout_s: float = 600.0) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.headers = {"api-key": api_key} if api_key else {}
        self.client = httpx.Client(headers=self.headers, timeout=httpx.Timeout(timeout_s, connect=5.0))

    def close(self) -> None:
        self.client.close()

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        import httpx

        try:
            yield
        except httpx.TransportError as exc:
            raise StoreUnavailable("qdrant", f"{what}: {type(exc).__name__}: {exc}") from None
        except httpx.HTTPStatusError as exc:
            body = exc.response.text[:300]
            raise StoreError("qdrant", f"{what}: HTTP {exc.response.status_code}: {body}") from None

    def _json(self, method: str, url: str, **kwargs: Any) -> Any:
        with self._errors(f"{method} {url}"):
            response = self.client.request(method, url, **kwargs)
            response.raise_for_status()
            return response.json()["result"]

    # ---- topology --------------------------------------------------------------------------------
    def peers(self) -> dict[int, str]:
        """Peer id -> REST URL. A single server (cluster disabled) is its own only peer."""
        cluster = self._json("GET", f"{self.url}/cluster")
        if cluster.get("status") != "enabled":
            return {}
        port = urlsplit(self.url).port or 6333
        scheme = urlsplit(self.url).scheme
        return {
            int(peer_id): f"{scheme}://{urlsplit(info['uri']).hostname}:{port}"
            for peer_id, info in cluster["peers"].items()
        }

    def replicas(self, collection: str) -> dict[int, list[str]]:
        """Shard id -> REST URLs of the peers holding an *active* replica of it."""
        info = self._json("GET", f"{self.url}/collections/{collection}/cluster")
        peers = self.peers()
        here = peers.get(int(info["peer_id"]), self.url)
        placement: dict[int, list[str]] = {}
        for shard in info["local_shards"]:
            if shard["state"] == "Active":
                placement.setdefault(int(shard["shard_id"]), []).append(here)
        for shard in info["remote_shards"]:
            if shard["state"] == "Active":
                placement.setdefault(int(shard["shard_id"]), []).append(peers[int(shard["peer_id"])])
        missing = [s for s in range(int(info["shard_count"])) if s not in placement]
        if missing:
            raise StoreError("qdrant", f"{collection}: no active replica of shard(s) {missing}; snapshot refused")
        return placement

    def aliases(self) -> dict[str, str]:
        result = self._json("GET", f"{self.url}/aliases")
        return {a["alias_name"]: a["collection_name"] for a in result["aliases"]}

    # ---- snapshot / restore ------------------------------------------------------------------------
    def snapshot_shard(self, peer: str, collection: str, shard_id: int, dest: Path) -> ShardSnapshot:
        """Snapshot one shard on ``peer``, stream it into ``dest`` (checksummed), delete it on the peer."""
        base = f"{peer}/collections/{collection}/shards/{shard_id}/snapshots"
        created = self._json("POST", base, params={"wait": "true"})
        name = created["name"]
        digest = hashlib.sha256()
        try:
            with self._errors(f"download {name}"), self.client.stream("GET", f"{base}/{name}") as response:
                response.raise_for_status()
                # Under a temporary name, renamed when complete: a full disk leaves no partial shard.
                size = created.get("size")
                with atomic_file(dest, int(size) if size is not None else None) as tmp, tmp.open("wb") as fh:
                    for chunk in response.iter_bytes(CHUNK):
                        digest.update(chunk)
                        fh.write(chunk)
        finally:
            self._json("DELETE", f"{base}/{name}", params={"wait": "true"})
        if created.get("checksum") and created["checksum"] != digest.hexdigest():
            raise StoreError("qdrant", f"{name}: downloaded file does not match Qdrant's checksum")
        return ShardSnapshot(
            collection=collection,
            shard_id=shard_id,
            file=dest.name,
            size=dest.stat().st_size,
            sha256=digest.hexdigest(),
            points=self._shard_points(peer, collection, shard_id),
            peer=peer,
        )

    def _shard_points(self, peer: str, collection: str, shard_id: int) -> int:
        info = self._json("GET", f"{peer}/collections/{collection}/cluster")
        for shard in info["local_shards"]:
            if int(shard["shard_id"]) == shard_id:
                return int(shard.get("points_count", 0))
        return 0

    def restore_shard(self, peer: str, collection: str, shard_id: int, source: Path) -> None:
        url = f"{peer}/collections/{collection}/shards/{shard_id}/snapshots/upload"
        with source.open("rb") as fh:
            self._json(
                "POST",
                url,
                params={"priority": "snapshot", "wait": "true"},
                files={"snapshot": (source.name, fh, "application/octet-stream")},
            )

    def count(self, collection: str) -> int:
        result = self._json("POST", f"{self.url}/collections/{collection}/points/count", json={"exact": True})
        return int(result["count"])
