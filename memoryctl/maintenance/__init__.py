"""The maintenance jobs: reconciliation, embedding-model migration, re-embedding, the nightly job.

Each module has one reason to change:

- ``needs``: what the jobs need from the composition root (``MaintenanceStack``, a protocol
  ``memoryctl.stack.Stack`` satisfies).
- ``streams``: ordered keyset streams from the three stores and the merge-join over them.
- ``pgstate``: the SQL these operations need beyond ``RecordStore`` (outbox lookups, checkpoints,
  model versions, training turns), kept here so the record store does not grow an ops-shaped API.
- ``models``: how an embedding model is specified on the command line and which one is active.
- ``reembed``: the batched embed-and-upsert pipeline shared by model migration and ``reembed``.
- ``reconcile`` / ``model_migration`` / ``nightly``: the commands themselves (``model_migration``
  is ``memoryctl migrate``: vectors to another embedding model; the schema's migrations are
  ``memoryctl.stores.schema``).
- ``adapters``: ``memoryctl adapters``, the LoRA adapter versions and rolling the served one back.
- ``training``: what ``nightly`` and ``adapters`` need of the training side (the memoryctl-lora
  distribution, torch), declared as a protocol and found through its entry point: nothing in
  memoryctl imports ``memoryctl_lora``.
- ``gpu_pause``, ``embedding_version``: the nightly's GPU freed from the services holding it; a
  new embedding model version put on the idle embedding server for ``migrate``.
- ``runs``: recording every run in ``maintenance_runs``.

``memoryctl.operations.maintenance`` runs them as operations (validated parameters in, a ``Reply``
out); this package knows nothing of the surfaces.
"""
