"""The versions the bundle installs, stated once, and the rules that keep them consistent.

The local nodes run exactly these (from the controller's stand-ins of upstream's distribution, see
``inventory/local.yaml``) and the Hetzner example pins the same ones from upstream, so what CI
deployed and exercised is what production gets. Source URLs, archive names and apt version pins
are derived from here; ``tests/deploy/unit/test_hetzner.py`` checks that no inventory states another.
What depends on the operating system release (PostgreSQL's major, pgBackRest, Java, Python, glibc,
the NVIDIA driver) is in :mod:`deploy.osrelease`.

The GPU stack is a chain, refused at plan time when a link does not hold (:func:`check_gpu_stack`):
vLLM pins one torch; that torch is built for one CUDA release; a CUDA major runs on drivers from a
minimum version up (CUDA's minor-version compatibility: any 12.x runtime on a driver >= 525.60.13,
13.x needs >= 580); the driver is the release's. Read from PyPI's metadata of each wheel
(``requires_dist``: vllm -> ``torch==``, torch -> ``nvidia-cuda-runtime-cu12==12.8.90`` or
``cuda-toolkit==13.0.x``), 2026-12-01; docs/deploy.md "Compatibility" has the table.
"""

from __future__ import annotations

from dataclasses import dataclass

from deploy import gpulock
from deploy.osrelease import Release

QDRANT = "1.19.0"
NEO4J = "5.26.30"  # the 5.26 LTS line (Java 17 and 21)
TIMESCALEDB = "2.28.3"
VLLM = "0.19.1"  # GPU node only (Hetzner); the local nodes run a named stand-in

DEFAULTS = {"qdrant": QDRANT, "neo4j": NEO4J, "timescaledb": TIMESCALEDB}


@dataclass(frozen=True)
class TorchBuild:
    torch: str
    cuda: str  # the CUDA runtime torch's wheel depends on

    @property
    def cuda_major(self) -> int:
        return int(self.cuda.split(".")[0])


# vLLM -> the torch it pins (``torch==``) -> the CUDA runtime of that torch's PyPI wheel.
VLLM_TORCH: dict[str, TorchBuild] = {
    "0.19.1": TorchBuild("2.10.0", "12.8"),  # nvidia-cuda-runtime-cu12==12.8.90
    "0.20.2": TorchBuild("2.11.0", "13.0"),  # cuda-toolkit==13.0.2
    "0.33.0": TorchBuild("2.14.0", "13.0"),  # cuda-toolkit==13.0.3
}
# The CUDA release vLLM's own wheel is built for (``VLLM_MAIN_CUDA_VERSION`` in the wheel's
# vllm/envs.py): the CUDA line the GPU lock must be on (deploy/locks/vllm-cuda.txt).
VLLM_CUDA: dict[str, str] = {"0.19.1": "12.9"}
# The oldest driver a CUDA major's runtimes run on (NVIDIA's CUDA compatibility guide: minor-version
# compatibility within a major, from the major's first release driver).
CUDA_MIN_DRIVER: dict[int, str] = {12: "525.60.13", 13: "580.65.06"}


class IncompatibleVersions(ValueError):
    """Versions that cannot work together, refused before anything is installed."""


def numeric(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def torch_build(vllm: str) -> TorchBuild:
    try:
        return VLLM_TORCH[vllm]
    except KeyError:
        raise IncompatibleVersions(
            f"vLLM {vllm}: no torch/CUDA data for it in deploy/versions.py VLLM_TORCH "
            f"(known: {', '.join(VLLM_TORCH)}); read its torch pin and that torch's CUDA from PyPI's metadata"
        ) from None


def check_gpu_stack(release: Release, vllm: str, lock: dict[str, gpulock.Locked] | None = None) -> TorchBuild:
    """vLLM's torch, its CUDA, the driver that runs it: refuse a chain whose driver is too old. With
    the GPU ``lock`` (:mod:`deploy.gpulock`), the whole lock: its vLLM and torch are these, its one
    CUDA line is the one vLLM was built for, and the driver runs that line; the build returned is
    the lock's (torch on the lock's CUDA libraries)."""
    build = torch_build(vllm)
    _check_driver(release, vllm, build)
    if lock is None:
        return build
    try:
        pinned = {name: gpulock.version(lock, name) for name in ("vllm", "torch")}
        line = gpulock.cuda_line(lock)
    except gpulock.LockError as error:
        raise IncompatibleVersions(f"deploy/locks/vllm.txt: {error}") from None
    if pinned != {"vllm": vllm, "torch": build.torch}:
        raise IncompatibleVersions(
            f"deploy/locks/vllm.txt pins vllm {pinned['vllm']} and torch {pinned['torch']}; the deploy installs "
            f"vLLM {vllm} with torch {build.torch}: edit deploy/locks/vllm.in, then scripts/lock-gpu"
        )
    wanted = VLLM_CUDA.get(vllm)
    if wanted is not None and line != wanted:
        raise IncompatibleVersions(
            f"deploy/locks/vllm.txt is on CUDA {line}; vLLM {vllm} is built for CUDA {wanted}: "
            "put the CUDA libraries on its line in deploy/locks/vllm-cuda.txt, then scripts/lock-gpu"
        )
    locked = TorchBuild(build.torch, line)
    _check_driver(release, vllm, locked)
    return locked


def _check_driver(release: Release, vllm: str, build: TorchBuild) -> None:
    minimum = CUDA_MIN_DRIVER[build.cuda_major]
    if numeric(release.nvidia_driver) < numeric(minimum):
        raise IncompatibleVersions(
            f"vLLM {vllm} needs torch {build.torch}, built for CUDA {build.cuda}, which needs an NVIDIA driver "
            f">= {minimum}; {release.label} ships {release.nvidia_driver}. Pin a vLLM built for CUDA "
            f"{release.nvidia_driver} runs (deploy/versions.py VLLM), or take the driver from NVIDIA's CUDA repository"
        )


# Qdrant's release archives, by target: the glibc their binary needs (None: static, musl).
# Upstream's -gnu archives are built on a newer Ubuntu and have needed GLIBC_2.38 (qdrant/qdrant#6087);
# the -musl ones have no glibc floor, which is why the Hetzner example takes them. A source may
# state another floor (``glibc_floor``) for a binary it built; the deploy checks the binary itself too.
QDRANT_GLIBC_FLOOR: dict[str, tuple[int, int] | None] = {
    "x86_64-unknown-linux-musl": None,
    "x86_64-unknown-linux-gnu": (2, 38),
}


def qdrant_glibc_floor(url: str, stated: str | None) -> tuple[int, int] | None:
    """The glibc floor of the Qdrant archive at ``url`` (``stated`` overrides the target's)."""
    if stated is not None:
        major, minor = numeric(str(stated))[:2]
        return (major, minor)
    for target, floor in QDRANT_GLIBC_FLOOR.items():
        if target in url:
            return floor
    raise IncompatibleVersions(
        f"qdrant.source.url {url}: no known target in its name ({', '.join(QDRANT_GLIBC_FLOOR)}); "
        "state the binary's glibc floor as qdrant.source.glibc_floor"
    )


def check_glibc(release: Release, url: str, stated: str | None) -> None:
    floor = qdrant_glibc_floor(url, stated)
    if floor is not None and floor > release.glibc:
        raise IncompatibleVersions(
            f"qdrant.source.url {url} needs glibc {'.'.join(map(str, floor))}; {release.label} has "
            f"{release.glibc_text()}: take the x86_64-unknown-linux-musl archive (no glibc floor)"
        )


def version(component: str, stated: str | None) -> str:
    """The version to install: this module's, unless the inventory overrides it explicitly."""
    return stated or DEFAULTS[component]
