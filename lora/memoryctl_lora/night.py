"""The training side of ``memoryctl nightly`` and ``memoryctl adapters``: what drives training,
merging and serving adapters, written against what memoryctl offers (its maintenance stack,
settings, ``migrate``, the GPU pause, ``memoryctl.vllm``).

memoryctl never imports this distribution: it declares what it needs as a protocol
(``memoryctl.maintenance.training.Training``) and finds :class:`LoraTraining` through the entry
point this distribution declares (lora/pyproject.toml, group ``memoryctl.training``). So the two
depend one way — this package on memoryctl — and the core install stays torch-free. memoryctl's
nightly keeps the run itself (its lock, the run record, whether a step applies, re-embed,
reconcile, which merged versions are still in use); each training step here runs inside it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memoryctl.config import EmbedderSettings, Settings
from memoryctl.diskspace import disk_full, tree_bytes
from memoryctl.errors import MemoryctlError
from memoryctl.maintenance.adapters import no_embedding_registry, ready_within, registry_root, vllm_client
from memoryctl.maintenance.embedding_version import serve_on_idle_slot, served_name, versions_dir
from memoryctl.maintenance.gpu_pause import gpu_freed
from memoryctl.maintenance.model_migration import run_model_migration
from memoryctl.maintenance.models import effective_embedder_settings
from memoryctl.maintenance.needs import MaintenanceStack
from memoryctl.maintenance.pgstate import OpsState
from memoryctl.maintenance.training import AdapterKind, Trained, Training, Window

from .config import LoraTrainingConfig
from .cycle import embedding_cycle, generation_cycle, promote_generation, rollback_generation, serve_active_generation
from .datasets import pairs_from_turns
from .manifest import DataWindow
from .merge import MERGED_MANIFEST, merge_embedding_adapter
from .registry import AdapterRegistry, AdapterVersion
from .serving import AdapterServing


def open_registry(settings: Settings) -> AdapterRegistry:
    """The adapter registry of this node (``[nightly] adapters_dir``, else ``<data_dir>/adapters``)."""
    return AdapterRegistry(registry_root(settings))


def server_path(settings: Settings) -> Callable[[AdapterVersion], str]:
    """Registry path → the path vLLM sees: ``[nightly] adapters_dir_on_server`` when the registry is
    synced to another host, else the registry path itself."""
    on_server = settings.nightly.adapters_dir_on_server
    root = registry_root(settings)

    def path(version: AdapterVersion) -> str:
        if not on_server:
            return str(version.path)
        return str(Path(on_server) / Path(version.path).relative_to(root))

    return path


Pause = Callable[[], AbstractContextManager[dict[str, Any]]]


def gpu_freed_for(settings: Settings, registry: AdapterRegistry) -> Pause:
    """What each training step runs inside: ``[nightly] pause_units`` stopped and started again
    (memoryctl/maintenance/gpu_pause.py), the active generation adapter loaded again after the restart.
    Both steps: on the GEX44 the embedding training and gate need the room too (docs/nightly.md)."""

    def restore(client: Any) -> dict[str, Any]:
        return serve_active_generation(registry, AdapterServing(client), path_on_server=server_path(settings))

    return lambda: gpu_freed(settings, lambda: vllm_client(settings), restore)


def embedding_version_of(registry: AdapterRegistry, model_id: str | None) -> AdapterVersion | None:
    """The registered embedding version whose vectors ``model_id`` (an aliased collection's model)
    holds: ``http:<served name>`` for a merged version on an embedding slot, ``...+lora:<checksum>``
    for MiniLM with the adapter applied; None when no registered adapter is in it (the base model)."""
    if not model_id:
        return None
    for v in reversed(registry.list("embedding")):
        if model_id == f"http:{served_name(v.model_id)}" or model_id.endswith(f"+lora:{v.checksum[:12]}"):
            return v
    return None


def follow_active_embedding(stack: MaintenanceStack, *, reason: str) -> dict[str, Any]:
    """Make the registry's active embedding adapter the one in the collection now aliased (see
    ``memoryctl.maintenance.adapters.follow_active_embedding``). Never raises: ``error`` says it."""
    missing = no_embedding_registry(stack.settings)
    if missing:
        return missing
    try:
        registry = open_registry(stack.settings)
        model = stack.require_vectors().active_model()
        version = embedding_version_of(registry, model.model_id if model else None)
        changed = registry.restore("embedding", version.version if version else None, reason=reason)
    except MemoryctlError as exc:
        return {"followed": False, "error": exc.message}
    return {
        "followed": True,
        "model": model.model_id if model else None,
        "active": version.version if version else None,
        "changed": changed,
    }


def serve_merged(stack: MaintenanceStack, version: AdapterVersion) -> tuple[EmbedderSettings, dict[str, Any]]:
    """The registered adapter merged into a model version on the idle embedding slot
    (memoryctl/maintenance/embedding_version.py); the embedder ``migrate`` moves to."""
    settings = stack.settings
    out_dir = versions_dir(settings) / served_name(version.model_id)
    if not out_dir.exists():  # a version is written once (whole, or not at all); a retried night reuses it
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        base = settings.nightly.embedding_base_model
        try:
            merge_embedding_adapter(version.path, out_dir, base_model_dir=base)
        except OSError as exc:  # the merged copy is about the base model's size
            full = disk_full(exc, out_dir, tree_bytes(Path(base)) if base and Path(base).is_dir() else None)
            if full is None:
                raise
            raise full from exc
    active = effective_embedder_settings(stack.pool, settings.embedder)
    return serve_on_idle_slot(settings, out_dir, active.url)


def embedding_step(stack: MaintenanceStack, window: Window, workdir: Path) -> Trained:
    """Train on the window's useful recalls, gate against the served adapter, register; then serve
    it (merged onto the idle slot for an embedder over HTTP, MiniLM with the adapter applied),
    ``migrate`` the vectors to it and set it active. Until ``migrate`` swaps, what is served stays."""
    settings, ns = stack.settings, stack.settings.nightly
    served = stack.embedder.info.model_id.startswith("http:")
    registry = open_registry(settings)
    # The gate's baseline is the adapter in the vectors served now, even when a rollback ran
    # where this registry is not (`migrate --rollback` on another node).
    followed = follow_active_embedding(stack, reason="nightly: the registry followed the served model")
    if followed.get("error"):
        return Trained("failed", {"error": f"the adapter registry: {followed['error']}"})
    extra = {"registry_followed": followed["changed"]} if followed.get("changed") else {}

    rows = stack.events.useful_pairs(window.since)
    base: dict[str, Any] = {}
    if served:  # the weights the servers serve, named as the configured (bootstrap) model
        base = {"base_model_path": ns.embedding_base_model, "base_model_id": settings.embedder.model}
    out = embedding_cycle(
        rows,
        registry=registry,
        workdir=workdir,
        config=LoraTrainingConfig.for_embedding(**{**base, **ns.embedding_lora}),
        window=DataWindow(since=window.since, until=window.until),
        around_training=gpu_freed_for(settings, registry),
    )
    record = {**extra, **out.to_record()}
    if out.status != "registered" or out.version is None:
        return Trained(out.status, record)
    if served:
        target, record["serve"] = serve_merged(stack, out.version)
    else:
        target = EmbedderSettings(
            kind="minilm", adapter_path=str(out.version.path), batch_size=settings.embedder.batch_size
        )
    migration = run_model_migration(stack, "migrate", target=target)
    record["migrate"] = {"status": migration.status, "target": migration.target_model, "verify": migration.verify}
    if migration.status != "swapped":
        return Trained("rejected", {**record, "reason": f"migrate: {migration.status}"})
    registry.set_active("embedding", out.version.version)
    return Trained("ok", record, swapped=True)


def generation_step(stack: MaintenanceStack, window: Window, workdir: Path) -> Trained:
    """Train on the window's dialogue turns, gate on held-out loss, register; hot-swap it into vLLM
    (load, verify, unload the old one) and set it active when ``[vllm] url`` is set."""
    settings, ns = stack.settings, stack.settings.nightly
    registry = open_registry(settings)
    rows = pairs_from_turns(OpsState(stack.pool).dialogue_turns(ns.generation_kind, window.since))
    out = generation_cycle(
        rows,
        registry=registry,
        workdir=workdir,
        config=LoraTrainingConfig.for_generation(base_model_path=ns.generation_base_model, **ns.generation_lora),
        window=DataWindow(since=window.since, until=window.until),
        around_training=gpu_freed_for(settings, registry),
    )
    record = out.to_record()
    if out.status != "registered" or out.version is None:
        return Trained(out.status, record)
    if not settings.vllm.url:
        return Trained("ok", {**record, "served": False, "reason": "registered; no [vllm] url to hot-load it into"})
    with vllm_client(settings) as client:
        swap = promote_generation(registry, out.version, AdapterServing(client), path_on_server=server_path(settings))
    return Trained("ok", {**record, "served": True, "swap": _plain(swap)})


def prune_merged(settings: Settings, root: Path, keep: Mapping[str, str]) -> dict[str, Any]:
    """Remove the directories under ``root`` the merge wrote (with its manifest) that ``keep`` does
    not name, and their adapters' registry entries (never the registry's active one). The base
    model and anything else there is left alone."""
    registry = open_registry(settings)
    in_registry = registry.active("embedding")
    registry_active = in_registry.version if in_registry else None
    removed: list[dict[str, Any]] = []
    kept: list[dict[str, str]] = []
    for d in sorted(root.iterdir()):
        if d.is_symlink() or not d.is_dir() or d.name.startswith(".") or not (d / MERGED_MANIFEST).is_file():
            continue
        if d.name in keep:
            kept.append({"version": d.name, "why": keep[d.name]})
            continue
        adapter = embedding_version_of(registry, f"http:{d.name}")
        shutil.rmtree(d)
        if adapter is not None and adapter.version != registry_active:
            registry.remove("embedding", adapter.version)
        removed.append({"version": d.name, "adapter": adapter.version if adapter else None})
    return {"removed": removed, "kept": kept}


def list_adapters(settings: Settings, kind: AdapterKind) -> list[dict[str, Any]]:
    registry = open_registry(settings)
    active = registry.active(kind)
    return [
        {
            "version": v.version,
            "model_id": v.model_id,
            "active": bool(active and v.version == active.version),
            "created_at": str(v.manifest.get("created_at", "")),
            "metrics": v.manifest.get("metrics", {}),
        }
        for v in registry.list(kind)
    ]


def roll_back_generation(settings: Settings) -> str:
    registry = open_registry(settings)
    with vllm_client(settings) as client:
        back = rollback_generation(registry, AdapterServing(client), path_on_server=server_path(settings))
    return f"serving {back.served_name if back else 'the base model'}"


def serve_active(settings: Settings, *, wait: bool, night_running: Callable[[], bool]) -> str:
    """See ``memoryctl.maintenance.adapters.serve_active_adapter``: nothing to load returns before
    any wait; a running night is left to restore the adapter itself."""
    registry = open_registry(settings)
    if registry.active("generation") is None:
        return "no generation adapter is active: vLLM serves the base model"
    with vllm_client(settings) as client:
        if wait:
            ready_within(client, settings.nightly.vllm_ready_s)
        if night_running():
            return "a night is running: it serves the adapter itself when it gives vLLM back"
        done = serve_active_generation(registry, AdapterServing(client), path_on_server=server_path(settings))
    if done["active"] is None:
        return "no generation adapter is active: vLLM serves the base model"
    return f"{'loaded' if done['loaded'] else 'already served'}: {done['active']}"


class LoraTraining:
    """``memoryctl.maintenance.training.Training`` as memoryctl-lora implements it: the entry point
    ``memoryctl.training`` names this class (lora/pyproject.toml)."""

    embedding = staticmethod(embedding_step)
    generation = staticmethod(generation_step)
    prune_merged = staticmethod(prune_merged)
    adapters = staticmethod(list_adapters)
    roll_back_generation = staticmethod(roll_back_generation)
    serve_active_generation = staticmethod(serve_active)
    follow_active_embedding = staticmethod(follow_active_embedding)


if TYPE_CHECKING:  # mypy holds the class to the protocol memoryctl declares
    _: type[Training] = LoraTraining


def _plain(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return {k: _plain(getattr(value, k)) for k in value.__dataclass_fields__}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
