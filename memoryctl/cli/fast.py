"""The console script's fast path: an operation sent to a running ``memoryctl serve`` with the
standard library only (and rich for a table).

Why: typer and pydantic cost ~250 ms of CPU before the full command line parses anything, more
than the service needs to answer (``benchmarks/serve.py latency``). So the entry point first parses
the command itself, from the same declaration the typer commands are generated from
(``memoryctl.declaration.table``), strictly: ``run`` answers only what it fully understands and
returns None for everything else -- ``--help``, an option it does not know, a number spelled
unusually, an upload (``import``), a command that runs locally, no service, a configuration the
service does not run with -- and the full command line then does the work and prints its own
errors. What it sends is built by the same function (``memoryctl.cli.params``) and printed by the
same one (``memoryctl.cli.render``) as the full command line's, and the service validates it
(``Operation.validate``), so output and exit codes are the same; ``tests/e2e/test_serve.py`` runs
both on one command list.

The configuration is read as raw layers (``memoryctl.config_layers``) and not validated here:
the request carries their digest, and the service runs it only if its own layers, which it
validated when it started, are the same (else 412, nothing run, and the full command line takes
over).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memoryctl import config_layers
from memoryctl.cli import fastwire, params, render
from memoryctl.declaration.declare import Operation, Param
from memoryctl.declaration.table import GROUPS, OPERATIONS
from memoryctl.errors import MemoryctlError
from memoryctl.serve.wire import ConfigDiffers, reply_timeout


def run(argv: Sequence[str]) -> int | None:
    """The exit code of a command answered by the service, or None: the full command line runs it.

    An error the service answers with (or a failure once the request was sent) is raised, as the
    full command line would raise it.
    """
    parsed = parse(argv)
    if parsed is None:
        return None
    top, op, values = parsed
    try:
        _, data = config_layers.layers(Path(top["config"]) if top["config"] else None, {"profile": top["profile"]})
        target = _service(data)
        if target is None:
            return None
        socket, io_timeout = target
        request = params.request(op, values)
    except MemoryctlError:
        return None  # the full command line reports it (a config file, a --meta without '=')
    timeout = None if op.long else reply_timeout(io_timeout)
    try:
        reply = fastwire.call(socket, op.name, request, digest=config_layers.digest(data), timeout=timeout)
    except ConfigDiffers:
        return None
    if reply is None:
        return None
    return render.show(op, reply, values)


def parse(argv: Sequence[str]) -> tuple[dict[str, str | None], Operation, dict[str, Any]] | None:
    """(top-level options, the operation, its values by declared name), or None when not understood."""
    top: dict[str, str | None] = {"config": None, "profile": None}
    args = list(argv)
    while args and args[0].startswith("-"):
        token = args.pop(0)
        flag, eq, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        key = {"--config": "config", "-c": "config", "--profile": "profile"}.get(flag)
        if key is None or (not eq and not args):
            return None
        top[key] = inline if eq else args.pop(0)
    if not args or top["config"] == "":
        return None
    name = args.pop(0)
    if name in GROUPS:
        if not args:
            return None
        name += " " + args.pop(0)
    op = OPERATIONS.get(name)
    if op is None or op.local or op.upload:
        return None
    values = _parse_command(op, args)
    return None if values is None else (top, op, values)


def _parse_command(op: Operation, args: list[str]) -> dict[str, Any] | None:
    shown = [p for p in (*op.params, *op.outputs) if p.cli]
    by_flag: dict[str, tuple[Param, Any]] = {}
    for p in shown:
        if p.option is not None:
            by_flag[p.option] = (p, True)
            if p.short:
                by_flag[p.short] = (p, True)
            if p.off_flag:
                by_flag[p.off_flag] = (p, False)
    values: dict[str, Any] = {p.name: None if _many(p) else p.default for p in shown}
    positionals: list[str] = []
    while args:
        token = args.pop(0)
        if not token.startswith("-") or token == "-":
            positionals.append(token)
            continue
        flag, eq, inline = token.partition("=")
        found = by_flag.get(flag)
        if found is None:
            return None  # --help, --, a typo, a negative number: typer's to answer
        p, on = found
        if p.type == "boolean":
            if eq:
                return None
            values[p.name] = on
            continue
        if not eq and not args:
            return None
        value = _convert(p, inline if eq else args.pop(0))
        if value is None:
            return None
        if _many(p):
            values[p.name] = [*(values[p.name] or []), value]
        else:
            values[p.name] = value
    for p in (p for p in shown if p.option is None):
        if _many(p):
            items = [_convert(p, raw) for raw in positionals]
            if None in items:
                return None
            values[p.name], positionals = items or None, []
        elif positionals:
            values[p.name] = positionals.pop(0)
        if p.required and not values[p.name]:
            return None  # typer says what is missing
    return None if positionals else values


def _many(p: Param) -> bool:
    return p.type == "array" or p.pairs


def _convert(p: Param, raw: str) -> Any:
    """The value of a number written plainly (``-3``, ``0.5``); None for any other spelling, which
    typer then converts or refuses in its own way (whitespace, ``+``, ``_``, ``1e3``, ``nan``)."""
    kind = p.items if p.type == "array" else p.type
    if kind not in ("integer", "number"):
        return raw
    digits = raw.removeprefix("-")
    if kind == "number" and digits.count(".") == 1:
        digits = digits.replace(".", "", 1)
    if not (digits.isascii() and digits.isdigit()):
        return None
    return float(raw) if kind == "number" else int(raw)


def _service(data: dict[str, Any]) -> tuple[Path, float] | None:
    """(socket, ``serve.io_timeout_s``) from raw configuration layers, None when unusual."""
    serve = data.get("serve", {})
    if not isinstance(serve, dict) or serve.get("url") is not None:
        return None  # a service on another host (HTTP, token): the full command line
    use = serve.get("use", True)
    if not (use is True or (isinstance(use, str) and use.lower() in ("1", "true", "yes", "on", "t", "y"))):
        return None
    socket, data_dir = serve.get("socket"), data.get("data_dir")
    io_timeout = serve.get("io_timeout_s", 30.0)
    if not all(isinstance(v, str) for v in (socket or "", data_dir or "")):
        return None
    if not isinstance(io_timeout, int | float) or isinstance(io_timeout, bool):
        return None
    path = Path(socket) if socket else (Path(data_dir) if data_dir else config_layers.default_data_dir()) / "serve.sock"
    if not path.exists():
        return None
    return path, float(io_timeout)
