"""Operation plans without nodes: run a deploy function against pyinfra fact fixtures.

``plan(deploy_fn, "node1", facts)`` builds the local inventory (or ``inventory=<yaml>``) in memory, answers every
``host.get_fact`` from ``facts`` (keyed by fact class name; a callable gets the fact's arguments;
anything missing gets the fact's own default, as on an empty node), runs the deploy function the
way ``pyinfra`` does when it prepares operations, and returns each operation's commands and the
files it would upload. Conditions (``_if``) are not evaluated: they depend on execution.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.host import Host
from pyinfra.context import ctx_host, ctx_state

from deploy.settings import REPO, load_inventory

# Facts of a freshly installed Debian node where a fact's own default would not do.
FRESH_DEBIAN: dict[str, Any] = {
    "Os": "Linux",
    "LinuxName": "Debian",
    "Users": {"root": {"home": "/root", "group": "root", "groups": [], "shell": "/bin/bash"}},
    "Groups": ["root"],
    "Which": lambda command, **_: f"/usr/bin/{command}",
}


@dataclass
class PlannedOp:
    name: str
    commands: list[str]
    uploads: dict[str, str] = field(default_factory=dict)
    conditional: bool = False


@dataclass
class Plan:
    ops: list[PlannedOp]

    def op(self, fragment: str) -> PlannedOp:
        matches = [op for op in self.ops if op.name == fragment] or [op for op in self.ops if fragment in op.name]
        assert len(matches) == 1, f"{fragment!r} matches {[op.name for op in matches]} in {self.names()}"
        return matches[0]

    def names(self) -> list[str]:
        return [op.name for op in self.ops]

    def upload(self, dest: str) -> str:
        for op in self.ops:
            if dest in op.uploads:
                return op.uploads[dest]
        raise AssertionError(f"no upload to {dest}")

    def changing(self) -> list[str]:
        """Operations that would run commands unconditionally."""
        return [op.name for op in self.ops if op.commands and not op.conditional]


LOCAL = REPO / "inventory" / "local.yaml"


def plan(
    deploy_fn: Callable[[], None],
    node: str,
    facts: dict[str, Any] | None = None,
    components: dict[str, Any] | None = None,
    inventory: Path = LOCAL,
) -> Plan:
    facts = {**FRESH_DEBIAN, **(facts or {})}
    cluster = load_inventory(inventory)
    hosts, data = cluster.pyinfra_all()
    data = copy.deepcopy(data)
    for name, settings in (components or {}).items():
        data["components"][name] = {**data["components"].get(name, {}), **settings}
    groups = {role: (cluster.group(role), {}) for role in ("db", "index", "gpu")}
    pyinfra_inventory = Inventory((hosts, data), **groups)
    state = State(pyinfra_inventory, Config())
    host = pyinfra_inventory.get_host(node)

    def get_fact(self: Host, cls: type, *args: Any, **kwargs: Any) -> Any:
        if cls.__name__ not in facts:
            return getattr(cls(), "default", lambda: None)()
        value = facts[cls.__name__]
        return value(*args, **kwargs) if callable(value) else value

    original = Host.get_fact
    Host.get_fact = get_fact  # type: ignore[method-assign]
    try:
        with ctx_state.use(state), ctx_host.use(host):
            deploy_fn()
            ops = []
            for op_hash in state.get_op_order():
                op_data = state.get_op_data_for_host(host, op_hash)
                commands, uploads = [], {}
                for command in op_data.command_generator():
                    if isinstance(command, FileUploadCommand):
                        src = command.src
                        uploads[command.dest] = src.getvalue() if hasattr(src, "getvalue") else f"<file {src}>"
                        commands.append(f"upload {command.dest}")
                    else:
                        commands.append(str(command))
                (name,) = state.get_op_meta(op_hash).names
                conditional = bool(op_data.global_arguments.get("_if"))
                ops.append(PlannedOp(name, commands, uploads, conditional))
    finally:
        Host.get_fact = original  # type: ignore[method-assign]
    return Plan(ops)
