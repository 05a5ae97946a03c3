"""The operator console of ``memoryctl serve``, at ``/console`` on its HTTP listener (docs/console.md).

Server-rendered pages (Jinja2, autoescaped), no build step, no script but the static files here, a
Content-Security-Policy that forbids any other. Every page runs the operations the command line
and HTTP run, with the access check of HTTP and MCP (``memoryctl.operations.access.bind``):

- ``web``: the application -- sign-in, the session check, CSRF, security headers, routes;
- ``session``: signed session cookies and CSRF tokens (a secret of the data directory);
- ``overview``, ``runs``, ``outbox``, ``memories``, ``stats``: one module per page;
- ``draw``: the geometry of the charts and graphs the templates render as inline SVG;
- ``templates/``, ``static/``: the pages' Jinja2 templates, the style sheet and the one script.
"""
