"""The nightly LoRA cycle's declaration: whether it runs, on which node, with which settings.

Pure reads of the inventory, below the operation modules: deploy/nightly.py (which installs the
night), deploy/embedding_slots.py (the embedding step's vLLM slots), deploy/memoryctl.py (the db
node's cron leaves the night to the gpu node) and deploy/roles.py ask here, so that none of them
imports another for it (the import cycle memoryctl <-> nightly <-> embedding_slots this replaced).
"""

from __future__ import annotations

from typing import Any

from pyinfra import host

from deploy import vllm
from deploy.common import component, has_role, inventory

ADAPTERS_DIR = "/var/lib/memoryctl-adapters"
MODELS_DIR = "/var/lib/memoryctl/models"
TINY_BASE = f"{MODELS_DIR}/tiny-qwen2"
SCHEDULE = "15 2 * * *"
GENERATION_UNIT = "vllm@generate"
# Loads the active generation adapter again whenever vllm@generate starts (vLLM forgets it).
ADAPTER_SERVE_UNIT = "memoryctl-adapter-serve"
# What the tests' nights train with (tests/integration/test_nightly.py); production sets its own
# steps. The gate's noise floor: a candidate must lower the held-out loss by more than 0.01 nats
# to replace the served adapter (measured on the local nodes' tiny model: a first night 5.75 ->
# 5.50 against the base, a second night on the same kind of turns 0.001-0.005 against the first:
# a swap for nothing), docs/nightly.md.
DEFAULT_GENERATION_LORA = {"steps": 20, "min_examples": 8, "min_heldout": 2, "min_loss_improvement": 0.01}


def settings() -> dict[str, Any]:
    return component("nightly")


def enabled() -> bool:
    """The night trains on the gpu node when there is one with vLLM (or its stand-in) on it."""
    if not inventory().group("gpu"):
        return False
    return bool(settings().get("enabled", vllm.mode() != "off"))


def on_this_host() -> bool:
    """The first gpu node runs the night (one registry, one vLLM to load into)."""
    gpu = inventory().group("gpu")
    return enabled() and has_role("gpu") and bool(gpu) and host.name == gpu[0]


def generation_base_model() -> str | None:
    stated = settings().get("generation_base_model")
    if stated:
        return str(stated)
    return TINY_BASE if vllm.mode() == "standin" else None


def schedule() -> str:
    return str(settings().get("schedule", SCHEDULE))
