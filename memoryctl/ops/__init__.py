"""Maintenance operations: reconciliation, embedding-model migration, re-embedding.

Each module has one reason to change:

- ``streams``: ordered keyset streams from the three stores and the merge-join over them.
- ``pgstate``: the SQL these operations need beyond ``RecordStore`` (outbox lookups, checkpoints,
  model versions), kept here so the record store does not grow an ops-shaped API.
- ``models``: how an embedding model is specified on the command line and which one is active.
- ``reembed``: the batched embed-and-upsert pipeline shared by ``migrate`` and ``reembed``.
- ``reconcile`` / ``migrate``: the commands themselves.
- ``runs``: recording every run in ``maintenance_runs``.
"""
