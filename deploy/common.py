"""What every deploy module shares: templates, the cluster inventory and its secrets.

Runs on the controller while pyinfra generates operations. Templates render with the same Jinja2
settings pyinfra uses (StrictUndefined, trailing newline kept) and ``templates/`` as the loader
root, so ``render()`` in the unit tests produces byte for byte what a node receives.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from pyinfra import host
from pyinfra.facts.systemd import SystemdStatus
from pyinfra.operations import apt, files, gpg, server, systemd

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


def sudoers(src: str, dest: str, **context: Any) -> Any:
    """A file in /etc/sudoers.d (0440), checked with ``visudo -c`` whenever it changed."""
    rendered = template(src, dest, user="root", group="root", mode="440", **context)
    server.shell(name=f"Check {dest}", commands=[f"visudo -cqf {dest}"], _if=rendered.did_change)
    return rendered


def component(name: str) -> dict[str, Any]:
    settings: dict[str, Any] = host.data.components.get(name) or {}
    return settings


def has_role(role: str) -> bool:
    return role in host.data.roles


def apt_repository(name: str, key_url: str, uri: str, suite: str, components: str = "main") -> Any:
    """A third-party apt repository, trusted for itself only: its key dearmored into
    ``/etc/apt/keyrings/<name>.gpg`` (pyinfra's gpg operation, never ``apt-key``, whose keys every
    repository could sign with) and the source line restricted to it with ``signed-by``.
    Lists are refreshed only when the repository was just added, so a re-run stays a no-op.
    Returns the repository operation (``did_change`` = it was just added).
    """
    keyring = f"/etc/apt/keyrings/{name}.gpg"
    apt.packages(name="Tools for apt keys", packages=["ca-certificates", "curl", "gnupg"], no_recommends=True)
    files.directory(name="apt keyrings directory", path="/etc/apt/keyrings", mode="755")
    gpg.key(name=f"{name} apt key (dearmored keyring)", src=key_url, dest=keyring, dearmor=True, mode="0644")
    repo = apt.repo(
        name=f"{name} apt repository", src=f"deb [signed-by={keyring}] {uri} {suite} {components}", filename=name
    )
    apt.update(name=f"Refresh apt lists ({name} added)", _if=repo.did_change)
    return repo


def keep_running(service: str, changes: list[Any], *, package_starts_it: bool = False) -> None:
    """``service`` running and enabled, restarted when one of ``changes`` (operations) changed.

    A service that was not running when this run began is started by the first operation, after
    its files are in place: restarting it as well would only start it twice (a JVM start is half a
    minute on a small node). Unless a package install may have started it with its own defaults
    before our files were written (``package_starts_it``): then a change always restarts.
    """
    running = host.get_fact(SystemdStatus).get(f"{service}.service", False)
    systemd.service(name=f"{service} running and enabled", service=service, running=True, enabled=True)
    if running or package_starts_it:
        systemd.service(
            name=f"Restart {service} (its files changed)",
            service=service,
            restarted=True,
            _if=lambda: any(op.did_change() for op in changes if op is not None),
        )
