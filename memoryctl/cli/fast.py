"""The console script's fast path: ``query``, ``get``, ``add`` and ``forget`` sent to a running
``memoryctl serve`` with the standard library only (and rich for a table).

Why: typer and pydantic cost ~250 ms of CPU before the full command line parses anything, more
than the service needs to answer (``benchmarks/serve.py latency``). So the entry point first parses
the common commands itself, strictly: ``run`` answers only what it fully understands and returns
None for everything else -- another command, ``--help``, an option it does not know, a value out
of range, an invalid agent or id, no service, a configuration the service does not run with --
and the full command line then does the work and prints its own errors. What it sends is built by
the same functions (``memoryctl.cli.params``) and printed by the same ones (``memoryctl.cli.output``,
``memoryctl.cli.render``) as the full command line, so the output and exit codes are the same;
``tests/e2e/test_fast_cli.py`` runs both on one command list, and pins this table to typer's.

The configuration is read as raw layers (``memoryctl.config_layers``) and not validated here:
the request carries their digest, and the service runs it only if its own layers, which it
validated when it started, are the same (else 409, nothing run, and the full command line takes
over).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from memoryctl import config_layers
from memoryctl.cli import params, render
from memoryctl.cli.output import emit
from memoryctl.errors import MemoryctlError
from memoryctl.model import DEFAULT_KIND, validate_agent_id

Kind = Literal["flag", "str", "int", "float", "list"]


@dataclass(frozen=True, slots=True)
class Option:
    flag: str
    name: str  # the typer parameter's name
    kind: Kind
    default: Any = None
    low: int | None = None
    high: int | None = None


@dataclass(frozen=True, slots=True)
class Command:
    positional: str  # the typer argument's name
    arity: Literal["optional", "one", "many"]
    options: tuple[Option, ...]
    build: Callable[[params.AgentOf, dict[str, Any]], dict[str, Any]]
    human: Callable[[dict[str, Any]], render.Human]


AGENT = Option("--agent", "agent", "str")
JSON = Option("--json", "as_json", "flag", False)

COMMANDS: dict[str, Command] = {
    "query": Command(
        "text",
        "optional",
        (
            AGENT,
            Option("--all-agents", "all_agents", "flag", False),
            Option("--entity", "entity", "str"),
            Option("--via", "via", "list"),
            Option("--hops", "hops", "int", 1, 1, 3),
            Option("--direction", "direction", "str", "both"),
            Option("--since", "since", "str"),
            Option("--until", "until", "str"),
            Option("--where", "where", "list"),
            Option("--combine", "combine", "str", "and"),
            Option("--limit", "limit", "int", 10, 1, 1000),
            Option("--threshold", "threshold", "float"),
            Option("--retrieval", "retrieval", "str", "hybrid"),
            Option("--half-life", "half_life", "str"),
            JSON,
            Option("--explain", "explain", "flag", False),
        ),
        lambda agent_of, v: params.query(agent_of, **_without(v, "as_json", "explain")),
        lambda v: render.query(v["explain"]),
    ),
    "get": Command(
        "memory_id",
        "one",
        (AGENT, JSON),
        lambda agent_of, v: params.get(agent_of, memory_id=v["memory_id"], agent=v["agent"]),
        lambda v: render.memory,
    ),
    "add": Command(
        "text",
        "one",
        (
            AGENT,
            Option("--kind", "kind", "str", DEFAULT_KIND),
            Option("--at", "at", "str"),
            Option("--entity", "entity", "list"),
            Option("--rel", "rel", "list"),
            Option("--meta", "meta", "list"),
            Option("--id", "id_", "str"),
            JSON,
        ),
        lambda agent_of, v: params.add(agent_of, **_without(v, "as_json")),
        lambda v: render.added,
    ),
    "forget": Command(
        "memory_ids",
        "many",
        (AGENT, JSON),
        lambda agent_of, v: params.forget(agent_of, memory_ids=v["memory_ids"], agent=v["agent"]),
        lambda v: render.forgotten,
    ),
}


def _without(values: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in values.items() if k not in names}


def run(argv: Sequence[str]) -> int | None:
    """The exit code of a command answered by the service, or None: the full command line runs it.

    An error the service answers with (or a failure once the request was sent) is raised, as the
    full command line would raise it.
    """
    parsed = parse(argv)
    if parsed is None:
        return None
    top, name, values = parsed
    try:
        _, data = config_layers.layers(Path(top["config"]) if top["config"] else None, {"profile": top["profile"]})
        target = _service(data)
        if target is None:
            return None
        socket, default_agent, timeout = target
        command = COMMANDS[name]

        def agent_of(agent: str | None) -> str:
            return validate_agent_id(agent) if agent else default_agent

        request = command.build(agent_of, values)
    except MemoryctlError:
        return None  # the full command line reports it (an invalid agent, id, config file)

    from memoryctl.serve.client import ConfigDiffers, ServiceClient, reply_timeout

    try:
        reply = ServiceClient(socket_path=socket, timeout=reply_timeout(timeout)).call(
            name, {k: v for k, v in request.items() if v is not None}, config_digest=config_layers.digest(data)
        )
    except ConfigDiffers:
        return None
    if reply is None:
        return None
    return emit(reply, values["as_json"], command.human(values))


def parse(argv: Sequence[str]) -> tuple[dict[str, str | None], str, dict[str, Any]] | None:
    """(top-level options, command, its values by typer name), or None when not understood."""
    top: dict[str, str | None] = {"config": None, "profile": None}
    args = list(argv)
    while args and args[0].startswith("-"):
        token = args.pop(0)
        flag, eq, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        key = {"--config": "config", "-c": "config", "--profile": "profile"}.get(flag)
        if key is None or (not eq and not args):
            return None
        top[key] = inline if eq else args.pop(0)
    if not args or args[0] not in COMMANDS or top["config"] == "":
        return None
    name = args.pop(0)
    values = _parse_command(COMMANDS[name], args)
    return None if values is None else (top, name, values)


def _parse_command(command: Command, args: list[str]) -> dict[str, Any] | None:
    by_flag = {o.flag: o for o in command.options}
    values: dict[str, Any] = {o.name: [] if o.kind == "list" else o.default for o in command.options}
    positionals: list[str] = []
    while args:
        token = args.pop(0)
        if not token.startswith("-") or token == "-":
            positionals.append(token)
            continue
        flag, eq, inline = token.partition("=")
        option = by_flag.get(flag)
        if option is None:
            return None  # --help, --, a typo, a negative number: typer's to answer
        if option.kind == "flag":
            if eq:
                return None
            values[option.name] = True
            continue
        if not eq and not args:
            return None
        value = _convert(option, inline if eq else args.pop(0))
        if value is None:
            return None
        if option.kind == "list":
            values[option.name].append(value)
        else:
            values[option.name] = value
    for option in command.options:
        if option.kind == "list" and not values[option.name]:
            values[option.name] = None  # typer's value for a repeatable option not given
    counts = {"optional": (0, 1), "one": (1, 1), "many": (1, len(positionals) or 1)}[command.arity]
    if not counts[0] <= len(positionals) <= counts[1]:
        return None
    if command.arity == "many":
        values[command.positional] = positionals
    else:
        values[command.positional] = positionals[0] if positionals else None
    return values


def _convert(option: Option, raw: str) -> Any:
    """The value of a number written plainly (``-3``, ``0.5``); None for any other spelling, which
    typer then converts or refuses in its own way (whitespace, ``+``, ``_``, ``1e3``, ``nan``)."""
    if option.kind not in ("int", "float"):
        return raw
    digits = raw.removeprefix("-")
    if option.kind == "float" and digits.count(".") == 1:
        digits = digits.replace(".", "", 1)
    if not (digits.isascii() and digits.isdigit()):
        return None
    if option.kind == "float":
        return float(raw)
    number = int(raw)
    in_range = (option.low is None or number >= option.low) and (option.high is None or number <= option.high)
    return number if in_range else None


def _service(data: dict[str, Any]) -> tuple[Path, str, float] | None:
    """(socket, default agent, ``serve.io_timeout_s``) from raw configuration layers, None when unusual."""
    serve = data.get("serve", {})
    if not isinstance(serve, dict) or serve.get("url") is not None:
        return None  # a service on another host (HTTP, token): the full command line
    use = serve.get("use", True)
    if not (use is True or (isinstance(use, str) and use.lower() in ("1", "true", "yes", "on", "t", "y"))):
        return None
    socket, data_dir, agent = serve.get("socket"), data.get("data_dir"), data.get("default_agent", "default")
    io_timeout = serve.get("io_timeout_s", 30.0)
    if not all(isinstance(v, str) for v in (socket or "", data_dir or "", agent)):
        return None
    if not isinstance(io_timeout, int | float) or isinstance(io_timeout, bool):
        return None
    path = Path(socket) if socket else (Path(data_dir) if data_dir else config_layers.default_data_dir()) / "serve.sock"
    if not path.exists():
        return None
    return path, agent, float(io_timeout)
