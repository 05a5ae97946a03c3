"""The hostile-client harness (issue 22, "Beyond the list"): generated CLI invocations and HTTP
requests, byte-level garbage, slow and partial clients, with invariants checked after each batch.

``cases`` draws the cases (hypothesis strategies over every operation's parameters), ``harness``
runs them against a store and checks what must hold; ``tests/e2e/test_hostile_clients.py`` is
the pytest entry point (2,000+ cases in every CI run; ``MEMORYCTL_HOSTILE_CASES=50000`` for the
long run, see the README's Tests section).
"""
