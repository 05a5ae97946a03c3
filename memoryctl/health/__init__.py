"""``memoryctl health``: every component probed under one deadline, and its Prometheus text.

- ``probes``: ``check`` (the command), ``HealthReport`` (status, exit code, ``--json``),
  ``run_probes`` and each component's probe (PostgreSQL, Qdrant, the graph, the outbox, the last
  runs, vLLM, WireGuard).
- ``nightly``: the ``nightly`` component, the last night's steps and the adapters served now.
- ``postgres``: a replicated PostgreSQL's leader, standbys, sync state and lag, read on the
  connection the postgres probe holds.
- ``exposition``: ``prometheus(report)``, the textfile collector's file, and ``Exposition``, the
  one writer of the text format (``memoryctl backup status --prometheus`` writes through it too).

This module imports nothing: rendering a report (``cli.render`` reads ``nightly`` and ``postgres``)
and writing the backup metrics must not pay for the probes' imports (the stack, the stores).
"""
