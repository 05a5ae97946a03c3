"""The operating system releases the bundle deploys onto: data, checked when the deploy is planned.

Everything that depends on the release — the suite names in apt sources, the PostgreSQL major that
Debian ships, the pgBackRest both ends must run, Java, the Python the wheelhouse is built for, the
glibc a release archive may need, the NVIDIA driver the GPU node gets — is read from :data:`RELEASES`
for the release the node reports (``/etc/os-release``, pyinfra's ``LinuxDistribution`` fact). A
node on any other release is refused before any operation runs, with the list of supported ones.

Values measured from the Debian 13 archive (``apt-cache policy`` in a ``debootstrap trixie`` root
with ``main contrib non-free``, 2026-12-01; docs/deploy.md "Compatibility" says where each one is
checked again: the deploy tests read them back from the local nodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyinfra import host
from pyinfra.facts.server import LinuxDistribution


class UnsupportedRelease(ValueError):
    """The node runs an operating system release the bundle has no data for."""


@dataclass(frozen=True)
class Release:
    """One supported Debian release and what the deploy installs from it."""

    major: int
    codename: str
    postgres: int  # the PostgreSQL major Debian ships (postgresql-<major>)
    pgbackrest: str  # the exact Debian version, pinned on every node that runs pgBackRest
    python: str  # the nodes' CPython: the wheelhouse is built for it
    glibc: tuple[int, int]
    java: str  # the JRE package Neo4j runs on
    nvidia_driver: str  # Debian's nvidia-driver in non-free (upstream version, pinned)

    @property
    def label(self) -> str:
        return f"Debian {self.major} ({self.codename})"

    def glibc_text(self) -> str:
        return ".".join(map(str, self.glibc))


RELEASES: dict[int, Release] = {
    13: Release(
        major=13,
        codename="trixie",
        postgres=17,  # postgresql-17 17.12-0+deb13u1
        pgbackrest="2.55.1-1",
        python="3.13",  # python3 3.13.5-1
        glibc=(2, 41),  # libc6 2.41-12+deb13u5
        java="openjdk-21-jre-headless",  # 21.0.13.1+2-1~deb13u1 (no openjdk-17 in trixie)
        nvidia_driver="550.163.01",  # nvidia-driver 550.163.01-2: CUDA 12.4
    ),
}
DEFAULT = 13  # what the local nodes run and the Hetzner example orders


def supported() -> str:
    return ", ".join(release.label for release in RELEASES.values())


def from_distribution(distribution: dict[str, Any]) -> Release:
    """The :class:`Release` of a ``LinuxDistribution`` fact, or :class:`UnsupportedRelease`."""
    name, major = distribution.get("name"), distribution.get("major")
    if name == "Debian" and major in RELEASES:
        return RELEASES[int(major)]
    meta = distribution.get("release_meta") or {}
    found = meta.get("PRETTY_NAME") or f"{name or 'an unknown system'} {major or ''}".strip()
    raise UnsupportedRelease(
        f"{host.name}: runs {found}; this bundle deploys onto {supported()} only "
        "(install that release on the node, or add its data to deploy/osrelease.py and plan-test it)"
    )


def release() -> Release:
    """The current host's release (planned from the fact; refused when unsupported)."""
    return from_distribution(host.get_fact(LinuxDistribution))
