"""Running ``memoryctl``'s operations, the same way for every surface.

What an operation is (parameters and their validation, access, profiles, exit codes, reply type)
is declared in ``memoryctl.declaration`` (``table.OPERATIONS``), each naming its runner as
``module:function``. This package runs them:

- here: ``run(client, name, params)`` looks the operation up, refuses one that is ``local`` or not
  for this profile, validates the parameters, calls the runner with a ``Call`` (under the caller's
  ``trigger``/``actor``, which the run records keep) and returns its ``Reply``, ``data`` dumped as
  the declared reply type's ``--json`` document. The service (Unix socket, HTTP, MCP) and the
  command line in-process all call it; ``runner(op)`` imports a runner (the command line calls a
  ``local`` operation's runner itself, in ``memoryctl.cli.local``).
- ``memories``, ``maintenance``, ``demo``: the runners, ``(MemoryClient, Call) -> Reply``.
- ``reply``: ``Reply``, what every surface prints (its ``--json`` data, exit code, warnings).
- ``access``: who may run what with a token (the operator; an agent token, bound to its agent);
  ``tokens``: the agent tokens themselves, issued by ``memoryctl token`` and kept hashed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memoryctl.declaration.shape import dump
from memoryctl.declaration.table import OPERATIONS
from memoryctl.errors import InputError, UsageError

if TYPE_CHECKING:
    from memoryctl.client import MemoryClient
    from memoryctl.declaration.declare import Operation
    from memoryctl.operations.reply import Reply

#: ``progress(phase, advance, total)``: how far a long operation is (the command line draws bars).
Progress = Callable[[str, int, "int | None"], None]


@dataclass(slots=True)
class Call:
    """One run of an operation: its validated parameters and what the caller provides."""

    params: dict[str, Any]
    upload: Path | None = None  # the request body of an upload operation (import), as a file
    progress: Progress | None = None
    in_service: bool = False  # run by ``memoryctl serve`` (which adds its own health component)
    extra: dict[str, Any] = field(default_factory=dict)


Runner = Callable[["MemoryClient", Call], "Reply"]


def operation(name: str) -> Operation:
    op = OPERATIONS.get(name)
    if op is None:
        shared = ", ".join(n for n, o in OPERATIONS.items() if not o.local)
        raise InputError(f"no operation {name!r}", hint=f"one of {shared}")
    return op


def runner(op: Operation) -> Callable[..., Any]:
    module, _, function = op.run.partition(":")
    found: Callable[..., Any] = getattr(importlib.import_module(module), function)
    return found


def run(
    client: MemoryClient,
    name: str,
    params: Mapping[str, Any],
    *,
    upload: Path | None = None,
    progress: Progress | None = None,
    in_service: bool = False,
) -> Reply:
    """Validate and run one operation in this process (the service calls this too)."""
    from memoryctl.maintenance.runs import caller

    op = operation(name)
    if op.local:
        raise InputError(f"{name} runs in the calling process only", hint=f"run `memoryctl {name}`")
    if client.settings.profile not in op.profiles:
        raise UsageError(
            f"`memoryctl {name}` runs on the {' or '.join(op.profiles)} profile, not {client.settings.profile}",
            hint=f"`memoryctl {name} --help` says what it needs",
        )
    call = Call(op.validate(params), upload=upload, progress=progress, in_service=in_service)
    with caller(call.params.get("trigger"), call.params.get("actor")):
        reply: Reply = runner(op)(client, call)
    reply.data = dump(reply.data)  # the declared reply type as its --json document
    return reply
