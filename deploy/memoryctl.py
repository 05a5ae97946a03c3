"""memoryctl on the ``db`` node: offline install into a venv, config, cron with locking, logrotate.

- ``/opt/memoryctl/venv`` from the controller's wheelhouse (see :mod:`deploy.wheelhouse`);
  ``/usr/local/bin/memoryctl`` links to it. The install marker records the wheelhouse digest, so
  the install runs again only when the wheels changed.
- ``/etc/memoryctl/memoryctl.toml`` (0640 root:memoryctl) points at the mesh addresses of the
  ``db``, ``index`` and ``gpu`` nodes, with the generated passwords and API keys.
- ``/etc/cron.d/memoryctl``: ``sync`` (every 5 min), ``reconcile --repair`` (every 10 min) and
  ``nightly`` as the memoryctl user with ``MEMORYCTL_TRIGGER=cron`` (runs are recorded as ``cron``),
  each under ``flock -n`` and appending to ``/var/log/memoryctl/<job>.log``; logrotate rotates those.
- ``nightly`` on the cluster trains what the cluster can: the embedder is vLLM's (BGE-M3 over HTTP,
  which takes no LoRA here) and the db node has no GPU for the generation model, so both training
  steps record ``skipped`` with the reason, and the re-embed and reconcile steps run.
- ``memoryctl-serve.service``: the resident service (``memoryctl serve``) as the memoryctl user,
  socket in ``/run/memoryctl``, HTTP on the node's mesh address only; restarted when the install,
  the config or the unit changed. ``health`` reports it (``[serve] required``).
"""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, pip, systemd

from deploy import backup, embedding_slots, models, monitoring, patroni, ports
from deploy.common import components, keep_running, secrets, service_account, service_config, sudoers, template
from deploy.layout import (
    CONFIG,
    DATA_DIR,
    LOG_DIR,
    PREFIX,
    REMOTE_WHEELHOUSE,
    SERVE_SOCKET,
    SERVE_UNIT,
    TEMPLATE_VARS,
    USER,
    VENV,
)
from deploy.night import enabled as night_on_gpu
from deploy.qdrant import collection_layout
from deploy.vllm import rerank_served, served_models
from deploy.wheelhouse import controller_wheelhouse, install_offline

# name -> command; the schedules are components.memoryctl.schedules (deploy/components.py).
# reconcile every 10 minutes (the design's cadence) repairs what it finds, so a store that lost
# writes is refilled within minutes; its run record says what it fixed.
JOBS = {"sync": "sync", "reconcile": "reconcile --repair", "nightly": "nightly"}


@deploy("memoryctl")
def memoryctl() -> None:
    schedules = components().memoryctl.schedules.model_dump()

    apt.packages(
        name="Python venv, cron, logrotate",
        packages=["python3-venv", "cron", "logrotate", "util-linux"],
        no_recommends=True,
    )
    service_account(USER, DATA_DIR, {DATA_DIR: "750", LOG_DIR: "750"})
    files.directory(name="Config directory", path="/etc/memoryctl", user="root", group=USER, mode="750")

    installed = install()

    config = config_file(serve=True, night=None)
    # The night runs on the gpu node where there is one (deploy/nightly.py), not here as well.
    here = [name for name in JOBS if not (name == "nightly" and night_on_gpu())]
    jobs = [{"name": name, "command": JOBS[name], "schedule": schedules[name]} for name in here]
    cron_file(jobs)
    sudoers("memoryctl/sudoers-wireguard.j2", "/etc/sudoers.d/memoryctl-wireguard", run_as=USER)
    unit = template(
        "memoryctl/memoryctl-serve.service.j2",
        SERVE_UNIT,
        interface=host.data.mesh.get("interface", "wg0"),
        data_dir=DATA_DIR,
        mode="644",
        **TEMPLATE_VARS,
    )
    systemd.daemon_reload(name="Reload systemd units", _if=unit.did_change)
    keep_running("memoryctl-serve", [installed, config, unit])


def serve_port() -> int:
    """The port of ``memoryctl serve``'s HTTP side on the db node's mesh address."""
    return components().memoryctl.serve_port


def install() -> Any:
    """Install from the wheelhouse when it changed; the install operation, or None."""
    files.directory(name="Install prefix", path=PREFIX, mode="755")
    pip.venv(name="Python venv (venv module)", path=VENV, python="python3")
    installed = install_into(VENV)
    files.link(name="memoryctl on PATH", path="/usr/local/bin/memoryctl", target=f"{VENV}/bin/memoryctl")
    return installed


def install_into(venv: str, keep_upload: bool = True) -> Any:
    """memoryctl from the controller's wheelhouse into ``venv`` (an existing one)."""
    wheels = controller_wheelhouse()
    return install_offline(wheels, venv, REMOTE_WHEELHOUSE, ["memoryctl"], ["memoryctl"], keep_upload=keep_upload)


def cron_file(jobs: list[dict[str, str]]) -> None:
    """``/etc/cron.d/memoryctl`` with ``jobs`` (each under ``flock -n``, logging to ``LOG_DIR``) and
    the logrotate of their logs: the db node's jobs here, the night's on the gpu node
    (deploy/nightly.py)."""
    template("memoryctl/cron.j2", "/etc/cron.d/memoryctl", jobs=jobs, mode="644", **TEMPLATE_VARS)
    template("memoryctl/logrotate.j2", "/etc/logrotate.d/memoryctl", log_dir=LOG_DIR, run_as=USER, mode="644")


def config_file(*, serve: bool, night: dict[str, Any] | None) -> Any:
    """``/etc/memoryctl/memoryctl.toml`` (0640 root:memoryctl): every store over the mesh, with
    ``[serve]`` on the node that runs the service and ``[nightly]`` on the one that runs the night.
    The CPU cross-encoder goes beside it (the rerank stage's model, or its fallback behind
    ``vllm@rerank``), so a ``--rerank`` works on every node that has the file."""
    store = secrets()
    models.rerank_model()
    return service_config(
        "memoryctl/memoryctl.toml.j2",
        CONFIG,
        USER,
        data_dir=DATA_DIR,
        endpoints=host.data.endpoints,
        ports=ports.CLIENT_PORTS,
        pg_hosts=patroni.member_addresses() if patroni.enabled() else [],
        pg_user="memoryctl",
        pg_database="memoryctl",
        pg_password=store.token("postgres/memoryctl"),
        qdrant_api_key=store.token("qdrant/api_key"),
        neo4j_password=store.token("neo4j/password"),
        vllm_api_key=store.token("vllm/api_key"),
        models=served_models() | {"embedding": embedding_slots.served_embedding_model(served_models()["embedding"])},
        collections=collection_layout(),
        backup=backup.memoryctl_settings() if serve else None,
        serve=serve,
        serve_socket=SERVE_SOCKET,
        serve_port=serve_port(),
        nightly=night,
        nightly_on_gpu=night_on_gpu(),
        alerting=monitoring.memoryctl_alerting(),
        rerank=rerank_settings(),
    )


def rerank_settings() -> dict[str, Any]:
    """``[query]``'s rerank keys: where the CPU model is, and the served one when vLLM serves it."""
    settings = components().vllm
    served = rerank_served()
    return {
        "model_dir": models.MODELS_DIR,
        "url": f"http://{host.data.endpoints['gpu']}:{ports.VLLM_RERANK}" if served else None,
        "model": settings.rerank_model,
        "by_default": settings.rerank_by_default,
    }
