"""What core memoryctl knows about a LoRA adapter without the ``memoryctl-lora`` distribution.

An adapter directory is what vLLM and peft load: ``adapter_config.json`` +
``adapter_model.safetensors``. Its identity is a sha256 of each of those files and one combined
digest of the sorted ``name:digest`` lines. Two sides need that identity and only one of them
trains: ``memoryctl_lora.manifest`` records it in ``manifest.json`` when an adapter is trained (on
the node where the nightly trains), and the ``minilm`` embedder (``memoryctl.embed.minilm``) names
its model — and so its Qdrant collection — after it, wherever queries are embedded. Keeping it here
lets the core read an adapter without importing the training distribution (torch, peft), and the
training side imports it from here, so the two can never disagree.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from memoryctl.errors import StoreError

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")

# The training side is its own distribution (lora/ in the repository, import name memoryctl_lora):
# torch, peft and transformers are its dependencies, so the core install stays torch-free.
LORA_INSTALL_HINT = "install the memoryctl-lora distribution (torch, peft, transformers): pip install -e ./lora"


class AdapterIntegrityError(StoreError):
    """An adapter directory is incomplete or does not match its manifest's checksums."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__("lora-registry", message, hint=hint)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def adapter_checksums(adapter_dir: Path) -> dict[str, Any]:
    """sha256 of each adapter file plus one combined digest (a short, stable version identity)."""
    files: dict[str, str] = {}
    for name in ADAPTER_FILES:
        p = adapter_dir / name
        if not p.is_file():
            raise AdapterIntegrityError(
                f"{adapter_dir}: missing {name}",
                hint="the adapter directory must hold adapter_config.json and adapter_model.safetensors",
            )
        files[name] = sha256_file(p)
    combined = hashlib.sha256("".join(f"{n}:{files[n]}\n" for n in sorted(files)).encode()).hexdigest()
    return {"algorithm": "sha256", "files": files, "combined": combined}
