"""A new embedding model version put on the idle embedding server, for ``migrate`` to roll onto.

Why (docs/nightly.md, "Embedding adapter on the deployed stack"): the deployed embedder is vLLM
0.19.1 serving BGE-M3 over HTTP, and 0.19.1 cannot apply a LoRA adapter to it
(``BertEmbeddingModel``/``RobertaEmbeddingModel`` lack ``SupportsLoRA``; ``--enable-lora`` stops
the server at load). So the nightly merges a promoted adapter into a complete model directory
(``memoryctl_lora.merge``) and a pooling server serves that directory as a new model. vLLM serves
one model per process, and queries must keep their model while ``migrate`` copies the vectors and
after it for ``--rollback``; hence two slots (``[nightly] embedding_slots``): the active one keeps
serving, the idle one gets the new version. This module's part, in order:

1. the idle slot: the one whose URL is not the active embedder's (``migrate`` records the active
   spec, so after a rollback the other slot is idle again);
2. its ``link`` repointed to the version directory, atomically (a symlink renamed over the old);
3. its ``unit`` restarted through ``[nightly] unit_command`` (``sudo -n systemctl restart``), and
   ``/v1/models`` polled until the version's name is listed (``[nightly] vllm_ready_s``).

The served name is the directory's name (the unit serves ``--served-model-name "$(basename
"$(readlink LINK)")"``, deploy/embedding_slots.py), so what the slot answers to is the version it
loaded, never a stale one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from memoryctl.config import EmbedderSettings, EmbeddingSlot, Settings, revealed
from memoryctl.deadline import poll_until
from memoryctl.errors import ConfigError, StoreError
from memoryctl.maintenance.gpu_pause import PauseFailed, run_unit_command
from memoryctl.vllm import VLLMClient


def versions_dir(settings: Settings) -> Path:
    return Path(settings.nightly.embedding_versions_dir or settings.data_dir / "embedding-models")


def served_name(model_id: str) -> str:
    """The version's directory name and served model name: its model id, ``/`` made ``--``."""
    return model_id.replace("/", "--")


def idle_slot(slots: list[EmbeddingSlot], active_url: str | None) -> EmbeddingSlot:
    """The first slot that is not serving the active model."""
    active = (active_url or "").rstrip("/")
    idle = [s for s in slots if s.url.rstrip("/") != active]
    if len(slots) < 2 or not idle:
        raise ConfigError(
            f"no idle embedding slot: the active embedder is {active_url!r}, [nightly] embedding_slots has"
            f" {[s.url for s in slots]}",
            hint="configure two slots (two pooling servers), one of them the active [embedder] url",
        )
    return idle[0]


def point_link(link: Path, target: Path) -> None:
    """Make ``link`` point at ``target`` in one rename: a server never sees it missing."""
    tmp = link.with_name(f".{link.name}.next")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


def wait_until_served(settings: Settings, url: str, name: str, interval_s: float = 0.5) -> float:
    """Poll ``/v1/models`` until ``name`` is served; the seconds it took, or PauseFailed."""
    deadline_s = settings.nightly.vllm_ready_s
    api_key = revealed(settings.embedder.api_key)
    with VLLMClient(url, api_key=api_key, settings="embedder", timeout_s=5.0) as client:
        # A StoreError is a server restarting: not listening yet.
        polled = poll_until(
            lambda: name in {m.id for m in client.models(retry=False).base},
            timeout_s=deadline_s,
            interval_s=interval_s,
            retry_on=(StoreError,),
        )
    if not polled.ok:
        raise PauseFailed(
            f"the embedding server at {url} does not serve {name!r} {deadline_s:.0f} s after its restart",
            hint="check the slot unit's log; raise [nightly] vllm_ready_s if it is only slow",
        )
    return polled.seconds


def serve_on_idle_slot(
    settings: Settings, model_dir: Path, active_url: str | None
) -> tuple[EmbedderSettings, dict[str, Any]]:
    """Put ``model_dir`` on the idle slot; the embedder ``migrate`` is to move to, and what was done."""
    slot = idle_slot(settings.nightly.embedding_slots, active_url)
    name = model_dir.name
    point_link(Path(slot.link), model_dir)
    record: dict[str, Any] = {"slot": slot.url, "served_name": name, "restarted": slot.unit}
    if slot.unit:
        run_unit_command(settings, "restart", [slot.unit])
    record["ready_s"] = round(wait_until_served(settings, slot.url, name), 3)
    e = settings.embedder
    target = EmbedderSettings(
        kind="http", url=slot.url, model=name, api_key=e.api_key, batch_size=e.batch_size, timeout_s=e.timeout_s
    )
    return target, record
