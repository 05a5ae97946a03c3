"""vLLM on the ``gpu`` node: Qwen with LoRA (runtime adapter loading) and BGE-M3 embeddings.

Two instances of one template unit, both bound to the mesh address and guarded by one API key:
``vllm@generate`` (port 8000, ``--enable-lora``; ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` lets
``memoryctl nightly`` hot-load adapters) and ``vllm@embed`` (port 8001, the embedding model).
vLLM itself is pip-installed into ``/opt/vllm/venv`` from ``source`` (a requirement such as
``vllm==0.6.6``, or a wheel file on the controller). ``enabled: false`` (no GPU here) installs nothing.
"""

from __future__ import annotations

from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, pip, server, systemd

from deploy.common import component, secrets, template

PREFIX = "/opt/vllm"
VENV = f"{PREFIX}/venv"
CONFIG_DIR = "/etc/vllm"
DATA_DIR = "/var/lib/vllm"


def instances() -> dict[str, dict[str, object]]:
    settings = component("vllm")
    return {
        "generate": {
            "model": settings.get("model", "Qwen/Qwen2.5-7B-Instruct"),
            "port": 8000,
            "args": " ".join(
                [
                    "--enable-lora",
                    f"--max-loras {settings.get('max_loras', 4)}",
                    f"--max-lora-rank {settings.get('max_lora_rank', 64)}",
                    f"--gpu-memory-utilization {settings.get('gpu_memory_utilization', 0.7)}",
                    *settings.get("generate_args", []),
                ]
            ),
        },
        "embed": {
            "model": settings.get("embedding_model", "BAAI/bge-m3"),
            "port": 8001,
            "args": " ".join(
                [
                    "--task embed",
                    f"--gpu-memory-utilization {settings.get('embed_gpu_memory_utilization', 0.2)}",
                    *settings.get("embed_args", []),
                ]
            ),
        },
    }


def unit_context() -> dict[str, object]:
    settings = component("vllm")
    return {
        "mesh_address": host.data.mesh_address,
        "interface": host.data.mesh.get("interface", "wg0"),
        "config_dir": CONFIG_DIR,
        "venv": VENV,
        "data_dir": DATA_DIR,
        "model": settings.get("model", "Qwen/Qwen2.5-7B-Instruct"),
        "embedding_model": settings.get("embedding_model", "BAAI/bge-m3"),
    }


@deploy("vLLM")
def vllm() -> None:
    settings = component("vllm")
    if not settings.get("enabled", True):
        host.noop("vllm: disabled in the inventory (no GPU), nothing to install")
        return
    context = unit_context()
    apt.packages(name="Python venv", packages=["python3-venv"], no_recommends=True)
    server.group(name="Group vllm", group="vllm", system=True)
    server.user(name="User vllm", user="vllm", group="vllm", system=True, home=DATA_DIR, shell="/usr/sbin/nologin")
    files.directory(name="Data directory", path=DATA_DIR, user="vllm", group="vllm", mode="750")
    source = str(settings.get("source", "vllm"))
    if Path(source).is_file():
        files.put(name="Upload the vLLM wheel", src=source, dest=f"{PREFIX}/{Path(source).name}")
        source = f"{PREFIX}/{Path(source).name}"
    package = pip.packages(name="vLLM", packages=[source], virtualenv=VENV, present=True)
    env = template(
        "vllm/vllm.env.j2",
        f"{CONFIG_DIR}/vllm.env",
        api_key=secrets().token("vllm/api_key"),
        user="root",
        group="vllm",
        mode="640",
        **context,
    )
    unit = template("vllm/vllm@.service.j2", "/etc/systemd/system/vllm@.service", **context)
    systemd.daemon_reload(name="Reload systemd units", _if=unit.did_change)
    for name, instance in instances().items():
        args = template(
            "vllm/instance.args.j2",
            f"{CONFIG_DIR}/{name}.args",
            user="root",
            group="vllm",
            mode="640",
            **instance,
        )
        systemd.service(name=f"vllm@{name} running and enabled", service=f"vllm@{name}", running=True, enabled=True)
        systemd.service(
            name=f"Restart vllm@{name} (config changed)",
            service=f"vllm@{name}",
            restarted=True,
            _if=lambda args=args: args.did_change() or env.did_change() or unit.did_change() or package.did_change(),
        )
