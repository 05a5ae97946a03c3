"""``memoryctl serve``: one resident process that holds the model, the pools and the stores open.

Why: a command-line call otherwise pays for its imports, for starting the embedded PostgreSQL and
for loading the embedding model before it does its few milliseconds of work; and in the embedded
profile only one process may hold the stores at all. The service answers the CLI's operations
over a Unix socket (file permissions are the access control) and, when configured, HTTP on
loopback or the mesh address (bearer token). The CLI uses it when it is running and does the same
work in-process when it is not: both paths run the same ``operations`` and print the same output.

- ``operations``: the operation table (parameters, validation, what each returns), shared by
  both paths and by the OpenAPI description.
- ``server``: the HTTP server (standard library, bounded worker pool, limits, shutdown).
- ``client``: finding a running service and calling it.
- ``wire``: what both sides know (reply headers, the bearer token, JSON encoding), so that neither
  imports the other.
"""
