"""What every deploy module shares: templates, the cluster inventory and its secrets.

Runs on the controller while pyinfra generates operations. Templates render with the same Jinja2
settings pyinfra uses (StrictUndefined, trailing newline kept) and ``templates/`` as the loader
root, so ``render()`` in the unit tests produces byte for byte what a node receives.
"""

from __future__ import annotations

import hashlib
from functools import cache
from io import StringIO
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from pyinfra import host
from pyinfra.api import StringCommand
from pyinfra.facts.systemd import SystemdStatus
from pyinfra.operations import files, server, systemd

from deploy.components import Components, parse
from deploy.settings import REPO, ClusterInventory, Secrets, load_inventory

TEMPLATES = REPO / "templates"


def jinja_env_kwargs() -> dict[str, Any]:
    return {"loader": FileSystemLoader(str(TEMPLATES))}


def render(src: str, **context: Any) -> str:
    """Render ``templates/<src>`` outside pyinfra (tests, validation)."""
    env = Environment(undefined=StrictUndefined, keep_trailing_newline=True, **jinja_env_kwargs())
    return env.from_string((TEMPLATES / src).read_text()).render(**context)


def template(src: str, dest: str, **kwargs: Any) -> Any:
    """``files.template`` from ``templates/<src>``; keyword arguments are template variables
    except pyinfra's own (``user``, ``group``, ``mode``, ``_sudo`` ...)."""
    return files.template(
        name=f"Render {dest}",
        src=str(TEMPLATES / src),
        dest=dest,
        jinja_env_kwargs=jinja_env_kwargs(),
        **kwargs,
    )


@cache
def _inventory(path: str) -> ClusterInventory:
    return load_inventory(path)


def inventory() -> ClusterInventory:
    return _inventory(host.data.inventory_path)


@cache
def _secrets(path: str) -> Secrets:
    return Secrets(path)


def secrets() -> Secrets:
    return _secrets(host.data.secrets_dir)


def service_config(src: str, dest: str, group: str, **context: Any) -> Any:
    """A rendered config the service running as ``group`` reads and nobody else may (0640 root:group):
    it holds the service's passwords and API keys, and only root writes it."""
    return template(src, dest, user="root", group=group, mode="640", **context)


def sudoers(src: str, dest: str, **context: Any) -> Any:
    """A file in /etc/sudoers.d (0440), checked with ``visudo -c`` whenever it changed."""
    rendered = template(src, dest, user="root", group="root", mode="440", **context)
    server.shell(name=f"Check {dest}", commands=[f"visudo -cqf {dest}"], _if=rendered.did_change)
    return rendered


def components() -> Components:
    """This host's component settings, typed (deploy/components.py): the inventory's, parsed once when
    it was loaded (deploy/settings.py puts them into every host's data). Host data given as a plain
    mapping (a pyinfra data file, ``--data``) is validated here the same way."""
    data = host.data.components
    return data if isinstance(data, Components) else parse(data, f"{host.name}: host data components")


def has_role(role: str) -> bool:
    return role in host.data.roles


def after_mesh(service: str, label: str) -> Any:
    """A drop-in ordering ``service`` after the WireGuard interface: it binds the node's mesh address,
    which exists only once ``wg-quick@<iface>`` is up (at boot too). Returns the template operation
    (callers reload systemd when it changed)."""
    return template(
        "wireguard/after-mesh.conf.j2",
        f"/etc/systemd/system/{service}.service.d/memoryctl.conf",
        service=label,
        interface=host.data.mesh.get("interface", "wg0"),
    )


def service_account(
    name: str, home: str, directories: dict[str, str] | None = None, shell: str = "/usr/sbin/nologin"
) -> None:
    """A system user and group ``name`` (no login shell by default, ``home`` not created by useradd)
    and its directories, owned by it (``{path: mode}``; default: ``home`` itself at 750)."""
    server.group(name=f"Group {name}", group=name, system=True)
    server.user(
        name=f"User {name}",
        user=name,
        group=name,
        system=True,
        home=home,
        shell=shell,
        create_home=False,
    )
    for path, mode in (directories if directories is not None else {home: "750"}).items():
        files.directory(name=f"Directory {path}", path=path, user=name, group=name, mode=mode)


SECRET_DIR = "/run/memoryctl-deploy"


def with_secret_file(name: str, content: str, command: str, user: str) -> Any:
    """Run ``command`` as ``user`` with a secret it reads from a file (``{file}`` in the command).

    The file is uploaded (SFTP: no command line carries it), 0600 and owned by ``user``, in a
    directory under /run (gone at the next boot), and removed by the same shell as the command,
    whatever its exit status. sudo logs every command line it runs into the auth log / journal, so
    a secret must never be an argument; the secrets-in-logs deploy test greps for every one.
    """
    path = f"{SECRET_DIR}/{name.split()[0].lower()}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    files.directory(name="Deploy secrets directory (tmpfs)", path=SECRET_DIR, mode="755")
    files.put(
        name=f"Secret file {path} (0600, removed after use)",
        src=StringIO(content),
        dest=path,
        user=user,
        group=user,
        mode="600",
    )
    return server.shell(
        name=name,
        commands=[f"{command.format(file=path)}; rc=$?; rm -f {path}; exit $rc"],
        _sudo=True,
        _sudo_user=user,
    )


# A service start is tried three times, 5 s apart: systemd can fail to set up a unit's cgroup for a
# moment (status 219/CGROUP, seen once at the first nftables start on a local node under load).
# A start that keeps failing still fails the run, after 10 s.
START_RETRIES: dict[str, Any] = {"_retries": 2, "_retry_delay": 5}


def barrier(name: str) -> None:
    """A step that waits for every host to finish what it was given before this point.

    pyinfra orders operations as one chain per host, merged into one DAG keyed by the call site:
    nothing orders one host's step after another host's, so a repository node could create its
    pgBackRest stanza before the database node had started the server it connects to. An operation
    every host calls from the same place is one node of that DAG, after each host's earlier steps:
    call this unconditionally (every host, same call path), between a step and what another host
    needs of it. It runs no command and never counts as a change.
    """
    server.shell(name=f"Wait for every node: {name}", commands=[])


def keep_running(service: str, changes: list[Any], *, package_starts_it: bool = False) -> None:
    """``service`` running and enabled, restarted when one of ``changes`` (operations) changed.

    A service that was not running when this run began is started by the first operation, after
    its files are in place: restarting it as well would only start it twice (a JVM start is half a
    minute on a small node). Unless a package install may have started it with its own defaults
    before our files were written (``package_starts_it``): then a change always restarts, first,
    after forgetting the failed starts of those defaults: Debian's postgres_exporter exits at once
    without a data source, so systemd had hit its start limit and refused any start before
    ``reset-failed``.
    """
    changed = lambda: any(op.did_change() for op in changes if op is not None)  # noqa: E731
    if package_starts_it:
        server.shell(
            name=f"Restart {service} (its files changed)",
            commands=[f"systemctl reset-failed {service}.service", f"systemctl restart {service}.service"],
            _if=changed,
            # A node's systemd once answered a restart with "Failed to spawn executor: No such file
            # or directory" (result 'resources', node1's node_exporter, 2026-12-02) and started it
            # a moment later by itself: a restart is safe to repeat.
            **START_RETRIES,
        )
    running = host.get_fact(SystemdStatus).get(f"{service}.service", False)
    systemd.service(name=f"{service} running and enabled", service=service, running=True, enabled=True, **START_RETRIES)
    if running and not package_starts_it:
        systemd.service(
            name=f"Restart {service} (its files changed)", service=service, restarted=True, _if=changed, **START_RETRIES
        )


def exits_zero(command: str) -> bool:
    """Whether ``command`` exits 0 on this host when the step asking runs (an ``_if``: decided at
    execution time, so a step with nothing to do changes nothing)."""
    ok, _ = host.run_shell_command(StringCommand(command))
    return bool(ok)
