"""The three local test nodes (``scripts/cluster up``): ``pyinfra inventory/local.py deploy.py``."""

from pathlib import Path

from deploy.settings import load_inventory

_inventory = load_inventory(Path(__file__).with_suffix(".yaml"))

all = _inventory.pyinfra_all()
db = _inventory.group("db")
index = _inventory.group("index")
gpu = _inventory.group("gpu")
