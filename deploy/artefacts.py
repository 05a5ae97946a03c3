"""Release artefacts from a configurable source, installed keyed on the version, never by accident.

``source`` in a component's settings is one of::

    source: null                                       # nothing installed: configs validated only
    source: {url: https://.../v{version}/qdrant.tar.gz, sha256: <hex>}   # upstream, verified
    source: {file: /srv/mirror/qdrant.tar.gz}          # a file on the controller (sha256 optional)
    source: {artefact: qdrant-{version}-x86_64-unknown-linux-gnu.tar.xz}  # ../shared/artefacts

``{version}`` (and ``{pg}``, the PostgreSQL major) are filled in from :mod:`deploy.versions`, so an
inventory never restates a version. ``artefact`` names a file of a release artefacts directory
(``$MEMORYCTL_ARTEFACTS``, else ``/work/shared/artefacts`` and ``<repo>/../shared/artefacts``; and
always the ones assembled here, ``<repo>/.cache/artefacts``) and takes its sha256 from the ``SHA256SUMS``
beside it. Everything is checked at plan time: a URL without
a real sha256 (missing, or the example's placeholder) is refused with a message saying where to
get it, before any operation runs.

Installing is keyed on the version, not on whether an upload changed: an archive is unpacked into a
versioned directory with a marker written last, and the whole fetch/verify/unpack runs only while
that marker is missing. A run that failed half-way is therefore redone by the next one, and a no-op
run neither hashes nor uploads anything.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File
from pyinfra.operations import files, server

from deploy.settings import REPO, resolve_path

CACHE = "/var/cache/memoryctl"
MARKER = ".memoryctl-installed"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ArtefactSourceError(ValueError):
    """A ``source:`` that cannot be installed as written."""


@dataclass(frozen=True)
class Artefact:
    component: str
    url: str | None
    file: Path | None
    sha256: str | None  # None only for a {file} given without one: hashed when it is installed

    @property
    def name(self) -> str:
        return Path(self.url).name if self.url else Path(str(self.file)).name

    def describe(self) -> str:
        return f"url {self.url}" if self.url else f"file {self.file}"

    def digest(self) -> str:
        if self.sha256 is None:
            assert self.file is not None
            return hashlib.sha256(self.file.read_bytes()).hexdigest()
        return self.sha256


def artefacts_dirs() -> list[Path]:
    """Where ``{artefact: NAME}`` is looked for; the ones assembled here (Neo4j) always."""
    env = os.environ.get("MEMORYCTL_ARTEFACTS")
    shared = [Path(env)] if env else [Path("/work/shared/artefacts"), REPO.parent / "shared" / "artefacts"]
    return [*shared, REPO / ".cache" / "artefacts"]


def _from_artefacts(component: str, name: str) -> Artefact:
    for directory in artefacts_dirs():
        path, sums = directory / name, directory / "SHA256SUMS"
        if path.is_file():
            if not sums.is_file():
                raise ArtefactSourceError(f"{component}.source.artefact {name}: no SHA256SUMS beside it in {directory}")
            for line in sums.read_text().splitlines():
                digest, _, listed = line.partition(" ")
                if listed.strip().lstrip("*") == name:
                    return Artefact(component, None, path.resolve(), digest.lower())
            raise ArtefactSourceError(f"{component}.source.artefact {name}: no line for it in {sums}")
    where = ", ".join(str(d) for d in artefacts_dirs())
    raise ArtefactSourceError(
        f"{component}.source.artefact {name} not found in {where} "
        "(set MEMORYCTL_ARTEFACTS to the directory holding it and its SHA256SUMS; "
        "the Neo4j archive is assembled by scripts/neo4j-artefact)"
    )


def resolve(component: str, source: Any, **names: object) -> Artefact | None:
    """The ``source:`` of ``component`` as an :class:`Artefact`, checked; ``names`` fill ``{...}``."""
    if source is None:
        return None
    if not isinstance(source, dict) or len({"url", "file", "artefact"} & source.keys()) != 1:
        raise ArtefactSourceError(
            f"{component}.source must be null, {{url, sha256}}, {{file}} or {{artefact}}; got {source!r}"
        )
    try:
        fill = {key: str(value).format(**names) for key, value in source.items()}
    except (KeyError, IndexError) as exc:
        raise ArtefactSourceError(f"{component}.source: unknown placeholder {exc} (known: {sorted(names)})") from None
    sha256 = fill.get("sha256")
    if sha256 is not None and not _SHA256.match(sha256.lower()):
        raise ArtefactSourceError(
            f"{component}.source.sha256 {sha256!r} is not a sha256 (64 hex digits); "
            f"fill in the one published with {fill.get('url') or fill.get('file')} "
            "(the release page, or `sha256sum` of the file you checked)"
        )
    if "url" in fill:
        if sha256 is None:
            raise ArtefactSourceError(
                f"{component}.source.url {fill['url']} needs its sha256: the download is verified against it "
                "(take it from the release page, or `sha256sum` of the file you checked)"
            )
        return Artefact(component, fill["url"], None, sha256.lower())
    if "artefact" in fill:
        return _from_artefacts(component, fill["artefact"])
    path = resolve_path(fill["file"])
    if not path.is_file():
        raise ArtefactSourceError(f"{component}.source.file {path} does not exist on the controller")
    return Artefact(component, None, path, sha256.lower() if sha256 else None)


def _fetch(artefact: Artefact) -> str:
    """Operations that put the artefact in the node's cache directory (verified); its path there."""
    dest = f"{CACHE}/{artefact.name}"
    files.directory(name="Artefact cache", path=CACHE, mode="700")
    if artefact.url:
        files.download(name=f"Download {artefact.component}", src=artefact.url, dest=dest, sha256sum=artefact.sha256)
    else:
        files.put(name=f"Upload {artefact.component}", src=str(artefact.file), dest=dest, mode="600")
        server.shell(
            name=f"Verify {artefact.component} ({artefact.name})",
            commands=[f"echo '{artefact.digest()}  {dest}' | sha256sum --check --quiet --strict"],
        )
    return dest


def install_archive(artefact: Artefact, dest: str, *, strip: int = 0) -> bool:
    """Unpack ``artefact`` into ``dest`` (a versioned directory) unless it is already there.

    Returns whether this run installs it (callers restart services on it).
    """
    if host.get_fact(File, path=f"{dest}/{MARKER}"):
        return False
    archive = _fetch(artefact)
    partial = f"{dest}.partial"
    strip_arg = f" --strip-components={strip}" if strip else ""
    server.shell(
        name=f"Unpack {artefact.component} into {dest}",
        commands=[
            f"rm -rf {partial} && mkdir -p {partial}",
            f"tar -xf {archive} -C {partial}{strip_arg} --no-same-owner",
            f"touch {partial}/{MARKER}",
            f"rm -rf {dest} && mv {partial} {dest}",
            f"rm -f {archive}",
        ],
    )
    return True


def install_deb(artefact: Artefact, package: str, version_prefix: str) -> bool:
    """Install a .deb unless ``package`` is installed at a version starting with ``version_prefix``.

    ``apt-get install ./file.deb`` resolves the package's dependencies from the node's repositories.
    """
    installed = host.get_fact(DebPackages).get(package, set())
    if any(v.startswith(version_prefix) for v in installed):
        return False
    deb = _fetch(artefact)
    server.shell(
        name=f"Install {package} {version_prefix} from {artefact.name}",
        commands=[
            f"DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {deb}",
            f"rm -f {deb}",
        ],
    )
    return True
