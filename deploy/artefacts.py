"""Release artefacts from a configurable source: a URL (with its sha256) or a file on the controller.

``source`` in a component's settings is one of::

    source: null                                    # nothing installed: configs validated only
    source: {url: https://.../qdrant.tar.gz, sha256: <hex>}
    source: {file: /srv/mirror/qdrant.tar.gz}       # controller path (air-gapped installs)

Either way the archive lands at ``dest`` on the node; ``fetch()`` returns the operation so that the
caller unpacks only when it changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyinfra.operations import files


class ArtefactSourceError(ValueError):
    """A ``source:`` that is neither null, {url, sha256} nor {file}."""


def describe(source: dict[str, Any] | None) -> str:
    if source is None:
        return "none (configs only)"
    if "url" in source:
        return f"url {source['url']}"
    return f"file {source['file']}"


def validate(component: str, source: Any) -> dict[str, Any] | None:
    if source is None:
        return None
    if not isinstance(source, dict) or not ({"url"} <= source.keys() or {"file"} <= source.keys()):
        raise ArtefactSourceError(f"{component}.source must be null, {{url, sha256}} or {{file}}; got {source!r}")
    if "url" in source and "sha256" not in source:
        raise ArtefactSourceError(f"{component}.source.url needs its sha256 (the download is verified)")
    if "file" in source and not Path(source["file"]).is_file():
        raise ArtefactSourceError(f"{component}.source.file {source['file']} does not exist on the controller")
    return source


def fetch(component: str, source: dict[str, Any], dest: str) -> Any:
    if "url" in source:
        return files.download(name=f"Download {component}", src=source["url"], dest=dest, sha256sum=source["sha256"])
    return files.put(name=f"Upload {component}", src=source["file"], dest=dest)
