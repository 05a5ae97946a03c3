"""The console's ASGI application: the sign-in routes, the static files and every page's routes
(each page module's ``ROUTES``), behind the security headers. Mounted at ``/console`` by
``memoryctl.serve.app``."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from memoryctl.console import memories, outbox, overview, runs, stats
from memoryctl.console.web import HERE, PREFIX, Console, SecurityHeaders, Service


def build(service: Service) -> ASGIApp:
    """The console's ASGI application (mounted at ``/console``)."""
    console = Console(service)
    routes: list[Route | Mount] = [
        Route("/", lambda request: RedirectResponse(f"{PREFIX}/overview", 303), methods=["GET"]),
        Route("/login", console.login_form, methods=["GET"]),
        Route("/login", console.login, methods=["POST"]),
        Route("/logout", console.page(console.logout), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    for module in (overview, runs, outbox, memories, stats):
        for path, handler, methods in module.ROUTES:
            routes.append(Route(path, console.page(handler), methods=methods))

    async def not_found(request: Request, exc: Exception) -> Response:
        status = int(getattr(exc, "status_code", 404))
        return console.error(status, f"no console page {request.url.path!r}" if status == 404 else "method not allowed")

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    return SecurityHeaders(app)
