"""The operations that run in the calling process only (``local=True`` in the table): they are
about this process -- its configuration, or a server it becomes -- not about the stores' data."""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from memoryctl.cli.output import err, out, print_json

if TYPE_CHECKING:
    from memoryctl.cli.context import Ctx


def config_show(ctx: Ctx, params: Mapping[str, Any], values: Mapping[str, Any]) -> int:
    """The effective configuration (file + environment + flags), secrets masked."""
    from memoryctl.config import masked

    data = masked(ctx.settings)
    if values.get("json"):
        print_json(data)
    else:
        out.print(_as_toml(data), markup=False, highlight=False)
    return 0


def _as_toml(data: dict[str, Any], prefix: str = "") -> str:
    """A TOML rendering good enough to paste back into a config file."""
    scalars = [(k, v) for k, v in data.items() if not isinstance(v, dict)]
    tables = [(k, v) for k, v in data.items() if isinstance(v, dict)]
    lines = [f"{k} = {json.dumps(v)}" for k, v in scalars if v is not None]
    lines += [f"# {k} = (unset)" for k, v in scalars if v is None]
    for k, v in tables:
        name = f"{prefix}{k}"
        lines += ["", f"[{name}]", _as_toml(v, prefix=f"{name}.")]
    return "\n".join(lines)


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )


def serve(ctx: Ctx, params: Mapping[str, Any], values: Mapping[str, Any]) -> int:
    """Run the resident service in the foreground (systemd runs it so) until SIGTERM/SIGINT."""
    from memoryctl.serve.server import Service

    _logging(bool(params.get("verbose")))
    settings = ctx.settings
    # A stop while warming up (systemctl stop, a harness's SIGTERM) must still stop what the
    # warm-up started -- the embedded PostgreSQL above all: SIGTERM's default action would end the
    # process there and then, leaving it orphaned. Until serve_forever installs its own handlers,
    # SIGTERM is an interrupt like Ctrl-C.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    service = Service(settings, http=params.get("http"))
    try:
        timings = service.warm_up()
        service.start()
    except BaseException:
        service.shutdown(grace_s=0)
        raise
    where = [f"unix:{service.socket_path}"]
    if service.address_http:
        where.append(f"http://{service.address_http} (bearer token: serve.token or the token file; MCP at /mcp)")
    warm = ", ".join(f"{k} {v:.0f} ms" for k, v in timings.items())
    err.print(f"memoryctl serve: answering on {' and '.join(where)}; warm-up: {warm}", markup=False, highlight=False)
    service.serve_forever()
    err.print("memoryctl serve: stopped", markup=False)
    return 0


def mcp(ctx: Ctx, params: Mapping[str, Any], values: Mapping[str, Any]) -> int:
    """MCP over stdin/stdout: the tools call the running service, or run in this process."""
    from memoryctl.serve.mcp import serve_stdio

    _logging(False)
    serve_stdio(ctx.call, agent=params.get("agent"))
    return 0
