"""The nightly LoRA cycle's declaration: whether it runs, on which node, with which settings.

Pure reads of the inventory, below the operation modules: deploy/nightly.py (which installs the
night), deploy/embedding_slots.py (the embedding step's vLLM slots), deploy/memoryctl.py (the db
node's cron leaves the night to the gpu node) and deploy/roles.py ask here, so that none of them
imports another for it (the import cycle memoryctl <-> nightly <-> embedding_slots this replaced).
"""

from __future__ import annotations

from pyinfra import host

from deploy import vllm
from deploy.common import components, has_role, inventory
from deploy.components import Nightly

ADAPTERS_DIR = "/var/lib/memoryctl-adapters"
MODELS_DIR = "/var/lib/memoryctl/models"
TINY_BASE = f"{MODELS_DIR}/tiny-qwen2"
# Loads the active generation adapter again whenever vllm@generate starts (vLLM forgets it).
ADAPTER_SERVE_UNIT = "memoryctl-adapter-serve"


def settings() -> Nightly:
    return components().nightly


def enabled() -> bool:
    """The night trains on the gpu node when there is one with vLLM (or its stand-in) on it."""
    if not inventory().group("gpu"):
        return False
    stated = settings().enabled
    return vllm.mode() != "off" if stated is None else stated


def on_this_host() -> bool:
    """The first gpu node runs the night (one registry, one vLLM to load into)."""
    gpu = inventory().group("gpu")
    return enabled() and has_role("gpu") and bool(gpu) and host.name == gpu[0]


def generation_base_model() -> str | None:
    stated = settings().generation_base_model
    if stated:
        return str(stated)
    return TINY_BASE if vllm.mode() == "standin" else None


def schedule() -> str:
    return settings().schedule
