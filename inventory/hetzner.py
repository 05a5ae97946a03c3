"""Three Hetzner servers: ``pyinfra inventory/hetzner.py deploy.py``.

Reads ``$MEMORYCTL_INVENTORY`` or ``inventory/hetzner.yaml`` (copy ``hetzner.example.yaml``);
roles are groups (``db``, ``index``, ``gpu``), re-mapped by editing a node's ``roles``.
"""

import os
from pathlib import Path

from deploy.settings import load_inventory

_path = Path(os.environ.get("MEMORYCTL_INVENTORY") or Path(__file__).with_name("hetzner.yaml"))
if not _path.exists():
    raise SystemExit(f"inventory/hetzner.py: {_path} not found; copy inventory/hetzner.example.yaml to it")
_inventory = load_inventory(_path)

all = _inventory.pyinfra_all()
db = _inventory.group("db")
index = _inventory.group("index")
gpu = _inventory.group("gpu")
