"""One roles/ports table (deploy/ports.py, issue 43 item 5): every port the firewall opens on any node
of either inventory, every port Prometheus scrapes, every port a template names and every port a
file the deploy writes names is in it; docs/deploy.md's table is the module's."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from deploy.common import TEMPLATES
from deploy.firewall import ROLE_PORTS, firewall
from deploy.monitoring import monitoring
from deploy.ports import SERVICES, ports_table
from deploy.roles import everything
from deploy.settings import REPO, ROLES
from tests.deploy.unit.plans import LOCAL, NODES, OPERATOR_DOWNLOADS, example_inventory, fill_sha256, plan

TABLE = {service.port for service in SERVICES}
# A port in a template: after an address or a template variable (``{{ mesh_address }}:5432``), or a
# ``port`` setting (``port = 5432``, ``http_port: 6333``).
TEMPLATE_PORT = re.compile(r"(?:\}\}|\d|localhost):(\d{2,5})\b|port[_a-z]*\s*[=:]\s*(\d{2,5})\b")
# The same in a rendered file: after a node's mesh address (both inventories: 10.77.0.0/24) or the
# loopback (the controller's stand-in, 10.78.0.254:8090, is no port of the stack).
RENDERED_PORT = re.compile(r"(?:10\.77\.\d+\.\d+|127\.0\.0\.1|localhost):(\d{2,5})\b|port[_a-z]*\s*[=:]\s*(\d{2,5})\b")
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKx8x3zVXQ6o3rA5vN0o4Yl6vJq0b1Zc9w8a2b3c4d5e test@controller"


def test_the_table_names_each_service_and_port_once() -> None:
    assert len({service.name for service in SERVICES}) == len(SERVICES)
    assert len(TABLE) == len(SERVICES)
    assert {service.role for service in SERVICES} - {None} == set(ROLES)
    assert ROLE_PORTS == {"db": [5432], "index": [7474, 7687], "gpu": [8000, 8001, 8003]}


def test_the_docs_table_is_the_module() -> None:
    text = (REPO / "docs" / "deploy.md").read_text()
    start, end = "<!-- ports table: python3 -m deploy.ports -->\n", "\n<!-- end of the ports table -->"
    assert start in text and end in text, "docs/deploy.md has lost its ports table markers"
    assert text.split(start, 1)[1].split(end, 1)[0] == ports_table(), "docs/deploy.md's ports table differs"


def test_every_port_a_template_names_is_in_the_table() -> None:
    found = {
        (path.relative_to(TEMPLATES).as_posix(), int(a or b))
        for path in TEMPLATES.rglob("*")
        if path.is_file()
        for a, b in TEMPLATE_PORT.findall(path.read_text())
    }
    assert {port for _, port in found} >= {6333}, found  # the scan finds them (the Qdrant scripts' own)
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
        monitor = nodes[0]  # the db node is one of the monitoring pair in both inventories
        p = plan(monitoring, monitor, components=components, inventory=inventory, facts=OPERATOR_DOWNLOADS)
        config = yaml.safe_load(p.upload("/etc/prometheus/prometheus.yml"))
        targets = [t for job in config["scrape_configs"] for group in job["static_configs"] for t in group["targets"]]
        scraped |= {int(target.rsplit(":", 1)[1]) for target in targets}
    assert {22, 5432, 6335, 8765, 9100} <= opened and {9100, 9187, 6333, 2381, 8008} <= scraped
    assert sorted(opened - TABLE) == [] and sorted(scraped - TABLE) == []


def test_every_port_a_file_the_deploy_writes_names_is_in_the_table(tmp_path: Path, home: Path) -> None:
    """The files as rendered for every node of both inventories (the templates' variables filled in)."""
    found: dict[int, str] = {}
    for inventory, nodes, components in _clusters(tmp_path):
        for node in nodes:
            p = plan(everything, node, components=components, inventory=inventory, facts=OPERATOR_DOWNLOADS)
            for op in p.ops:
                for dest, text in op.uploads.items():
                    for a, b in RENDERED_PORT.findall(text):
                        found.setdefault(int(a or b), f"{node}:{dest}")
    assert {5432, 6333, 6334, 7474, 7687, 8000, 8001, 8008, 2379} <= set(found), found
    assert {port: where for port, where in found.items() if port not in TABLE} == {}
