"""Monitoring plans from fact fixtures, and what they render checked by Prometheus' own tools."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy.common import TEMPLATES
from deploy.monitoring import monitoring
from tests.deploy.unit.test_backup import plan, present
from tests.deploy.unit.test_plans import _no_commands

HERE = Path(__file__).parent


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"needs {name} (apt-get install prometheus prometheus-alertmanager)")
    return path


def test_every_node_exports_on_its_mesh_address_only() -> None:
    for node, address in (("node1", "10.77.0.1"), ("node2", "10.77.0.2"), ("node3", "10.77.0.3")):
        p = plan(monitoring, node)
        args = p.upload("/etc/default/prometheus-node-exporter")
        assert f"--web.listen-address={address}:9100" in args
        assert "--collector.textfile.directory=/var/lib/prometheus/node-exporter" in args
        cron = p.upload("/etc/cron.d/memoryctl-metrics")
        assert "* * * * * root /usr/local/sbin/memoryctl-wireguard-metrics" in cron
        assert ("memoryctl health --prometheus" in cron) == (node == "node1")  # memoryctl lives on the db node


def test_db_node_textfiles_are_replaced_atomically() -> None:
    cron = plan(monitoring, "node1").upload("/etc/cron.d/memoryctl-metrics")
    health = next(line for line in cron.splitlines() if "health --prometheus" in line)
    tmp, final = "memoryctl-health.prom.tmp", "memoryctl-health.prom"
    assert health.startswith("* * * * * memoryctl ") and f">/var/lib/prometheus/node-exporter/{tmp}" in health
    assert health.endswith(f"mv /var/lib/prometheus/node-exporter/{tmp} /var/lib/prometheus/node-exporter/{final}")
    assert any(
        line.startswith("*/5 * * * * memoryctl ") and "backup status --prometheus" in line for line in cron.splitlines()
    )


def test_postgres_exporter_role_once_and_mesh_bound() -> None:
    fresh = plan(monitoring, "node1")
    assert "CREATE ROLE prometheus LOGIN IN ROLE pg_monitor" in fresh.op("role prometheus").commands[-1]
    args = fresh.upload("/etc/default/prometheus-postgres-exporter")
    assert "--web.listen-address=10.77.0.1:9187" in args and "host=/var/run/postgresql" in args
    facts = present(fresh, ["prometheus-node-exporter", "prometheus-postgres-exporter"], [])
    facts.update(
        DebPackages={"prometheus-node-exporter": {"1"}, "prometheus-postgres-exporter": {"1"}},
        Users={"postgres": {"home": "/var/lib/postgresql", "group": "postgres", "groups": [], "shell": "/bin/bash"}},
        PostgresRoles={"prometheus": {}, "memoryctl": {}},
    )
    _no_commands(plan(monitoring, "node1", facts))


def test_monitoring_node_no_op() -> None:
    fresh = plan(monitoring, "node3")
    services = ["prometheus-node-exporter", "prometheus", "prometheus-alertmanager"]
    facts = present(fresh, services, ["prometheus-node-exporter", "prometheus", "prometheus-alertmanager"])
    _no_commands(plan(monitoring, "node3", facts))
    assert plan(monitoring, "node2", components={"monitoring": {"enabled": False}}).ops == []


def test_prometheus_scrapes_every_target_over_the_mesh(tmp_path: Path) -> None:
    p = plan(monitoring, "node3", components={"qdrant": {"source": {"url": "https://x/q.tgz", "sha256": "0" * 64}}})
    config = yaml.safe_load(p.upload("/etc/prometheus/prometheus.yml"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = {name: [t for sc in job["static_configs"] for t in sc["targets"]] for name, job in jobs.items()}
    assert targets["node"] == ["10.77.0.1:9100", "10.77.0.2:9100", "10.77.0.3:9100"]
    assert targets["postgres"] == ["10.77.0.1:9187"]
    assert targets["patroni"] == ["10.77.0.1:8008", "10.77.0.2:8008"]  # both members' Patroni /metrics
    assert sorted(targets["qdrant"]) == ["10.77.0.1:6333", "10.77.0.2:6333", "10.77.0.3:6333"]  # every peer
    assert jobs["qdrant"]["authorization"]["credentials_file"] == "/etc/prometheus/qdrant-api-key"
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["10.77.0.3:9093"]
    assert "--web.listen-address=10.77.0.3:9090" in p.upload("/etc/default/prometheus")
    assert "--cluster.listen-address= " in p.upload("/etc/default/prometheus-alertmanager")
    # promtool reads it as Prometheus would (rule files and the key file in place beside it).
    promtool = _tool("promtool")
    (tmp_path / "rules").mkdir()
    shutil.copy(TEMPLATES / "prometheus" / "memoryctl.rules.yml", tmp_path / "rules" / "memoryctl.yml")
    (tmp_path / "key").write_text("k\n")
    text = p.upload("/etc/prometheus/prometheus.yml").replace("/etc/prometheus/rules", str(tmp_path / "rules"))
    (tmp_path / "prometheus.yml").write_text(text.replace("/etc/prometheus/qdrant-api-key", str(tmp_path / "key")))
    result = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "28 rules found" in result.stdout


def test_alertmanager_sends_nothing_until_a_receiver_is_configured(tmp_path: Path) -> None:
    amtool = _tool("amtool")
    default = plan(monitoring, "node3", components={"monitoring": {"receiver": None}}).upload(
        "/etc/prometheus/alertmanager.yml"
    )
    local = yaml.safe_load(plan(monitoring, "node3").upload("/etc/prometheus/alertmanager.yml"))
    # The local nodes' receiver: the alert test's webhook on the monitoring node, short intervals.
    assert local["receivers"][0]["webhook_configs"] == [{"url": "http://127.0.0.1:9099/alerts", "send_resolved": True}]
    assert (local["route"]["group_wait"], local["route"]["group_interval"]) == ("5s", "10s")
    webhook = {"webhook_configs": [{"url": "https://hooks.example.org/alerts", "send_resolved": True}]}
    configured = plan(monitoring, "node3", components={"monitoring": {"receiver": webhook}}).upload(
        "/etc/prometheus/alertmanager.yml"
    )
    assert yaml.safe_load(default)["receivers"] == [{"name": "operator"}]
    assert yaml.safe_load(configured)["receivers"] == [{"name": "operator", **webhook}]
    for name, text in (("default", default), ("configured", configured)):
        path = tmp_path / f"{name}.yml"
        path.write_text(text)
        result = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_pass_promtool() -> None:
    promtool = _tool("promtool")
    check = subprocess.run(
        [promtool, "check", "rules", str(TEMPLATES / "prometheus" / "memoryctl.rules.yml")],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([promtool, "test", "rules", "rules_test.yml"], cwd=HERE, capture_output=True, text=True)
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr


def test_wireguard_metrics_script_names_peers(tmp_path: Path) -> None:
    """The script against a stand-in ``wg`` (two peers, one never seen); promtool parses the result."""
    promtool = _tool("promtool")
    p = plan(monitoring, "node1")
    script = tmp_path / "wireguard-metrics"
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    script.write_text(
        p.upload("/usr/local/sbin/memoryctl-wireguard-metrics").replace(
            "/var/lib/prometheus/node-exporter", str(textfile)
        )
    )
    keys = dict(line.split(") echo ") for line in script.read_text().splitlines() if ") echo node" in line)
    key2, key3 = (k.strip().strip('"') for k in keys)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "wg").write_text(f"#!/bin/sh\nprintf '%s\\t1700000000\\n%s\\t0\\n' '{key2}' '{key3}'\n")
    (bin_dir / "wg").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["sh", str(script)], check=True, env=env)
    out = (textfile / "wireguard.prom").read_text()
    assert 'wireguard_latest_handshake_seconds{interface="wg0",peer="node2"} 1700000000' in out
    assert 'wireguard_latest_handshake_seconds{interface="wg0",peer="node3"} 0' in out
    lint = subprocess.run([promtool, "check", "metrics"], input=out, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_restart_metrics_show_replaced_executables_and_a_pending_reboot(tmp_path: Path) -> None:
    """The script against stand-in ``systemctl``/``pgrep`` and a stand-in /proc: PostgreSQL's binary
    replaced under its postmaster (the kernel's " (deleted)"), etcd's not, Qdrant not running here."""
    promtool = _tool("promtool")
    p = plan(monitoring, "node2")
    assert "* * * * * root /usr/local/sbin/memoryctl-restart-metrics" in p.upload("/etc/cron.d/memoryctl-metrics")
    textfile, proc, bin_dir = tmp_path / "textfile", tmp_path / "proc", tmp_path / "bin"
    for directory in (textfile, bin_dir):
        directory.mkdir()
    for pid, exe in (("101", "/usr/lib/postgresql/17/bin/postgres (deleted)"), ("202", "/usr/bin/etcd")):
        (proc / pid).mkdir(parents=True)
        (proc / pid / "exe").symlink_to(exe)
    (tmp_path / "reboot-required").touch()
    script = tmp_path / "restart-metrics"
    script.write_text(
        p.upload("/usr/local/sbin/memoryctl-restart-metrics")
        .replace("/var/lib/prometheus/node-exporter", str(textfile))
        .replace("proc=/proc", f"proc={proc}")
        .replace("reboot_flag=/run/reboot-required", f"reboot_flag={tmp_path / 'reboot-required'}")
    )
    main_pids = 'case "$5" in etcd.service) echo 202 ;; patroni.service) echo 303 ;; *) echo 0 ;; esac'
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\n{main_pids}\n")
    (bin_dir / "pgrep").write_text("#!/bin/sh\necho 101\n")
    for tool in ("systemctl", "pgrep"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["sh", str(script)], check=True, env=env)
    out = (textfile / "restart.prom").read_text()
    samples = [line for line in out.splitlines() if not line.startswith("#")]
    assert samples == [
        'memoryctl_restart_pending{service="patroni"} 0',  # running, its /proc entry gone: not replaced
        'memoryctl_restart_pending{service="etcd"} 0',
        'memoryctl_restart_pending{service="postgresql"} 1',
        "memoryctl_reboot_required 1",
    ]
    lint = subprocess.run([promtool, "check", "metrics"], input=out, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
