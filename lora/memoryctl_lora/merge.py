"""An embedding adapter merged into a new model version: a complete model directory to serve.

Why: the deployed vLLM (0.19.1) cannot apply a LoRA adapter to BGE-M3 — its
``BertEmbeddingModel``/``RobertaEmbeddingModel`` do not implement ``SupportsLoRA``, and
``--enable-lora`` on such a model stops the server at load ("... does not support LoRA yet.";
docs/nightly.md). So a promoted embedding adapter is folded into the base weights (PEFT
``merge_and_unload``: W + scale·B·A, the same function as base + adapter) and written as a full model
directory that a pooling server loads like the base model: the base's configuration, tokenizer and
sentence-transformers files (pooling, max length, BGE-M3's extra heads) copied, its weight files
replaced by the merged ones. ``migrate`` then moves the vectors to that version (new collection,
verification, alias swap; the old collection stays for ``--rollback``).

The directory appears whole or not at all (written next to it, then renamed), so a server never
loads half a version.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from .manifest import read_manifest

# The base's weight files: replaced by the merged model's. Everything else in the base directory is
# kept (tokenizer, config, sentence-transformers modules, BGE-M3's colbert/sparse heads).
WEIGHT_FILES = ("model.safetensors", "model-*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin")
MERGED_MANIFEST = "memoryctl-merged.json"


def merge_embedding_adapter(
    adapter_dir: Path | str, out_dir: Path | str, *, base_model_dir: Path | str | None = None
) -> Path:
    """Write base + ``adapter_dir`` merged into ``out_dir`` (which must not exist); returns it."""
    from .train_embedding import load_embedding_model, minilm_model_dir

    base = Path(base_model_dir) if base_model_dir else minilm_model_dir()
    adapter = Path(adapter_dir)
    out = Path(out_dir)
    if out.exists():
        raise FileExistsError(f"{out} exists: a model version is written once")
    merged = load_embedding_model(adapter, base_model_dir=base, verify=True, merge=True)
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(base, partial, ignore=shutil.ignore_patterns(*WEIGHT_FILES, "onnx", "*.onnx", ".git*"))
    merged.model.save_pretrained(str(partial), safe_serialization=True)
    manifest: dict[str, Any] = read_manifest(adapter)
    about = {"base_model_dir": str(base), "adapter_dir": str(adapter), "model_id": merged.model_id}
    (partial / MERGED_MANIFEST).write_text(json.dumps({**about, "adapter_manifest": manifest}, indent=2))
    os.replace(partial, out)
    return out
