"""The inventory's ``components:`` parsed into typed settings (deploy/components.py, issue 43 item 5):
one default per setting, an unknown or mistyped key refused with the file, component and key, every
inventory and overlay the repository ships or its deploy tests write accepted, and docs/deploy.md's
table equal to the model."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.components import Components, InventoryError, parse, settings_table
from deploy.settings import REPO, load_inventory
from memoryctl.config import NightlySettings
from tests.deploy.unit.plans import EXAMPLE, LOCAL, example_inventory, fill_sha256

DOCS = REPO / "docs" / "deploy.md"
SINGLE_SERVER = REPO / "tests" / "deploy" / "single-server.yaml"


def test_every_setting_has_its_one_default() -> None:
    defaults = Components()
    assert defaults.vllm.mode == "vllm" and defaults.vllm.max_loras == 2 and defaults.vllm.gpu.reboot is False
    assert defaults.postgres.max_connections == 100 and defaults.postgres.members is None
    assert defaults.backup.schedule.full == "30 1 * * 0" and defaults.backup.repository.type == "posix"
    assert defaults.memoryctl.serve_port == 8765 and defaults.memoryctl.schedules.nightly == defaults.nightly.schedule
    # memoryctl's own [nightly] default, not a second one in the deploy.
    assert defaults.nightly.vllm_ready_s == NightlySettings().vllm_ready_s
    # A stated training key replaces the default's only.
    stated = parse({"nightly": {"generation_lora": {"steps": 3}}}, "x.yaml").nightly.generation_lora
    assert stated == {**Components().nightly.generation_lora, "steps": 3}
    # A component written with nothing under it (YAML null) has every default.
    assert parse({"neo4j": None}, "x.yaml").neo4j == Components().neo4j
    with pytest.raises(Exception, match="frozen"):
        defaults.vllm.mode = "off"  # type: ignore[misc]


def test_a_misspelt_setting_is_refused_naming_file_component_and_key(tmp_path: Path) -> None:
    doc = yaml.safe_load(LOCAL.read_text())
    doc["components"]["vllm"]["max_lora"] = 4
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(
        InventoryError,
        match=rf"^{re.escape(str(path))} \+ \S+/overlay.yaml: components\.vllm\.max_lora: no such setting"
        r" \(did you mean max_loras\?",
    ):
        load_inventory(path)
    with pytest.raises(InventoryError, match=r"components\.nope: no such setting \(known: backup, base, "):
        parse({"nope": {}}, "x.yaml")
    with pytest.raises(
        InventoryError, match=r"components\.backup\.schedule\.ful: no such setting \(did you mean full\?"
    ):
        parse({"backup": {"schedule": {"ful": "0 0 * * *"}}}, "x.yaml")
    with pytest.raises(InventoryError, match=r"components\.vllm\.mode: Input should be 'vllm', 'standin' or 'off'"):
        parse({"vllm": {"mode": "gpu"}}, "x.yaml")
    with pytest.raises(InventoryError, match=r"components\.qdrant\.replication_factor: .* \(got 'two'\)"):
        parse({"qdrant": {"replication_factor": "two"}}, "x.yaml")


def test_an_overlay_is_merged_first_and_named_when_it_is_wrong(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump({"cluster": "local", "components": {"qdrant": {"log_levl": "WARN"}}}))
    monkeypatch.setenv("MEMORYCTL_INVENTORY_OVERLAY", str(overlay))
    with pytest.raises(
        InventoryError,
        match=rf"^{re.escape(str(LOCAL))} \+ {re.escape(str(overlay))}: components\.qdrant\.log_levl: no such setting",
    ):
        load_inventory(LOCAL)
    overlay.write_text(yaml.safe_dump({"cluster": "local", "components": {"qdrant": {"log_level": "WARN"}}}))
    merged = load_inventory(LOCAL).components.qdrant
    assert merged.log_level == "WARN" and merged.peers == ["node1", "node2", "node3"]  # the rest kept


def test_the_shipped_inventories_validate(tmp_path: Path, home: Path) -> None:
    local = load_inventory(LOCAL).components
    assert local.vllm.mode == "standin" and local.postgres.members == ["node1", "node2"]
    assert local.nightly.vllm_ready_s == 120  # the stand-in's, stated where the stand-in is
    for path in (EXAMPLE, example_inventory(tmp_path, fill_sha256)):
        example = load_inventory(path).components
        assert example.vllm.gpu.reboot is True and example.backup.retention_diff == 7
        assert example.nightly.vllm_ready_s == NightlySettings().vllm_ready_s


def _deploy_test_overlays(tmp_path: Path) -> dict[str, list[Path]]:
    """The overlays tests/deploy writes for its runs on the local nodes, by the helpers they use."""
    from tests.deploy import test_reshape, test_upgrades

    def written(name: str, make: Any) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        return Path(make(directory))

    roll = written("roll", lambda d: test_upgrades.overlay(d, test_upgrades.ROLL))
    upgrade = {**test_upgrades.ROLL, "timescaledb": {"version": test_upgrades.NEXT_TIMESCALEDB}}
    timescaledb = written("timescaledb", lambda d: test_upgrades.overlay(d, upgrade))
    raised = written("ha", lambda d: test_upgrades.overlay(d, {"postgres": {"max_connections": 60}}))  # test_ha
    node4 = {"nodes": {"node4": test_reshape.NODE4}}
    grown = {**node4, "components": {"qdrant": {"peers": [*test_reshape.PEERS, "node4"]}}}
    draining = {**node4, "components": {"qdrant": {"peers": test_reshape.PEERS}}}
    held = {"components": {"upgrades": {"held": "roll"}}}
    return {
        "single server": [SINGLE_SERVER],
        "qdrant roll": [SINGLE_SERVER, roll],
        "timescaledb upgrade": [SINGLE_SERVER, timescaledb],
        "max_connections": [raised],
        "add node4": [written("grown", lambda d: test_reshape._overlay(d, "grown", grown))],
        "drain node4": [written("draining", lambda d: test_reshape._overlay(d, "draining", draining))],
        "package roll": [written("rolled", lambda d: test_reshape._overlay(d, "rolled", held))],
    }


def test_the_overlays_of_the_deploy_tests_validate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    standin = os.environ["MEMORYCTL_INVENTORY_OVERLAY"].split(os.pathsep)  # the stand-in's (conftest.py)
    for label, overlays in _deploy_test_overlays(tmp_path).items():
        monkeypatch.setenv("MEMORYCTL_INVENTORY_OVERLAY", os.pathsep.join([*standin, *map(str, overlays)]))
        components = load_inventory(LOCAL).components
        assert components.qdrant.source is not None and components.qdrant.source.sha256sums, label
    assert components.upgrades.held == "roll"


def test_the_docs_table_is_the_model() -> None:
    text = DOCS.read_text()
    start, end = "<!-- components table: python3 -m deploy.components -->\n", "\n<!-- end of the components table -->"
    assert start in text and end in text, "docs/deploy.md has lost its components table markers"
    documented = text.split(start, 1)[1].split(end, 1)[0]
    assert documented == settings_table(), "docs/deploy.md's components table differs: python3 -m deploy.components"
