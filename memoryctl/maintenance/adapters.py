"""``memoryctl adapters``: the LoRA adapter versions of a kind, and rolling the served one back.

The adapter registry is a directory on the node where the nightly trains, the one with the
``memoryctl-lora`` distribution (and torch) installed; what reads and changes it is there
(``memoryctl_lora.night``), reached through the training side (``memoryctl.maintenance.training``),
never imported. Here: the checks of the request, the settings-only parts every node shares (where
the registry and vLLM are), and the same error on every node without memoryctl-lora.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from memoryctl.config import Settings, revealed
from memoryctl.errors import ConfigError, InputError, MemoryctlError, StoreUnavailable
from memoryctl.maintenance.needs import MaintenanceStack
from memoryctl.maintenance.training import AdapterKind, training_side
from memoryctl.vllm import STORE, VLLMClient


def adapter_kind(kind: str) -> AdapterKind:
    if kind == "embedding":
        return "embedding"
    if kind == "generation":
        return "generation"
    raise InputError(f"kind must be embedding or generation, not {kind!r}")


def registry_root(settings: Settings) -> Path:
    return Path(settings.nightly.adapters_dir or settings.data_dir / "adapters")


def no_embedding_registry(settings: Settings) -> dict[str, Any] | None:
    """``follow_active_embedding``'s answer where this host keeps no embedding adapters (a node that
    does not train: memoryctl-lora need not be installed there), else None."""
    root = registry_root(settings) / "embedding"
    return None if root.is_dir() else {"followed": False, "why": f"no embedding adapter registry on this host ({root})"}


def vllm_client(settings: Settings) -> VLLMClient:
    vllm = settings.vllm
    if not vllm.url:
        raise ConfigError(
            "serving a generation adapter needs [vllm] url", hint="set [vllm] url (memoryctl config show)"
        )
    key = revealed(vllm.api_key)
    return VLLMClient(vllm.url, api_key=key, timeout_s=vllm.timeout_s)


def list_adapters(settings: Settings, kind: str) -> list[dict[str, Any]]:
    """Every registered version of ``kind``, oldest first, the served one marked ``active``."""
    which = adapter_kind(kind)
    return training_side().adapters(settings, which)


def rollback_adapter(stack: MaintenanceStack, kind: str) -> str:
    """Serve the previous generation adapter again (vLLM loads it, or serves the bare base model, and
    unloads the current one); returns what is served now, in words. The embedding adapter is rolled
    back by ``migrate --rollback`` (the alias back to the previous collection, the registry
    following): ``memoryctl adapters embedding --rollback`` runs that, then :func:`embedding_rolled_back`."""
    if adapter_kind(kind) != "generation":
        raise InputError("the embedding adapter is rolled back by `memoryctl migrate --rollback`")
    return training_side().roll_back_generation(stack.settings)


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


def follow_active_embedding(stack: MaintenanceStack, *, reason: str) -> dict[str, Any]:
    """Make the registry's active embedding adapter the one in the collection now aliased.

    Called by ``migrate --rollback`` (both commands) and at the start of the nightly's embedding
    step. Returns ``active`` (the version, None for the base model) and ``changed`` (the registry's
    rollback entry, None when it already agreed), or ``why`` it did not look (no registry on this
    host) or the ``error``. Never raises: the alias swap it follows has already happened."""
    missing = no_embedding_registry(stack.settings)
    if missing:
        return missing
    try:
        side = training_side()
    except MemoryctlError as exc:  # the registry is here but memoryctl-lora is not
        return {"followed": False, "error": exc.message}
    return side.follow_active_embedding(stack, reason=reason)


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
    return training_side().serve_active_generation(settings, wait=wait, night_running=night_running)


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
