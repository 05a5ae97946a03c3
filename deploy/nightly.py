"""The nightly LoRA cycle on the ``gpu`` node (issue 28; docs/nightly.md, "Where the night runs").

``memoryctl nightly`` runs from this node's cron, and the db node's cron no longer runs it: the
training needs the GPU and the base weights, which are here, the adapter registry is then on the
host whose vLLM loads from it, and memoryctl reaches the three stores over the mesh from any node.
One PostgreSQL advisory lock (``nightly``) and the cron entry's ``flock -n`` keep two nights from
overlapping wherever they are started.

- memoryctl and memoryctl-lora in ``/opt/memoryctl/venv``, the venv with
  ``--system-site-packages``. Where the node has a GPU (``components.vllm.mode`` ``vllm``) the
  node installs memoryctl-lora's closure itself from deploy/locks/lora.txt (PyPI, hashes required:
  the vLLM lock's torch and CUDA line) and the controller sends memoryctl's and memoryctl-lora's own
  wheels only; without one (``standin``) torch is Debian's CPU build (``python3-torch``) and the rest
  of the closure comes from the controller's wheelhouse (:mod:`deploy.lora_wheelhouse`).
- ``/etc/memoryctl/memoryctl.toml``: the db node's, without ``[serve]`` (no service here), with
  ``[nightly]``: the adapter registry ``/var/lib/memoryctl-adapters`` (group ``vllm``: vLLM reads what
  it loads), the generation base model's directory, ``pause_units`` (``vllm@generate``: on the
  GEX44 the training has no room beside it) and a sudoers rule for exactly their stop and start.
- ``memoryctl-adapter-serve``: a oneshot every start of ``vllm@generate`` pulls in, loading the
  active generation adapter again (vLLM forgets adapters loaded at run time when it restarts).
- The generation base model: ``components.nightly.generation_base_model``, the directory of the
  weights the served model is (the operator's; docs/nightly.md). On a node without a GPU
  (``standin``) a tiny randomly initialised Qwen2 is built there once (``build_tiny_qwen2``, the
  model the tests train); the stand-in serves its answers under the configured model's name.
- The embedding step: with an embedding base model (``components.nightly.embedding_base_model``;
  MiniLM without a GPU) the two embedding slots of deploy/embedding_slots.py and their ``[nightly]``
  keys, with a sudoers rule for restarting exactly those units; without one it records ``skipped``
  with its reason.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import File
from pyinfra.operations import apt, files, pip, server, systemd

from deploy import embedding_slots, gpulock, versions, vllm
from deploy import memoryctl as mctl
from deploy.common import service_account, sudoers, template
from deploy.components import GENERATION_UNIT
from deploy.lora_wheelhouse import lora_wheelhouse
from deploy.night import (
    ADAPTER_SERVE_UNIT,
    ADAPTERS_DIR,
    MODELS_DIR,
    TINY_BASE,
    generation_base_model,
    schedule,
    settings,
)
from deploy.versions import torch_build
from deploy.wheelhouse import install_offline, projects


def memoryctl_settings() -> dict[str, Any]:
    """The ``[nightly]`` table of the gpu node's memoryctl.toml."""
    return {
        "adapters_dir": ADAPTERS_DIR,
        "generation_base_model": generation_base_model(),
        "pause_units": list(settings().pause_units),
        "vllm_ready_s": settings().vllm_ready_s,
        "generation_lora": dict(settings().generation_lora),
        **embedding_slots.nightly_settings(),
    }


def install_training_lock(build: versions.TorchBuild) -> object | None:
    """The training venv's closure exactly as deploy/locks/lora.txt says, fetched by the node from
    PyPI, on the vLLM lock's torch and CUDA line (:func:`deploy.vllm.install_locked`)."""
    cuda = gpulock.cuda_line(gpulock.parse(gpulock.LORA_LOCK.read_text(), str(gpulock.LORA_LOCK)))
    return vllm.install_locked(
        gpulock.LORA_LOCK,
        mctl.VENV,
        f"{mctl.PREFIX}/lora.lock",
        "The training lock (deploy/locks/lora.txt)",
        f"memoryctl-lora's closure with torch {build.torch} (CUDA {cuda}) from the lock, hashes required",
    )


@deploy("Nightly LoRA cycle")
def nightly() -> None:
    torch = None
    if vllm.mode() == "standin":
        # Debian's torch (CPU); the venv below sees it. GPU nodes take vLLM's torch (CUDA) instead.
        # setuptools: Debian's torch declares it (Python >= 3.12), and pip checks what it declares.
        # OpenBLAS: Debian's torch does its matrix products through libblas.so.3 (BLAS_INFO=generic),
        # which without it is the reference BLAS: the stand-in's sentence-transformers embedded ~5 texts
        # a second on a local node (64 in 7-13 s), so a night's migrate of 3,200 memories took minutes.
        torch = apt.packages(
            name="torch (Debian's CPU build)",
            packages=["python3-torch", "python3-setuptools", "libopenblas0-pthread"],
            no_recommends=True,
        )
    tools = apt.packages(
        name="Python venv, cron, logrotate, sudo",
        packages=["python3-venv", "cron", "logrotate", "util-linux", "sudo"],
        no_recommends=True,
    )
    # The downloaded .debs are not needed once installed: torch's are ~350 MB of the gpu node's disk,
    # which holds the models and the night's versions (the local nodes' disk is a tmpfs).
    server.shell(
        name="Drop the downloaded packages",
        commands=["apt-get clean"],
        _if=lambda: tools.did_change() or (torch is not None and torch.did_change()),
    )
    service_account(mctl.USER, mctl.DATA_DIR, {mctl.DATA_DIR: "750", mctl.LOG_DIR: "750", MODELS_DIR: "750"})
    files.directory(name="Config directory", path="/etc/memoryctl", user="root", group=mctl.USER, mode="750")
    # memoryctl writes the registry, vLLM (group vllm) reads the adapters it is told to load.
    files.directory(name=f"Directory {ADAPTERS_DIR}", path=ADAPTERS_DIR, user=mctl.USER, group="vllm", mode="2750")

    files.directory(name="Install prefix", path=mctl.PREFIX, mode="755")
    pip.venv(name="Python venv with the system's torch", path=mctl.VENV, python="python3", site_packages=True)
    mctl.install_into(mctl.VENV, keep_upload=False)  # the gpu node's disk: torch and the models first
    if vllm.mode() == "vllm":
        # A GPU node builds its training stack itself, from the lock (PyPI, hashes required): the
        # controller sends memoryctl-lora's own wheel only (issue 41 item 5).
        install_training_lock(torch_build(versions.VLLM))
        wheels = lora_wheelhouse(None, closure=False)
    else:
        wheels = lora_wheelhouse(None)
    # The wheelhouse (without a GPU: the whole closure but torch's own) is installed as it is,
    # without pip resolving (Debian's torch declares `sympy==1.13.1` in its metadata and ships
    # another sympy, which pip refuses), then imported once to show the training stack loads.
    install_offline(
        wheels,
        mctl.VENV,
        f"{mctl.PREFIX}/wheelhouse-lora",
        ["memoryctl-lora", *[name for name in projects(wheels) if name != "memoryctl-lora"]],
        reinstall=["memoryctl-lora"],
        marker=".memoryctl-lora-wheelhouse",
        no_deps=True,
        keep_upload=False,
        check="python -c 'import torch, peft, transformers, memoryctl_lora.train_generation'",
    )
    files.link(name="memoryctl on PATH", path="/usr/local/bin/memoryctl", target=f"{mctl.VENV}/bin/memoryctl")
    if generation_base_model() == TINY_BASE and host.get_fact(File, path=f"{TINY_BASE}/config.json") is None:
        server.shell(
            name="A tiny Qwen2 to train on (no GPU here: the tests' model)",
            commands=[
                f"sudo -u {mctl.USER} OMP_NUM_THREADS=1 {mctl.VENV}/bin/python -c 'from"
                f' memoryctl_lora.train_generation import build_tiny_qwen2; build_tiny_qwen2("{TINY_BASE}", seed=0)\''
            ],
        )

    mctl.config_file(serve=False, night=memoryctl_settings())
    mctl.cron_file([{"name": "nightly", "command": "nightly", "schedule": schedule()}])
    adapter_unit = template(
        "memoryctl/memoryctl-adapter-serve.service.j2",
        f"/etc/systemd/system/{ADAPTER_SERVE_UNIT}.service",
        vllm_unit=GENERATION_UNIT,
        timeout_s=int(memoryctl_settings()["vllm_ready_s"]) + 120,
        mode="644",
        **mctl.TEMPLATE_VARS,
    )
    systemd.daemon_reload(name=f"Reload systemd units ({ADAPTER_SERVE_UNIT})", _if=adapter_unit.did_change)
    # Enabled, not started: it runs when vllm@generate starts (its WantedBy), not at the deploy.
    systemd.service(name=f"{ADAPTER_SERVE_UNIT} enabled", service=ADAPTER_SERVE_UNIT, running=None, enabled=True)
    sudoers(
        "memoryctl/sudoers-nightly.j2",
        "/etc/sudoers.d/memoryctl-nightly",
        run_as=mctl.USER,
        units=memoryctl_settings()["pause_units"],
        restart_units=[slot["unit"] for slot in memoryctl_settings().get("embedding_slots", [])],
    )
