"""Backups and restores (docs/backup.md): PostgreSQL through pgBackRest, Qdrant through its shard
snapshots, Neo4j rebuilt from PostgreSQL.

- ``target``: where snapshot sets live (the backup node's rsync daemon, or a directory).
- ``qdrant``: Qdrant's snapshot REST endpoints (per shard).
- ``snapshots``: ``backup qdrant`` / ``restore qdrant`` — sets of shard snapshots with a manifest.
- ``pgbackrest``: what pgBackRest holds, and how far WAL archiving has got.
- ``status``: ``backup status`` — per store, the newest backup and the newest restorable point.
- ``rebuild``: ``rebuild graph`` — the graph store from PostgreSQL.
"""
