"""What the training node's wheelhouse pins (deploy/lora_wheelhouse.py): the controller's own
versions of memoryctl-lora's dependencies, never torch (the node's hardware decides which)."""

from __future__ import annotations

from importlib.metadata import version

from deploy.lora_wheelhouse import pinned_closure


def test_the_wheelhouse_pins_what_the_controller_trained_with_and_leaves_torch_out() -> None:
    pins = dict(pin.split("==") for pin in pinned_closure())
    for name in ("transformers", "peft", "safetensors", "tokenizers", "accelerate", "sentence-transformers"):
        assert pins[name] == version(name), name
    assert "torch" not in pins and "triton" not in pins and "memoryctl" not in pins
    assert not any(name.startswith("nvidia-") for name in pins)  # torch's CUDA libraries come with torch
