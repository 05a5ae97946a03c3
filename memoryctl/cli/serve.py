"""``memoryctl serve``: run the resident service in the foreground (systemd runs it so)."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from memoryctl.cli.context import ctx_of
from memoryctl.cli.output import err


def serve(
    ctx: typer.Context,
    http: Annotated[
        str | None,
        typer.Option("--http", help="Also answer HTTP on HOST:PORT (loopback or the mesh address); token required."),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every request.")] = False,
) -> None:
    """Hold the model and the stores open and answer the CLI's operations (Unix socket, HTTP)."""
    from memoryctl.serve.server import Service

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    settings = ctx_of(ctx).settings
    service = Service(settings, http=http)
    try:
        timings = service.warm_up()
        service.start()
    except BaseException:
        service.shutdown(grace_s=0)
        raise
    where = [f"unix:{service.socket_path}"]
    if service.address_http:
        where.append(f"http://{service.address_http} (bearer token: serve.token or {settings.serve_token_file})")
    warm = ", ".join(f"{k} {v:.0f} ms" for k, v in timings.items())
    err.print(f"memoryctl serve: answering on {' and '.join(where)}; warm-up: {warm}", markup=False, highlight=False)
    service.serve_forever()
    err.print("memoryctl serve: stopped", markup=False)
