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
    try:
        _copy_contents(base, partial, ignore=shutil.ignore_patterns(*WEIGHT_FILES, "onnx", "*.onnx", ".git*"))
        merged.model.save_pretrained(str(partial), safe_serialization=True)
        manifest: dict[str, Any] = read_manifest(adapter)
        about = {"base_model_dir": str(base), "adapter_dir": str(adapter), "model_id": merged.model_id}
        (partial / MERGED_MANIFEST).write_text(json.dumps({**about, "adapter_manifest": manifest}, indent=2))
        _readable_like(partial, out.parent)
        os.replace(partial, out)
    except BaseException:
        # A full disk half-way (a model version is gigabytes) leaves nothing behind to fill it more.
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out


def _copy_contents(src: Path, dst: Path, *, ignore: Any) -> None:
    """The base's files copied as content only. Why not ``shutil.copytree``: it ends every directory
    with ``copystat``, which sets the base's mode on the copy and so clears the setgid bit the
    directory inherited from the versions directory; the merged weights written after that get the
    writer's group instead of the servers' (a non-member cannot set the bit back)."""
    dst.mkdir()
    skip = ignore(str(src), [p.name for p in src.iterdir()])
    for entry in sorted(src.iterdir()):
        if entry.name in skip:
            continue
        if entry.is_dir():
            _copy_contents(entry, dst / entry.name, ignore=ignore)
        else:
            shutil.copyfile(entry, dst / entry.name)


def _readable_like(tree: Path, parent: Path) -> None:
    """Give the version the access and the group of the directory it goes into, whatever the
    writer's umask: the embedding servers read it through their group (deploy/embedding_slots.py:
    the versions directory is memoryctl:vllm, setgid), as the adapter registry's versions
    (registry._readable_like). A file that still has another group (a writer that chose its own)
    is given the directory's; where the writer may not, the merge fails here, before any slot is
    pointed at a version its server could not read."""
    info = parent.stat()
    mode = info.st_mode & 0o2775
    for path in [tree, *tree.rglob("*")]:
        if path.is_symlink():
            continue
        if path.stat().st_gid != info.st_gid:
            os.chown(path, -1, info.st_gid)
        path.chmod(mode if path.is_dir() else 0o644 & (mode | 0o600))
