"""Release archives downloaded by URL and verified, installed keyed on the version, never by accident.

``source`` in a component's settings (Qdrant, Neo4j) is::

    source: {url: https://.../v{version}/qdrant-x86_64-unknown-linux-musl.tar.gz, sha256: <hex>}
    source: {url: http://<controller>/.../v{version}/..., sha256sums: .cache/standin/www/SHA256SUMS}

``{version}`` is filled in from :mod:`deploy.versions`, so an inventory never restates a version.
The sha256 is stated (production: the one published with the release) or read on the controller
from a ``SHA256SUMS`` file (the local stand-in publishes one beside what it serves, like upstream
release pages list their digests). Either way the node downloads the URL itself and the download is
verified against it: the local nodes reach the controller's stand-in exactly as production nodes
reach upstream. Everything is checked at plan time: a URL without a real sha256 (missing, or the
example's placeholder) is refused with a message saying where to get it, before any operation runs.

Installing is keyed on the version, not on whether a download changed: an archive is unpacked into
a versioned directory with a marker written last, and the whole fetch/verify/unpack runs only while
that marker is missing. A run that failed half-way is therefore redone by the next one, and a no-op
run neither downloads nor hashes anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from pyinfra import host
from pyinfra.facts.files import File
from pyinfra.operations import files, server

from deploy.components import Source
from deploy.settings import resolve_path

CACHE = "/var/cache/memoryctl"
MARKER = ".memoryctl-installed"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ArtefactSourceError(ValueError):
    """A ``source:`` that cannot be installed as written."""


@dataclass(frozen=True)
class Artefact:
    component: str
    url: str
    sha256: str

    @property
    def name(self) -> str:
        return PurePosixPath(self.url).name


def _from_sums(component: str, url: str, sums: str) -> str:
    path = resolve_path(sums)
    name = PurePosixPath(url).name
    if not path.is_file():
        raise ArtefactSourceError(
            f"{component}.source.sha256sums {path} does not exist (the local stand-in writes it: scripts/standin up)"
        )
    for line in path.read_text().splitlines():
        digest, _, listed = line.partition(" ")
        if listed.strip().lstrip("*") == name:
            return digest.lower()
    raise ArtefactSourceError(f"{component}.source.sha256sums {path} has no line for {name}")


def resolve(component: str, source: Source | None, **names: object) -> Artefact | None:
    """The ``source:`` of ``component`` as an :class:`Artefact`, checked; ``names`` fill ``{...}``.
    Its shape (``{url, sha256 | sha256sums}``) was checked with the inventory (deploy/components.py)."""
    if source is None:
        return None
    try:
        url = source.url.format(**names)
    except (KeyError, IndexError) as exc:
        raise ArtefactSourceError(f"{component}.source: unknown placeholder {exc} (known: {sorted(names)})") from None
    if source.sha256sums:
        sha256 = _from_sums(component, url, source.sha256sums)
    elif source.sha256 is not None:
        sha256 = source.sha256.lower()
    else:
        raise ArtefactSourceError(
            f"{component}.source.url {url} needs its sha256: the download is verified against it "
            "(take it from the release page, or `sha256sum` of the file you checked)"
        )
    if not _SHA256.match(sha256):
        raise ArtefactSourceError(
            f"{component}.source.sha256 {source.sha256!r} is not a sha256 (64 hex digits); "
            f"fill in the one published with {url} (the release page, or `sha256sum` of the file you checked)"
        )
    return Artefact(component, url, sha256)


def install_archive(artefact: Artefact, dest: str, *, strip: int = 0, check: str | None = None) -> bool:
    """Download, verify and unpack ``artefact`` into ``dest`` (a versioned directory) unless it is
    already there. ``check`` (a shell command, run in the unpacked directory before the marker is
    written) may refuse what was unpacked: the run stops there, nothing points at it yet.

    Returns whether this run installs it (callers restart services on it).
    """
    if host.get_fact(File, path=f"{dest}/{MARKER}"):
        return False
    files.directory(name="Download cache", path=CACHE, mode="700")
    archive = f"{CACHE}/{artefact.name}"
    files.download(
        name=f"Download {artefact.component} (sha256 checked)",
        src=artefact.url,
        dest=archive,
        sha256sum=artefact.sha256,
    )
    partial = f"{dest}.partial"
    strip_arg = f" --strip-components={strip}" if strip else ""
    server.shell(
        name=f"Unpack {artefact.component} into {dest}",
        commands=[
            f"rm -rf {partial} && mkdir -p {partial}",
            f"tar -xf {archive} -C {partial}{strip_arg} --no-same-owner",
            *([f"cd {partial} && {check}"] if check else []),
            f"touch {partial}/{MARKER}",
            f"rm -rf {dest} && mv {partial} {dest}",
            f"rm -f {archive}",
        ],
    )
    return True
