"""The configuration's raw layers -- TOML file, ``MEMORYCTL_*`` environment, explicit overrides --
found, read and merged as plain dicts, with the standard library only.

Why apart from ``memoryctl.config``: the console script's fast path (``memoryctl.cli.fast``) must
find the running service and the default agent without importing pydantic (~130 ms of every
call), and must know that it reads exactly what the service validated. Both sides therefore merge
the layers here, and the service compares the ``digest`` of its layers with the client's: equal
layers validate equally (the service did, when it started).
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memoryctl.errors import ConfigError

APP = "memoryctl"
SYSTEM_CONFIG = Path("/etc/memoryctl/memoryctl.toml")
ENV_PREFIX = "MEMORYCTL_"

#: The settings' top-level names a ``MEMORYCTL_<NAME>`` variable may set (tests pin them to
#: ``Settings``); other ``MEMORYCTL_*`` variables (``MEMORYCTL_CONFIG``, the harness's) are not settings.
SECTIONS = frozenset(
    {
        "profile",
        "data_dir",
        "default_agent",
        "delete_grace",
        "postgres",
        "qdrant",
        "neo4j",
        "embedder",
        "extractor",
        "graph",
        "vllm",
        "query",
        "nightly",
        "backup",
        "serve",
        "alerting",
        "write",
    }
)


def default_config_path() -> Path | None:
    env = os.environ.get("MEMORYCTL_CONFIG")
    if env:
        return Path(env)
    import platformdirs

    user = Path(platformdirs.user_config_dir(APP)) / "memoryctl.toml"
    for candidate in (user, SYSTEM_CONFIG):
        if candidate.is_file():
            return candidate
    return None


def default_data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir(APP))


def environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """``MEMORYCTL_A__B=v`` as ``{"a": {"b": v}}``, for the settings' own fields only."""
    out: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.upper().startswith(ENV_PREFIX):
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        if path[0] not in SECTIONS or not all(path):
            continue
        node = out
        for key in path[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            node[path[-1]] = _env_value(value)
    return out


def _env_value(value: str) -> Any:
    if value.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            pass  # validation names the field and says what is wrong
    return value


def merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, table by table (a flag for ``postgres.dsn`` keeps the file's password)."""
    merged = dict(base)
    for key, value in top.items():
        if value is None:
            continue
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def layers(path: Path | None, overrides: Mapping[str, Any]) -> tuple[Path | None, dict[str, Any]]:
    """The file (explicit path, or the default search) under the environment under ``overrides``:
    the file used and the merged, not yet validated, data."""
    explicit = path is not None or "MEMORYCTL_CONFIG" in os.environ
    path = path or default_config_path()
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            if explicit:
                raise ConfigError(
                    f"config file {path} does not exist", hint="check --config / MEMORYCTL_CONFIG"
                ) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    return path, merge(merge(data, environment(os.environ)), overrides)


def digest(data: Mapping[str, Any]) -> str:
    """A fingerprint of merged layers: equal for equal configurations, whatever their order."""
    canonical = json.dumps(data, sort_keys=True, default=str, ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()
