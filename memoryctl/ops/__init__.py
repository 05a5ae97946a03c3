"""Maintenance operations: reconciliation, embedding-model migration, re-embedding, the nightly job.

Each module has one reason to change:

- ``needs``: what the operations need from the composition root (``memoryctl.stack.Stack``).
- ``streams``: ordered keyset streams from the three stores and the merge-join over them.
- ``pgstate``: the SQL these operations need beyond ``RecordStore`` (outbox lookups, checkpoints,
  model versions, training turns), kept here so the record store does not grow an ops-shaped API.
- ``models``: how an embedding model is specified on the command line and which one is active.
- ``reembed``: the batched embed-and-upsert pipeline shared by model migration and ``reembed``.
- ``reconcile`` / ``model_migration`` / ``nightly``: the commands themselves (``model_migration``
  is ``memoryctl migrate``: vectors to another embedding model; the schema's migrations are
  ``memoryctl.stores.schema``).
- ``runs``: recording every run in ``maintenance_runs``.
"""
