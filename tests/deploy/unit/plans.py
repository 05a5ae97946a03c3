"""Operation plans without nodes: run a deploy function against pyinfra fact fixtures.

``plan(deploy_fn, "node1", facts)`` builds the local inventory (or ``inventory=<yaml>``) in memory, answers every
``host.get_fact`` from ``facts`` (keyed by fact class name; a callable gets the fact's arguments;
anything missing gets the fact's own default, as on an empty node), runs the deploy function the
way ``pyinfra`` does when it prepares operations, and returns each operation's commands and the
files it would upload. Conditions (``_if``) are not evaluated: they depend on execution.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyinfra
import yaml
from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.host import Host
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state

from deploy.components import with_settings
from deploy.settings import REPO, load_inventory

# Facts of a freshly installed Debian node where a fact's own default would not do.
DEBIAN_13 = {
    "name": "Debian",
    "major": 13,
    "minor": None,
    "release_meta": {"ID": "debian", "VERSION_CODENAME": "trixie", "PRETTY_NAME": "Debian GNU/Linux 13 (trixie)"},
}
FRESH_DEBIAN: dict[str, Any] = {
    "Os": "Linux",
    "LinuxName": "Debian",
    "LinuxDistribution": DEBIAN_13,
    "Users": {"root": {"home": "/root", "group": "root", "groups": [], "shell": "/bin/bash"}},
    "Groups": ["root"],
    "Which": lambda command, **_: f"/usr/bin/{command}",
    "FilesystemSize": 100 * 1024**3,  # a 100 GiB disk
}


@dataclass
class PlannedOp:
    name: str
    commands: list[str]
    uploads: dict[str, str] = field(default_factory=dict)
    conditional: bool = False
    serial: bool = False  # run host by host (``_serial``), not on every host at once


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
EXAMPLE = REPO / "inventory" / "hetzner.example.yaml"
# What the example's operator has put on the gpu node by hand before deploying (docs/nightly.md):
# the embedding model's weights the embedding slots serve and the night trains on.
BASE_EMBEDDING = str(load_inventory(EXAMPLE).components.nightly.embedding_base_model)
OPERATOR_DOWNLOADS = {"Directory": lambda path, **_: {"mode": 755} if path == BASE_EMBEDDING else None}
# What the example's operator fills in for alerts (docs/monitoring.md): the addresses in place of the
# example's REPLACE-WITH- placeholders, and the secrets the example names in the secret store.
OPERATOR_EMAIL = {
    "to": "oncall@example.org",
    "from": "alertmanager@example.org",
    "smarthost": "smtp.example.org:587",
    "auth_username": "alertmanager@example.org",
}
OPERATOR_SECRETS = {
    "alertmanager/smtp_password": "smtp-password-from-the-provider",
    "alertmanager/heartbeat_url": "https://hc-ping.example.org/0e5c9b1e-heartbeat",
}


def fill_receiver(doc: dict[str, Any], secrets_dir: Path) -> None:
    """The example's receiver as an operator completes it: addresses filled in, secrets in the store."""
    doc["components"]["monitoring"]["receiver"]["email_configs"][0].update(OPERATOR_EMAIL)
    for name, value in OPERATOR_SECRETS.items():
        (secrets_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (secrets_dir / name).write_text(value + "\n")


# The Hetzner example as its operator completes it (test_hetzner.py plans it in the test process,
# test_controller_venv.py in a controller venv): nodes, the operator's key, the release pages' sha256.
NODES = ("mem-db", "mem-index", "mem-gpu")
OPERATOR_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVvcGVyYXRvcmtleWZvcnRlc3Rpbmdvbmx5MTIzNDU2 operator@laptop"
RELEASE_SHA256 = "5" * 64


def example_inventory(directory: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """The example as ``directory/hetzner.yaml``, edited by ``edit``."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    if edit is not None:
        edit(doc)
    path = directory / "hetzner.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def fill_sha256(doc: dict[str, Any]) -> None:
    """The sha256s an operator copies from the release pages, and the alert receiver filled in
    (its secrets written to the secret store, ``$MEMORYCTL_SECRETS_DIR`` of the unit tests)."""
    for name in ("qdrant", "neo4j"):
        doc["components"][name]["source"]["sha256"] = RELEASE_SHA256
    fill_receiver(doc, Path(os.environ["MEMORYCTL_SECRETS_DIR"]))


def _state(components: dict[str, Any] | None, inventory: Path) -> State:
    cluster = load_inventory(inventory)
    hosts, data = cluster.pyinfra_all()
    data = copy.deepcopy(data)
    # The test's settings over the inventory's, per component key by key, parsed again as a load does.
    data["components"] = with_settings(cluster.components, components or {}, f"{inventory} + the test's components")
    groups = {role: (cluster.group(role), {}) for role in ("db", "index", "gpu")}
    return State(Inventory((hosts, data), **groups), Config())


@contextmanager
def _facts(facts: dict[str, Any] | None) -> Iterator[None]:
    """Every ``host.get_fact`` answered from ``facts`` (on top of a fresh Debian node)."""
    known = {**FRESH_DEBIAN, **(facts or {})}
    # A node whose PostgreSQL is installed answers queries unless a test says otherwise, and its
    # role names are those of PostgresRoles (the deploy's tolerant facts read the same server).
    if "postgres" in known["Users"]:
        known.setdefault("PostgresAnswers", True)
        if "PostgresRoles" in known:
            known.setdefault("PostgresRoleNames", set(known["PostgresRoles"]))

    def get_fact(self: Host, cls: type, *args: Any, **kwargs: Any) -> Any:
        if cls.__name__ not in known:
            return getattr(cls(), "default", lambda: None)()
        value = known[cls.__name__]
        return value(*args, **kwargs) if callable(value) else value

    original = Host.get_fact
    Host.get_fact = get_fact  # type: ignore[method-assign]
    try:
        yield
    finally:
        Host.get_fact = original  # type: ignore[method-assign]


def plan(
    deploy_fn: Callable[[], None],
    node: str,
    facts: dict[str, Any] | None = None,
    components: dict[str, Any] | None = None,
    inventory: Path = LOCAL,
) -> Plan:
    state = _state(components, inventory)
    host = state.inventory.get_host(node)
    with _facts(facts), ctx_state.use(state), ctx_host.use(host):
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
            meta = state.get_op_meta(op_hash)
            (name,) = meta.names
            conditional = bool(op_data.global_arguments.get("_if"))
            serial = bool(meta.global_arguments.get("_serial") or op_data.global_arguments.get("_serial"))
            ops.append(PlannedOp(name, commands, uploads, conditional, serial))
    return Plan(ops)


def cluster_order(
    deploy_fn: Callable[[], None],
    facts: dict[str, Any] | None = None,
    components: dict[str, Any] | None = None,
    inventory: Path = LOCAL,
) -> list[tuple[str, str]]:
    """``(node, operation name)`` in the order the ``pyinfra`` command runs them on every node at once.

    The command line orders operations by call site (one chain per host, merged into one DAG),
    which API use does not: it numbers them per host. Planned here as the command line does, so a
    test can say which step of one node runs after which step of another.
    """
    state = _state(components, inventory)
    state.set_stage(StateStage.Prepare)
    cli, pyinfra.is_cli = pyinfra.is_cli, True
    try:
        with _facts(facts), ctx_state.use(state):
            for host in state.inventory:
                with ctx_host.use(host):
                    deploy_fn()
            order = state.get_op_order()
    finally:
        pyinfra.is_cli = cli
    return [
        (host.name, name)
        for op_hash in order
        for name in state.get_op_meta(op_hash).names
        for host in state.inventory
        if op_hash in host.op_hash_order
    ]
