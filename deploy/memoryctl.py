"""memoryctl on the ``db`` node: offline install into a venv, config, cron with locking, logrotate.

- ``/opt/memoryctl/venv`` from the controller's wheelhouse (see :mod:`deploy.wheelhouse`);
  ``/usr/local/bin/memoryctl`` links to it. The install marker records the wheelhouse digest, so
  the install runs again only when the wheels changed.
- ``/etc/memoryctl/memoryctl.toml`` (0640 root:memoryctl) points at the mesh addresses of the
  ``db``, ``index`` and ``gpu`` nodes, with the generated passwords and API keys.
- ``/etc/cron.d/memoryctl``: ``sync``, ``reconcile`` and ``nightly`` as the memoryctl user, each
  under ``flock -n`` and appending to ``/var/log/memoryctl/<job>.log``; logrotate rotates those.
- ``memoryctl-serve.service``: the resident service (``memoryctl serve``) as the memoryctl user,
  socket in ``/run/memoryctl``, HTTP on the node's mesh address only; restarted when the install,
  the config or the unit changed. ``health`` reports it (``[serve] required``).
"""

from __future__ import annotations

from collections.abc import Callable

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import FileContents
from pyinfra.operations import apt, files, server, systemd

from deploy import backup
from deploy.common import component, secrets, template
from deploy.settings import REPO
from deploy.wheelhouse import STAMP, ensure_wheelhouse

PREFIX = "/opt/memoryctl"
VENV = f"{PREFIX}/venv"
REMOTE_WHEELHOUSE = f"{PREFIX}/wheelhouse"
MARKER = f"{VENV}/.memoryctl-wheelhouse"
CONFIG = "/etc/memoryctl/memoryctl.toml"
LOG_DIR = "/var/log/memoryctl"
DATA_DIR = "/var/lib/memoryctl"
USER = "memoryctl"
SERVE_UNIT = "/etc/systemd/system/memoryctl-serve.service"
SERVE_SOCKET = "/run/memoryctl/serve.sock"
SERVE_PORT = 8765
DEFAULT_JOBS = {
    "sync": "*/5 * * * *",
    "reconcile": "30 4 * * *",
    "nightly": "15 2 * * *",
}


@deploy("memoryctl")
def memoryctl() -> None:
    settings = component("memoryctl")
    vllm = component("vllm")

    apt.packages(
        name="Python venv, cron, logrotate",
        packages=["python3-venv", "cron", "logrotate", "util-linux"],
        no_recommends=True,
    )
    server.group(name=f"Group {USER}", group=USER, system=True)
    server.user(
        name=f"User {USER}",
        user=USER,
        group=USER,
        system=True,
        home=DATA_DIR,
        shell="/usr/sbin/nologin",
        create_home=False,
    )
    files.directory(name="Data directory", path=DATA_DIR, user=USER, group=USER, mode="750")
    files.directory(name="Log directory", path=LOG_DIR, user=USER, group=USER, mode="750")
    files.directory(name="Config directory", path="/etc/memoryctl", user="root", group=USER, mode="750")

    installed = install(settings)

    endpoints = host.data.endpoints
    store = secrets()
    config = template(
        "memoryctl/memoryctl.toml.j2",
        CONFIG,
        data_dir=DATA_DIR,
        endpoints=endpoints,
        pg_user="memoryctl",
        pg_database="memoryctl",
        pg_password=store.token("postgres/memoryctl"),
        qdrant_api_key=store.token("qdrant/api_key"),
        neo4j_password=store.token("neo4j/password"),
        vllm_api_key=store.token("vllm/api_key"),
        model=vllm.get("model", "Qwen/Qwen2.5-7B-Instruct"),
        embedding_model=vllm.get("embedding_model", "BAAI/bge-m3"),
        backup=backup.memoryctl_settings(),
        serve_socket=SERVE_SOCKET,
        serve_port=settings.get("serve_port", SERVE_PORT),
        user="root",
        group=USER,
        mode="640",
    )
    schedules = {**DEFAULT_JOBS, **settings.get("schedules", {})}
    jobs = [{"name": name, "command": name, "schedule": schedule} for name, schedule in schedules.items()]
    template(
        "memoryctl/cron.j2",
        "/etc/cron.d/memoryctl",
        jobs=jobs,
        run_as=USER,
        venv=VENV,
        config_path=CONFIG,
        log_dir=LOG_DIR,
        mode="644",
    )
    template("memoryctl/logrotate.j2", "/etc/logrotate.d/memoryctl", log_dir=LOG_DIR, run_as=USER, mode="644")
    unit = template(
        "memoryctl/memoryctl-serve.service.j2",
        SERVE_UNIT,
        interface=host.data.mesh.get("interface", "wg0"),
        run_as=USER,
        venv=VENV,
        config_path=CONFIG,
        data_dir=DATA_DIR,
        log_dir=LOG_DIR,
        mode="644",
    )
    systemd.daemon_reload(name="Reload systemd units", _if=unit.did_change)
    systemd.service(name="memoryctl-serve running and enabled", service="memoryctl-serve", running=True, enabled=True)
    systemd.service(
        name="Restart memoryctl-serve (install, config or unit changed)",
        service="memoryctl-serve",
        restarted=True,
        _if=lambda: installed() or config.did_change() or unit.did_change(),
    )


def install(settings: dict[str, object]) -> Callable[[], bool]:
    """Install from the wheelhouse when it changed; returns whether this run installed."""
    local = REPO / str(settings.get("wheelhouse", ".cache/wheelhouse"))
    digest = ensure_wheelhouse(local)
    files.directory(name="Install prefix", path=PREFIX, mode="755")
    # The marker names the wheelhouse last installed: when it matches, nothing is uploaded or
    # checked file by file, which keeps the no-op re-run fast.
    marker = host.get_fact(FileContents, path=MARKER) or []
    installed: Callable[[], bool] = lambda: False  # noqa: E731
    if marker != [digest]:
        # Only the wheels: the build lock and source stamp stay on the controller.
        files.sync(
            name="Upload the wheelhouse",
            src=str(local),
            dest=REMOTE_WHEELHOUSE,
            delete=True,
            exclude=[".lock", STAMP],
        )
        pip = f"{VENV}/bin/pip install --quiet --no-index --find-links {REMOTE_WHEELHOUSE}"
        done = server.shell(
            name="Install memoryctl from the wheelhouse",
            commands=[
                f"test -x {VENV}/bin/pip || python3 -m venv {VENV}",
                f"{pip} --upgrade memoryctl",
                # Same version, new build (source changed without a version bump): take it anyway.
                f"{pip} --force-reinstall --no-deps memoryctl",
                f"echo {digest} > {MARKER}",
            ],
        )
        installed = done.did_change
    files.link(name="memoryctl on PATH", path="/usr/local/bin/memoryctl", target=f"{VENV}/bin/memoryctl")
    return installed
