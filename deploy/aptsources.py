"""Third-party apt repositories and version pins: what a node installs from, and at which version.

A repository is data (``sources.apt.<name>`` of the inventory): its URI, suite (``{codename}`` is
the node's release), components, the URL of its signing key and that key's **fingerprints**. The
key is fetched on the node, imported into a throw-away keyring, and only the listed fingerprints
are exported into ``/etc/apt/keyrings/<name>.gpg`` — a download that does not hold them is refused
(the deploy stops) — and the source line is ``signed-by`` that keyring, so the key signs for this
repository only. Production points at Timescale's packagecloud repository; the local nodes at the
controller's stand-in (``scripts/standin``: a repository signed by a key made for the run); the
operations are the same.

Lists are refreshed whenever a node would otherwise install from stale ones, asked of the node on
every run rather than "the repository was just added": after the source line or the key changed,
while the repository's lists are missing (a run killed between adding the source and refreshing),
and before a pinned package is installed or changed.

A pin (``/etc/apt/preferences.d/memoryctl-<name>``, priority 1001) holds packages at the version
the deploy chose: both ends of pgBackRest at the release's version, TimescaleDB at the bundle's,
NVIDIA's user-space libraries at the loaded driver's. Unattended upgrades and a hand-run
``apt upgrade`` then cannot move one of them on their own; the deploy moves them by changing the
data.
"""

from __future__ import annotations

import re
from io import StringIO
from typing import Any
from urllib.parse import urlsplit

from pyinfra import host
from pyinfra.api import FactBase
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File
from pyinfra.operations import apt, files, server

from deploy.osrelease import release
from deploy.settings import resolve_path

KEYRINGS = "/etc/apt/keyrings"
LISTS = "/var/lib/apt/lists"
_FINGERPRINT = re.compile(r"^[0-9A-F]{40}$")


class AptSourceError(ValueError):
    """A ``sources.apt`` entry that cannot be used as written."""


class KeyringFingerprints(FactBase[list[str]]):
    """Fingerprints of the primary keys in a keyring file (empty when it does not exist)."""

    def default(self) -> list[str]:
        return []

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "gpg"

    def command(self, path: str) -> str:
        return f"test -f {path} && gpg --show-keys --with-colons {path} 2>/dev/null || true"

    def process(self, output: list[str]) -> list[str]:
        found, primary = [], False
        for line in output:
            kind = line.split(":", 1)[0]
            if kind == "pub":
                primary = True
            elif kind == "fpr" and primary:
                found.append(line.split(":")[9])
                primary = False
        return sorted(found)


def settings(name: str) -> dict[str, Any]:
    """``sources.apt.<name>`` of the inventory, checked."""
    sources = (host.data.get("sources") or {}).get("apt") or {}
    if name not in sources:
        raise AptSourceError(f"sources.apt.{name} is missing from the inventory (uri, suite, key_url, fingerprints)")
    entry = dict(sources[name])
    missing = [key for key in ("uri", "suite", "key_url") if not entry.get(key)]
    if missing:
        raise AptSourceError(f"sources.apt.{name} needs {', '.join(missing)}")
    entry["fingerprints"] = fingerprints(name, entry)
    entry["suite"] = str(entry["suite"]).format(codename=release().codename)
    return entry


def fingerprints(name: str, entry: dict[str, Any]) -> list[str]:
    """The signing key's fingerprints: listed, or read from a controller file (one per line: the
    local stand-in's key is made on the controller, so its fingerprint is known only there)."""
    listed = entry.get("fingerprints")
    if listed is None and entry.get("fingerprints_file"):
        path = resolve_path(str(entry["fingerprints_file"]))
        if not path.is_file():
            raise AptSourceError(
                f"sources.apt.{name}.fingerprints_file {path} does not exist (the local stand-in writes it: "
                "scripts/standin up)"
            )
        listed = path.read_text().split()
    values = [str(value).replace(" ", "").upper() for value in (listed or [])]
    if not values or not all(_FINGERPRINT.match(value) for value in values):
        raise AptSourceError(
            f"sources.apt.{name}: fingerprints must list the signing key's full fingerprints (40 hex digits), "
            f"got {listed!r}; check them against the vendor's documentation, never only against the downloaded key"
        )
    return sorted(values)


def lists_file(uri: str, suite: str) -> str:
    """The file apt keeps a repository's ``InRelease`` in (apt's URItoFileName: no scheme, ``/`` -> ``_``)."""
    parts = urlsplit(uri.rstrip("/") + f"/dists/{suite}/InRelease")
    return f"{LISTS}/" + (parts.netloc.rsplit("@", 1)[-1] + parts.path).replace("/", "_")


def trusted_key(name: str, key_url: str, wanted: list[str]) -> Any:
    """``/etc/apt/keyrings/<name>.gpg`` holding exactly the ``wanted`` keys, taken from ``key_url``
    only if it holds all of them (otherwise the operation fails, naming what it found)."""
    keyring = f"{KEYRINGS}/{name}.gpg"
    if host.get_fact(KeyringFingerprints, path=keyring) == wanted:
        host.noop(f"{keyring} holds {', '.join(wanted)}")
        return None
    checks = " && ".join(f'grep -qx {fpr} "$tmp/found"' for fpr in wanted)
    return server.shell(
        name=f"{name} apt key (fingerprints checked)",
        commands=[
            'tmp=$(mktemp -d) && trap \'GNUPGHOME="$tmp" gpgconf --kill all; rm -rf "$tmp"\' EXIT'
            f' && curl -fsSL --retry 3 -o "$tmp/key" {key_url}'
            ' && GNUPGHOME="$tmp" gpg --batch --quiet --import "$tmp/key"'
            ' && GNUPGHOME="$tmp" gpg --batch --with-colons --list-keys'
            " | awk -F: '/^pub/ {p=1; next} p && /^fpr/ {print $10; p=0}' > \"$tmp/found\""
            f' && {{ {checks} || {{ echo "{key_url} does not hold the key(s) {" ".join(wanted)}'
            ' (it holds: $(tr "\\n" " " < "$tmp/found")): refusing it" >&2; exit 1; }; }'
            f' && GNUPGHOME="$tmp" gpg --batch --export {" ".join(wanted)} > "$tmp/keyring"'
            f' && install -m 644 "$tmp/keyring" {keyring}'
        ],
    )


def repository(name: str, *, stale: bool = False) -> dict[str, Any]:
    """The repository ``sources.apt.<name>`` on this node, its lists fresh; returns its settings.

    ``stale``: the caller is about to install or change a package from it (refresh first).
    """
    entry = settings(name)
    apt.packages(
        name="Tools for apt keys", packages=["ca-certificates", "curl", "gpg", "gpg-agent"], no_recommends=True
    )
    files.directory(name="apt keyrings directory", path=KEYRINGS, mode="755")
    key = trusted_key(name, str(entry["key_url"]), entry["fingerprints"])
    line = f"deb [signed-by={KEYRINGS}/{name}.gpg] {entry['uri']} {entry['suite']} {entry.get('components', 'main')}"
    repo = apt.repo(name=f"{name} apt repository", src=line, filename=name)
    missing = not host.get_fact(File, path=lists_file(str(entry["uri"]), entry["suite"]))
    # Known now (a fact, or the caller's): refresh unconditionally; else only if this run changed
    # the source line or the key.
    changed = [op for op in (repo, key) if op is not None]
    apt.update(
        name=f"Refresh apt lists ({name}: lists missing, a package to install, or the source changed)",
        _if=[] if (stale or missing) else lambda: any(op.did_change() for op in changed),
    )
    return entry


def pin(name: str, packages: list[str], version: str) -> Any:
    """Hold ``packages`` (names or ``src:`` source packages) at ``version`` (apt's glob: ``2.55.1-*``)."""
    return files.put(
        name=f"Pin {name} (the version is in the file)",
        src=_pin_text(name, packages, version),
        dest=f"/etc/apt/preferences.d/memoryctl-{name}",
        mode="644",
    )


def _pin_text(name: str, packages: list[str], version: str) -> StringIO:
    text = (
        f"# memoryctl: {name} is held at the version the deploy chose (deploy/osrelease.py, deploy/versions.py).\n"
        f"Package: {' '.join(packages)}\nPin: version {version}\nPin-Priority: 1001\n"
    )
    return StringIO(text)


def needs_install(packages: dict[str, str]) -> bool:
    """Whether any of ``{package: exact version}`` is not installed at that version (refresh first)."""
    installed = host.get_fact(DebPackages)
    return any(version not in installed.get(package, set()) for package, version in packages.items())
