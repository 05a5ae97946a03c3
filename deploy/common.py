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
from pyinfra.operations import apt, files

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


def component(name: str) -> dict[str, Any]:
    settings: dict[str, Any] = host.data.components.get(name) or {}
    return settings


def has_role(role: str) -> bool:
    return role in host.data.roles


def apt_repository(name: str, key_url: str, line: str) -> None:
    """A third-party apt repository (its key, ``sources.list.d/<name>.list``), lists refreshed
    only when the repository was just added, so a re-run stays a no-op."""
    apt.packages(name="Tools for apt keys", packages=["ca-certificates", "curl", "gnupg"], no_recommends=True)
    apt.key(name=f"{name} apt key", src=key_url)
    repo = apt.repo(name=f"{name} apt repository", src=line, filename=name)
    apt.update(name=f"Refresh apt lists ({name} added)", _if=repo.did_change)
