"""memoryctl-lora's wheelhouse for the node that trains (deploy/nightly.py), built on the controller.

The training distribution (``lora/``, committed source at ``$MEMORYCTL_SOURCE_REF`` like the
memoryctl wheel), and on a node without a GPU every dependency it pulls in, as binary wheels for
the *nodes'* platform, pinned to the versions the controller itself runs: the ones its tests
trained with (tests/lora, tests/integration/test_nightly*.py). torch is not among them: there the
node takes Debian's CPU build (``python3-torch``, seen through ``--system-site-packages``). A GPU
node gets memoryctl-lora's own wheel only (``closure=False``): it installs the closure itself from
deploy/locks/lora.txt, so a production controller needs no memoryctl-lora installed.
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from deploy.common import components
from deploy.osrelease import release
from deploy.settings import resolve_path
from deploy.wheelhouse import PIP, Platform, _git, node_platform, source_ref, stale_build, wheel_command

LORA = "lora"
# Not fetched as pinned wheels: torch (see above) with what only it needs, and memoryctl (its own wheelhouse).
NOT_PINNED = frozenset({"torch", "triton", "memoryctl"})


class LoraWheelhouseError(RuntimeError):
    """The controller cannot say which versions the training node needs."""


def pinned_closure() -> list[str]:
    """``name==version`` of everything memoryctl-lora needs at run time, as installed here."""
    try:
        root = distribution("memoryctl-lora")
    except PackageNotFoundError:
        raise LoraWheelhouseError(
            "memoryctl-lora is not installed on the controller: `pip install -e ./lora` (its installed"
            " versions are the ones the training node gets)"
        ) from None
    pins: dict[str, str] = {}

    def walk(requirement: str) -> None:
        req = Requirement(requirement)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            return
        name = canonicalize_name(req.name)
        if name in pins or name in NOT_PINNED or name.startswith("nvidia-"):
            return
        try:
            found = distribution(req.name)
        except PackageNotFoundError:
            missing = f"{req.name} (needed by memoryctl-lora) is not installed on the controller"
            raise LoraWheelhouseError(missing) from None
        pins[name] = found.version
        for sub in found.requires or []:
            walk(sub)

    for requirement in root.requires or []:
        walk(requirement)
    return sorted(f"{name}=={version}" for name, version in pins.items())


_built: dict[tuple[Path, str | None], Path] = {}
_building = threading.Lock()


def lora_wheelhouse(torch: str | None, closure: bool = True) -> Path:
    """The wheelhouse for this host's platform, built if its source, pins or ``torch`` changed.

    ``torch``: a version to fetch from PyPI with its dependencies, or None (the node takes its
    distribution's torch). ``closure`` False: memoryctl-lora's own wheel only — a GPU node installs
    the rest from deploy/locks/lora.txt itself (deploy/nightly.py), so the controller needs neither
    memoryctl-lora installed nor the CUDA torch passing through it. Once per process, as
    :func:`deploy.wheelhouse.ensure_wheelhouse`."""
    platform = node_platform(release())
    base = resolve_path(components().memoryctl.wheelhouse)
    path = base / (f"lora-{platform.tag}" if closure else f"lora-only-{platform.tag}")
    with _building:
        if (path, torch) not in _built:
            _built[(path, torch)] = _build(path, platform, torch, closure)
        return _built[(path, torch)]


def _build(path: Path, platform: Platform, torch: str | None, closure: bool = True) -> Path:
    pins = pinned_closure() if closure else []
    wanted = {"source": _git("rev-parse", f"{source_ref()}:{LORA}") or "worktree", "pins": pins, "torch": torch}
    with stale_build(path, wanted) as built:
        if built is not None:
            for old in path.glob("*.whl"):
                old.unlink()
            with tempfile.TemporaryDirectory(prefix="memoryctl-lora-src-") as scratch:
                subprocess.run([*wheel_command(path), _export(Path(scratch))], check=True)
            fetch = [*PIP, "download", "--quiet", *platform.pip_args(), "--dest", str(path)]
            if pins:
                subprocess.run([*fetch, "--no-deps", *pins], check=True)
            if torch:
                subprocess.run([*fetch, f"torch=={torch}"], check=True)
    return path


def _export(into: Path) -> str:
    """The committed ``lora/`` in a scratch directory (the working tree outside git)."""
    from deploy.settings import REPO

    ref = source_ref()
    if _git("rev-parse", ref) is None:
        return str(REPO / LORA)
    archive = subprocess.run(["git", "archive", ref, "--", LORA], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return str(into / LORA)
