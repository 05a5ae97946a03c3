"""Which embedding model is meant: parsing ``--to-model`` specs and following the active model.

Decision (documented in the README's operations section): after ``memoryctl migrate`` swaps the
alias, every memoryctl process must embed with the *new* model, or its queries are refused (the
engine never searches a collection with another model's vectors) and its writes would be refused
by delivery. Editing the config on every node at the exact moment of the swap is impossible, so
``migrate`` records the embedder spec of every model it activates in ``model_versions.manifest``
(no secrets), and ``Stack`` builds its embedder from the *active* recorded spec when there is one.
The config's ``[embedder]`` section is the bootstrap (before the first migration) and the source of
secrets (``api_key``); ``health`` says when it disagrees with the active model so an operator can
update it at leisure. ``migrate --rollback`` flips the recorded active model back, and with it the
embedder of every process started afterwards.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, get_args

from psycopg_pool import ConnectionPool
from pydantic import ValidationError

from memoryctl.config import EmbedderSettings
from memoryctl.errors import MemoryctlError, UsageError

log = logging.getLogger(__name__)

# Fields that define the vectors (kept in PostgreSQL); secrets are never recorded.
SPEC_FIELDS = ("kind", "model", "url", "dim", "batch_size", "timeout_s", "adapter_path")
KINDS: tuple[str, ...] = get_args(EmbedderSettings.model_fields["kind"].annotation)


def parse_model_spec(text: str, base: EmbedderSettings | None = None) -> EmbedderSettings:
    """``--to-model`` value -> ``EmbedderSettings``.

    Accepted forms: ``hash`` / ``onnx`` / ``local`` / ``minilm`` (a kind), ``http:BAAI/bge-m3`` (kind:model),
    or ``kind=hash,dim=256,model=my-id`` (any of kind, model, url, dim, batch_size, timeout_s,
    adapter_path). The API key is taken from the configured embedder (``base``), never from argv.
    """
    text = text.strip()
    if not text:
        raise UsageError("--to-model is empty", hint="e.g. --to-model kind=hash,dim=256 or --to-model http:BAAI/bge-m3")
    data: dict[str, Any] = {}
    if "=" in text:
        for part in text.split(","):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in SPEC_FIELDS:
                raise UsageError(
                    f"bad --to-model part {part!r}",
                    hint=f"use key=value pairs with keys from {', '.join(SPEC_FIELDS)}",
                )
            data[key] = value.strip()
    else:
        kind, _, model = text.partition(":")
        data["kind"] = kind.strip()
        if model:
            data["model"] = model.strip()
    if data.get("kind") not in KINDS:
        raise UsageError(f"unknown embedder kind {data.get('kind')!r} in --to-model", hint=f"one of {', '.join(KINDS)}")
    if base is not None and base.api_key is not None and data["kind"] == base.kind:
        data["api_key"] = base.api_key
    try:
        return EmbedderSettings(**data)
    except ValidationError as exc:
        msg = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise UsageError(f"invalid --to-model {text!r}: {msg}") from None


def spec_of(settings: EmbedderSettings) -> dict[str, Any]:
    """The recordable (secret-free) part of an embedder configuration."""
    data = settings.model_dump(mode="json")
    return {k: data[k] for k in SPEC_FIELDS if data.get(k) is not None}


def settings_from_spec(spec: dict[str, Any], configured: EmbedderSettings) -> EmbedderSettings:
    data = {k: v for k, v in spec.items() if k in SPEC_FIELDS}
    if configured.api_key is not None and data.get("kind") == configured.kind:
        data["api_key"] = configured.api_key
    return EmbedderSettings(**data)


def effective_embedder_settings(
    pool: ConnectionPool[Any] | Callable[[], ConnectionPool[Any]], configured: EmbedderSettings
) -> EmbedderSettings:
    """The recorded spec of the active embedding model when ``migrate`` recorded one, else the config.

    Never raises: if PostgreSQL cannot answer (or predates the registry), the config is used and
    the vector store's own model check still refuses any mix-up. ``pool`` may be a callable so that
    opening PostgreSQL (which may fail) happens inside that guarantee.
    """
    from memoryctl.maintenance.pgstate import OpsState

    try:
        row = OpsState(pool() if callable(pool) else pool).active_embedding()
    except MemoryctlError as exc:
        log.debug("no recorded active embedder (%s); using the config", exc.message)
        return configured
    spec = (row or {}).get("manifest", {}).get("embedder") if row else None
    if not spec:
        return configured
    try:
        return settings_from_spec(spec, configured)
    except ValidationError:
        log.warning("recorded embedder spec for %s is invalid; using the config", row["model_id"] if row else "?")
        return configured
