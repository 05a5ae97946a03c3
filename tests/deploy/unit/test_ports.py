"""One roles/ports table (deploy/ports.py, issue 43 item 5): every port the firewall opens on any node
of either inventory, every port Prometheus scrapes and every port a template names is in it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from deploy.common import TEMPLATES
from deploy.firewall import firewall
from deploy.monitoring import monitoring
from deploy.ports import SERVICES
from tests.deploy.unit.plans import LOCAL, NODES, OPERATOR_DOWNLOADS, example_inventory, fill_sha256, plan

TABLE = {service.port for service in SERVICES}
# A port in a template: after an address or a template variable (``{{ mesh_address }}:5432``), or a
# ``port`` setting (``port = 5432``, ``http_port: 6333``).
TEMPLATE_PORT = re.compile(r"(?:\}\}|\d|localhost):(\d{2,5})\b|port[_a-z]*\s*[=:]\s*(\d{2,5})\b")
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKx8x3zVXQ6o3rA5vN0o4Yl6vJq0b1Zc9w8a2b3c4d5e test@controller"


def test_the_table_names_each_service_and_port_once() -> None:
    assert len({service.name for service in SERVICES}) == len(SERVICES)
    assert len(TABLE) == len(SERVICES)


def test_every_port_a_template_names_is_in_the_table() -> None:
    found = {
        (path.relative_to(TEMPLATES).as_posix(), int(a or b))
        for path in TEMPLATES.rglob("*")
        if path.is_file()
        for a, b in TEMPLATE_PORT.findall(path.read_text())
    }
    assert {port for _, port in found} >= {5432, 6333, 7687, 8000}, found  # the scan finds them
    assert [(name, port) for name, port in sorted(found) if port not in TABLE] == []


def _clusters(tmp_path: Path) -> list[tuple[Path, tuple[str, ...], dict[str, object] | None]]:
    key = tmp_path / "id.pub"
    key.write_text(KEY + "\n")
    local = (LOCAL, ("node1", "node2", "node3"), {"base": {"admin_keys": [str(key)]}})
    return [local, (example_inventory(tmp_path, fill_sha256), NODES, None)]


def test_every_port_the_firewall_opens_or_prometheus_scrapes_is_in_the_table(tmp_path: Path, home: Path) -> None:
    opened: set[int] = set()
    scraped: set[int] = set()
    for inventory, nodes, components in _clusters(tmp_path):
        for node in nodes:
            rules = plan(firewall, node, components=components, inventory=inventory).upload("/etc/nftables.conf")
            opened |= {int(p) for ports in re.findall(r"dport \{?([\d, ]+)\}?", rules) for p in ports.split(",")}
        monitor = nodes[-1]  # the gpu node runs the monitoring in both inventories
        p = plan(monitoring, monitor, components=components, inventory=inventory, facts=OPERATOR_DOWNLOADS)
        config = yaml.safe_load(p.upload("/etc/prometheus/prometheus.yml"))
        targets = [t for job in config["scrape_configs"] for group in job["static_configs"] for t in group["targets"]]
        scraped |= {int(target.rsplit(":", 1)[1]) for target in targets}
    assert {22, 5432, 6335, 8765, 9100} <= opened and {9100, 9187, 6333, 2381, 8008} <= scraped
    assert sorted(opened - TABLE) == [] and sorted(scraped - TABLE) == []
