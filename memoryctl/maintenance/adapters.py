"""``memoryctl adapters``: the LoRA adapter versions of a kind, and rolling the served one back.

With ``memoryctl.maintenance.nightly`` this is the only part of memoryctl that imports ``memoryctl_lora``
(the ``memoryctl-lora`` distribution, ``lora/`` in the repository), always inside a function: the
adapter registry is a directory on the node where the nightly trains, and that node is the one
with memoryctl-lora (and torch) installed. Anywhere else the command says so instead of failing on
an import (tests/unit/test_import_graph.py keeps the imports here and lazy).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from memoryctl.adapter_files import LORA_INSTALL_HINT
from memoryctl.config import Settings
from memoryctl.errors import ConfigError, InputError, MemoryctlError, StoreUnavailable
from memoryctl.maintenance.needs import MaintenanceStack
from memoryctl.vllm import STORE, VLLMClient

if TYPE_CHECKING:
    from memoryctl_lora.registry import AdapterRegistry, AdapterVersion

AdapterKind = Literal["embedding", "generation"]


def adapter_kind(kind: str) -> AdapterKind:
    if kind == "embedding":
        return "embedding"
    if kind == "generation":
        return "generation"
    raise InputError(f"kind must be embedding or generation, not {kind!r}")


def registry_root(settings: Settings) -> Path:
    return Path(settings.nightly.adapters_dir or settings.data_dir / "adapters")


def open_registry(settings: Settings) -> AdapterRegistry:
    """The adapter registry of this node; a ConfigError naming the fix where memoryctl-lora is not
    installed (the first thing every path into memoryctl_lora calls, so none ends in an ImportError)."""
    try:
        from memoryctl_lora.registry import AdapterRegistry
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "memoryctl_lora":  # it is there but cannot import a dependency
            raise
        raise ConfigError(
            "LoRA adapters are trained and kept where the nightly trains, and memoryctl-lora is not installed here",
            hint=f"run this on the node that trains (the GPU node in the cluster), or {LORA_INSTALL_HINT}",
        ) from None
    return AdapterRegistry(registry_root(settings))


def server_path(settings: Settings) -> Any:
    """Registry path → the path vLLM sees: ``[nightly] adapters_dir_on_server`` when the registry is
    synced to another host, else the registry path itself."""
    on_server = settings.nightly.adapters_dir_on_server
    root = registry_root(settings)

    def path(version: AdapterVersion) -> str:
        if not on_server:
            return str(version.path)
        return str(Path(on_server) / Path(version.path).relative_to(root))

    return path


def vllm_client(settings: Settings) -> VLLMClient:
    vllm = settings.vllm
    if not vllm.url:
        raise ConfigError(
            "serving a generation adapter needs [vllm] url", hint="set [vllm] url (memoryctl config show)"
        )
    key = vllm.api_key.get_secret_value() if vllm.api_key else None
    return VLLMClient(vllm.url, api_key=key, timeout_s=vllm.timeout_s)


def list_adapters(settings: Settings, kind: str) -> list[dict[str, Any]]:
    """Every registered version of ``kind``, oldest first, the served one marked ``active``."""
    which = adapter_kind(kind)
    registry = open_registry(settings)
    active = registry.active(which)
    return [
        {
            "version": v.version,
            "model_id": v.model_id,
            "active": bool(active and v.version == active.version),
            "created_at": str(v.manifest.get("created_at", "")),
            "metrics": v.manifest.get("metrics", {}),
        }
        for v in registry.list(which)
    ]


def rollback_adapter(stack: MaintenanceStack, kind: str) -> str:
    """Serve the previous generation adapter again (vLLM loads it, or serves the bare base model, and
    unloads the current one); returns what is served now, in words. The embedding adapter is rolled
    back by ``migrate --rollback`` (the alias back to the previous collection, the registry
    following): ``memoryctl adapters embedding --rollback`` runs that, then :func:`embedding_rolled_back`."""
    if adapter_kind(kind) != "generation":
        raise InputError("the embedding adapter is rolled back by `memoryctl migrate --rollback`")
    registry = open_registry(stack.settings)
    from memoryctl_lora.cycle import rollback_generation
    from memoryctl_lora.serving import AdapterServing

    with vllm_client(stack.settings) as client:
        back = rollback_generation(registry, AdapterServing(client), path_on_server=server_path(stack.settings))
    return f"serving {back.served_name if back else 'the base model'}"


def embedding_rolled_back(report: Any) -> str:
    """``migrate --rollback``'s report (a MigrationReport) in words, for ``adapters embedding
    --rollback``; a ConfigError when the registry could not follow the vectors."""
    followed = report.adapter_registry or {}
    if followed.get("error"):
        raise ConfigError(
            f"the vectors went back to {report.target_model}, but the adapter registry could not follow:"
            f" {followed['error']}",
            hint="fix the registry (the next `memoryctl nightly` makes it follow the served model too)",
        )
    adapter = f"adapter {followed['active'] or 'none'}" if followed.get("followed") else followed.get("why")
    return f"embedding model: {report.status} → {report.target_model} ({adapter})"


def embedding_version_of(registry: AdapterRegistry, model_id: str | None) -> AdapterVersion | None:
    """The registered embedding version whose vectors ``model_id`` (an aliased collection's model)
    holds: ``http:<served name>`` for a merged version on an embedding slot, ``...+lora:<checksum>``
    for MiniLM with the adapter applied; None when no registered adapter is in it (the base model)."""
    from memoryctl.maintenance.embedding_version import served_name

    if not model_id:
        return None
    for v in reversed(registry.list("embedding")):
        if model_id == f"http:{served_name(v.model_id)}" or model_id.endswith(f"+lora:{v.checksum[:12]}"):
            return v
    return None


def follow_active_embedding(stack: MaintenanceStack, *, reason: str) -> dict[str, Any]:
    """Make the registry's active embedding adapter the one in the collection now aliased.

    Called by ``migrate --rollback`` (both commands) and at the start of the nightly's embedding
    step. Returns ``active`` (the version, None for the base model) and ``changed`` (the registry's
    rollback entry, None when it already agreed), or ``why`` it did not look (no registry on this
    host) or the ``error``. Never raises: the alias swap it follows has already happened."""
    root = registry_root(stack.settings)
    if not (root / "embedding").is_dir():
        return {"followed": False, "why": f"no embedding adapter registry on this host ({root / 'embedding'})"}
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


def serve_active_adapter(
    settings: Settings, kind: str, *, wait: bool = False, night_running: Callable[[], bool] = lambda: False
) -> str:
    """Load the active generation adapter into vLLM when ``/v1/models`` does not list it: vLLM forgets
    every adapter loaded at run time when it restarts (a reboot, a crash, a restart by hand), and
    requests then name the base model. Run with ``wait`` by the gpu node's ``memoryctl-adapter-serve``
    unit at every start of ``vllm@generate`` (deploy/nightly.py), and by operators; idempotent.

    Nothing to load (no active adapter: a fresh node) returns before any wait, so the unit never
    fails for want of a vLLM it has nothing to give. While a night runs (``night_running``: its
    advisory lock is held) it does nothing: the night's GPU pause starts vLLM and restores the
    adapter itself, and a load from here could put back the version the night is replacing after
    the night unloaded it. The embedding model is served through ``migrate``, never loaded here."""
    if adapter_kind(kind) != "generation":
        raise InputError(
            "--serve-active is for the generation adapter",
            hint="the embedding model is a migrated model version: `memoryctl health` shows it",
        )
    registry = open_registry(settings)
    if registry.active("generation") is None:
        return "no generation adapter is active: vLLM serves the base model"
    from memoryctl_lora.cycle import serve_active_generation
    from memoryctl_lora.serving import AdapterServing

    with vllm_client(settings) as client:
        if wait:
            ready_within(client, settings.nightly.vllm_ready_s)
        if night_running():
            return "a night is running: it serves the adapter itself when it gives vLLM back"
        done = serve_active_generation(registry, AdapterServing(client), path_on_server=server_path(settings))
    if done["active"] is None:
        return "no generation adapter is active: vLLM serves the base model"
    return f"{'loaded' if done['loaded'] else 'already served'}: {done['active']}"


def ready_within(client: VLLMClient, deadline_s: float) -> None:
    """Wait for vLLM to answer ``/health``; an error saying where to look when it does not."""
    from memoryctl.maintenance.gpu_pause import PauseFailed, wait_until_ready

    try:
        wait_until_ready(client, deadline_s)
    except PauseFailed:
        raise StoreUnavailable(
            STORE,
            f"vLLM at {client.url} did not answer /health within {deadline_s:.0f} s",
            hint="is it running? `systemctl status vllm@generate`, `journalctl -u vllm@generate`;"
            " [nightly] vllm_ready_s is how long it may take to start",
        ) from None
