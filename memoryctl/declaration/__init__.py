"""What every operation of ``memoryctl`` takes, declared once: the command line, the service's
HTTP routes and OpenAPI document, the MCP tools and ``MemoryQuery`` are all checked and generated
from it.

- ``declare``: what a declaration holds (``Param``, ``Operation``) and the one validation.
- ``table``: every operation's declaration.

Standard library only, no other part of memoryctl but its errors and the query's terms
(``memoryctl.query_terms``): the console script's fast path imports it on every call, and
``memoryctl.query.spec`` checks a query's fields with it. What each
operation *does* is ``memoryctl.operations``.
"""
