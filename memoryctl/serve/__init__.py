"""``memoryctl serve``: one resident process that holds the model, the pools and the stores open.

Why: a command-line call otherwise pays for its imports, for starting the embedded PostgreSQL and
for loading the embedding model before it does its few milliseconds of work; and in the embedded
profile only one process may hold the stores at all. The service answers the CLI's operations
over a Unix socket (file permissions are the access control) and, when configured, HTTP on
loopback or the mesh address (bearer token). The CLI uses it when it is running and does the same
work in-process when it is not: both paths run the same ``operations`` and print the same output.

The operations themselves are declared in ``memoryctl.declaration`` and run by
``memoryctl.operations.run`` (who may run what with a token: ``memoryctl.operations.access``).
Here:

- ``app``: the ASGI application (Starlette): one route per declared operation, the OpenAPI
  document, the status and MCP at ``/mcp``, behind one bearer token check.
- ``server``: uvicorn, one server per listener (the Unix socket; HTTP when configured), each with
  its own limits, and the shutdown.
- ``mcp``, ``mcp_auth``: the operations declared ``mcp=True`` as MCP tools; the caller the token
  check hands to them.
- ``openapi``: the OpenAPI 3.1 description, generated from the declarations.
- ``client``: finding a running service and calling it (the CLI, before working in-process).
- ``wire``: what both sides know (reply headers, the bearer token, JSON encoding), so that neither
  imports the other.
"""
