"""Where memoryctl lives on a node: its prefix, venv, config, data, logs, user and service paths.

Constants only, below the operation modules: deploy/memoryctl.py installs into them, and the
gpu node's modules (deploy/nightly.py, deploy/embedding_slots.py) use the same venv and user
without importing the operation module that installs memoryctl on the db node (the import cycle
memoryctl <-> nightly <-> embedding_slots this replaced).
"""

PREFIX = "/opt/memoryctl"
VENV = f"{PREFIX}/venv"
REMOTE_WHEELHOUSE = f"{PREFIX}/wheelhouse"
CONFIG = "/etc/memoryctl/memoryctl.toml"
LOG_DIR = "/var/log/memoryctl"
DATA_DIR = "/var/lib/memoryctl"
USER = "memoryctl"
SERVE_UNIT = "/etc/systemd/system/memoryctl-serve.service"
SERVE_SOCKET = "/run/memoryctl/serve.sock"
# The layout as memoryctl's templates name it: the cron file, the service units, logrotate.
TEMPLATE_VARS = {"run_as": USER, "venv": VENV, "config_path": CONFIG, "log_dir": LOG_DIR}
