"""The GPU node's lock file (``deploy/locks/vllm.txt``): read, and held to its rules.

The vLLM venv is installed from it with ``pip install --require-hashes --no-deps``: every package
and version of the venv, each with its wheels' hashes, resolved by ``scripts/lock-gpu`` (uv) for the
node's CPython 3.13 on x86_64 (docs/deploy.md "The GPU lock"). ``--no-deps`` because the lock is the
whole closure, and torch's PyPI wheel pins the CUDA 12.8 libraries exactly while the lock puts them on
12.9 (the CUDA line vLLM 0.19.1 was built for): pip's resolver would refuse that override.

A lock holds when every requirement is ``name==version`` with at least one ``--hash=sha256:``, no name
appears twice, and the CUDA-versioned libraries agree on one CUDA release (:func:`cuda_line`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

LOCKS = Path(__file__).resolve().parent / "locks"
LOCK = LOCKS / "vllm.txt"
# The training venv's (the nightly's, on the GPU node): memoryctl-lora's closure on the same torch and
# CUDA line (scripts/lock-gpu; deploy/nightly.py installs it with the same rules).
LORA_LOCK = LOCKS / "lora.txt"
# Packages whose version is the CUDA release they belong to (major.minor first): the CUDA line.
# (cuFFT, cuRAND, cuSOLVER, cuSPARSE, cuFile have their own numbering: they follow the overrides.)
CUDA_VERSIONED = (
    "nvidia-cuda-runtime-cu12",
    "nvidia-cuda-nvrtc-cu12",
    "nvidia-cuda-cupti-cu12",
    "nvidia-cublas-cu12",
    "nvidia-nvjitlink-cu12",
    "nvidia-nvtx-cu12",
    "cuda-bindings",
)
# Other majors' libraries: a lock that holds one of these besides the -cu12 ones has two lines.
OTHER_MAJOR = re.compile(
    r"^(nvidia-.*-cu(?!12$)\d+|cuda-toolkit"
    r"|nvidia-(cuda-runtime|cuda-nvrtc|cuda-cupti|cublas|nvjitlink|nvtx|cufft|curand|cusolver|cusparse|cufile))$"
)
REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


class LockError(ValueError):
    """A lock file that breaks one of the rules above: which line, and what to run."""


@dataclass(frozen=True)
class Locked:
    name: str
    version: str
    hashes: tuple[str, ...]


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(text: str, source: str = "lock") -> dict[str, Locked]:
    """Every requirement of a ``pip --require-hashes`` file, by normalised name."""
    packages: dict[str, Locked] = {}
    current: tuple[str, str, list[str]] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("--hash="):
            if current is None or not HASH.search(line):
                raise LockError(f"{source}:{number}: a hash outside a requirement, or not sha256: {raw.strip()}")
            current[2].extend(HASH.findall(line))
            continue
        match = REQUIREMENT.match(line)
        if match is None:
            raise LockError(f"{source}:{number}: not a name==version pin: {raw.strip()} (re-run scripts/lock-gpu)")
        _close(packages, current, source)
        current = (normalise(match[1]), match[2], HASH.findall(line))
    _close(packages, current, source)
    if not packages:
        raise LockError(f"{source}: no requirements")
    return packages


def _close(packages: dict[str, Locked], current: tuple[str, str, list[str]] | None, source: str) -> None:
    if current is None:
        return
    name, version, hashes = current
    if not hashes:
        raise LockError(f"{source}: {name}=={version} has no --hash (re-run scripts/lock-gpu)")
    if name in packages:
        raise LockError(f"{source}: {name} is pinned twice")
    packages[name] = Locked(name, version, tuple(hashes))


def cuda_line(packages: dict[str, Locked]) -> str:
    """The one CUDA release (``12.9``) the lock's CUDA-versioned libraries belong to."""
    lines = {name: ".".join(packages[name].version.split(".")[:2]) for name in CUDA_VERSIONED if name in packages}
    others = sorted(name for name in packages if OTHER_MAJOR.match(name))
    if others:
        raise LockError(f"the lock mixes CUDA majors: {', '.join(others)} beside the CUDA 12 libraries")
    found = sorted(set(lines.values()))
    if len(found) != 1:
        detail = ", ".join(f"{name} {version}" for name, version in sorted(lines.items())) or "no CUDA library"
        raise LockError(
            f"the lock is not on one CUDA line ({detail}): "
            "list each in deploy/locks/vllm-cuda.txt, then scripts/lock-gpu"
        )
    return found[0]


def parse_pins(text: str) -> dict[str, str]:
    """The ``name==version`` lines of an input or override file (no hashes there), by normalised name."""
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return {normalise(m[1]): m[2] for m in map(REQUIREMENT.match, lines) if m}


def load(path: Path = LOCK) -> dict[str, Locked]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise LockError(f"{path}: {error.strerror}: run scripts/lock-gpu") from None
    return parse(text, str(path))


def version(packages: dict[str, Locked], name: str) -> str:
    try:
        return packages[normalise(name)].version
    except KeyError:
        raise LockError(f"the lock has no {name}: re-run scripts/lock-gpu") from None
