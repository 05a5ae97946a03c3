"""The names stores go by in reports, errors, outbox targets and ``degraded`` lists.

One place, because they are part of the CLI contract: ``memoryctl query --json`` says
``"degraded": ["qdrant"]``, write results count pending deliveries per store name, and
``memoryctl health`` keys its components by them. Whatever engine implements a store, it reports
under the store's name: both vector engines (a Qdrant server, Qdrant Edge) are ``qdrant``.
"""

from __future__ import annotations

POSTGRES = "postgres"
QDRANT = "qdrant"  # the vector store, whichever engine: a Qdrant server or Qdrant Edge
NEO4J = "neo4j"  # the cluster profile's graph
SQL_GRAPH = "graph"  # the embedded profile's graph: node/edge tables in PostgreSQL
# Not a store: the query's lexical leg (a PostgreSQL statement), named in ``degraded`` when it failed
# while PostgreSQL itself still answered (the dense leg ranked, PostgreSQL hydrated).
LEXICAL = "lexical"
