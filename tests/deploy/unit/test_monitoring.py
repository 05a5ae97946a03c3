"""Monitoring plans from fact fixtures, and what they render checked by Prometheus' own tools."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.common import TEMPLATES
from deploy.components import Monitoring
from deploy.monitoring import MonitoringSettingsError, Receivers, monitoring, receivers
from tests.deploy.unit.test_backup import plan, present
from tests.deploy.unit.test_plans import _no_commands
from wireguard.keys import SecretDir

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
    elsewhere = {"monitoring": {"nodes": ["node2"]}}  # the exporter alone, not the Prometheus beside it
    fresh = plan(monitoring, "node1", components=elsewhere)
    assert "CREATE ROLE prometheus LOGIN IN ROLE pg_monitor" in fresh.op("role prometheus").commands[-1]
    args = fresh.upload("/etc/default/prometheus-postgres-exporter")
    assert "--web.listen-address=10.77.0.1:9187" in args and "host=/var/run/postgresql" in args
    facts = present(fresh, ["prometheus-node-exporter", "prometheus-postgres-exporter"], [])
    facts.update(
        DebPackages={"prometheus-node-exporter": {"1"}, "prometheus-postgres-exporter": {"1"}},
        Users={"postgres": {"home": "/var/lib/postgresql", "group": "postgres", "groups": [], "shell": "/bin/bash"}},
        PostgresRoles={"prometheus": {}, "memoryctl": {}},
    )
    _no_commands(plan(monitoring, "node1", facts, components=elsewhere))


def test_monitoring_node_no_op() -> None:
    fresh = plan(monitoring, "node2")
    services = ["prometheus-node-exporter", "prometheus", "prometheus-alertmanager"]
    facts = present(fresh, services, ["prometheus-node-exporter", "prometheus", "prometheus-alertmanager"])
    _no_commands(plan(monitoring, "node2", facts))
    assert plan(monitoring, "node2", components={"monitoring": {"enabled": False}}).ops == []
    # The gpu node runs exporters only: no Prometheus, no Alertmanager (it reboots and trains).
    assert not [op for op in plan(monitoring, "node3").ops if "prometheus.yml" in " ".join(op.uploads)]


def test_prometheus_scrapes_every_target_over_the_mesh(tmp_path: Path) -> None:
    p = plan(monitoring, "node2", components={"qdrant": {"source": {"url": "https://x/q.tgz", "sha256": "0" * 64}}})
    config = yaml.safe_load(p.upload("/etc/prometheus/prometheus.yml"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = {name: [t for sc in job["static_configs"] for t in sc["targets"]] for name, job in jobs.items()}
    assert targets["node"] == ["10.77.0.1:9100", "10.77.0.2:9100", "10.77.0.3:9100"]
    assert targets["postgres"] == ["10.77.0.1:9187"]
    assert targets["patroni"] == ["10.77.0.1:8008", "10.77.0.2:8008"]  # both members' Patroni /metrics
    assert sorted(targets["qdrant"]) == ["10.77.0.1:6333", "10.77.0.2:6333", "10.77.0.3:6333"]  # every peer
    assert jobs["qdrant"]["authorization"]["credentials_file"] == "/etc/prometheus/qdrant-api-key"
    # etcd's metrics listener on every member (plain HTTP on the mesh; the client port needs a certificate).
    assert targets["etcd"] == ["10.77.0.1:2381", "10.77.0.2:2381", "10.77.0.3:2381"]
    # Every vLLM instance of the gpu node: generate, the two embedding slots the night repoints, rerank.
    units = {sc["labels"]["unit"]: sc["targets"] for sc in jobs["vllm"]["static_configs"]}
    assert units == {
        "vllm@generate": ["10.77.0.3:8000"],
        "vllm@embed-a": ["10.77.0.3:8001"],
        "vllm@embed-b": ["10.77.0.3:8002"],
        "vllm@rerank": ["10.77.0.3:8003"],
    }
    assert "authorization" not in jobs["vllm"]  # vLLM's /metrics is not behind --api-key
    # The pair: every Prometheus sends to both Alertmanagers and scrapes both Prometheus and both
    # Alertmanagers; no replica label (the two Prometheus' alerts must be one alert to Alertmanager).
    (alertmanagers,) = config["alerting"]["alertmanagers"]
    assert alertmanagers["static_configs"][0]["targets"] == ["10.77.0.1:9093", "10.77.0.2:9093"]
    assert targets["prometheus"] == ["10.77.0.1:9090", "10.77.0.2:9090"]
    assert targets["alertmanager"] == ["10.77.0.1:9093", "10.77.0.2:9093"]
    assert config["global"]["external_labels"] == {"cluster": "local"}
    assert "--web.listen-address=10.77.0.2:9090" in p.upload("/etc/default/prometheus")
    # Alertmanager's gossip on the mesh address, the other node its peer.
    args = p.upload("/etc/default/prometheus-alertmanager")
    assert "--cluster.listen-address=10.77.0.2:9094 --cluster.peer=10.77.0.1:9094 " in args, args
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
    assert "49 rules found" in result.stdout


def _amtool_accepts(tmp_path: Path, name: str, text: str, secret_files: dict[str, str] | None = None) -> None:
    """``amtool check-config`` on a rendered alertmanager.yml, its secret files placed under ``tmp_path``."""
    amtool = _tool("amtool")
    for path, content in (secret_files or {}).items():
        local = tmp_path / path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(content)
        text = text.replace(path, str(local))
    config = tmp_path / f"{name}.yml"
    config.write_text(text)
    result = subprocess.run([amtool, "check-config", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_local_alertmanager_sends_to_the_controllers_sink_and_the_watchdog_to_the_heartbeat(tmp_path: Path) -> None:
    text = plan(monitoring, "node1").upload("/etc/prometheus/alertmanager.yml")
    local = yaml.safe_load(text)
    # The local nodes' receivers: the controller's stand-in keeps every notification, short intervals.
    assert local["receivers"] == [
        {
            "name": "operator",
            "webhook_configs": [{"url": "http://10.78.0.254:8090/alertsink/alerts", "send_resolved": True}],
        },
        {
            "name": "heartbeat",
            "webhook_configs": [{"url": "http://10.78.0.254:8090/alertsink/heartbeat", "send_resolved": False}],
        },
    ]
    route = local["route"]
    assert (route["receiver"], route["group_wait"], route["group_interval"]) == ("operator", "5s", "10s")
    # The Watchdog goes to the heartbeat only (no `continue`), repeated every heartbeat interval.
    (watchdog,) = route["routes"]
    assert watchdog["receiver"] == "heartbeat" and watchdog["matchers"] == ["alertname = Watchdog"]
    assert watchdog["continue"] is False and watchdog["repeat_interval"] == "15s"
    assert watchdog["group_interval"] == "10s"  # shorter than the repeat: else only every other tick sends
    _amtool_accepts(tmp_path, "local", text)
    # amtool's routing test: the Watchdog reaches the heartbeat alone, every other alert the operator.
    amtool = _tool("amtool")
    for labels, receiver in (
        ("alertname=Watchdog severity=none", "heartbeat"),
        ("alertname=QdrantDown node=node2", "operator"),
    ):
        routed = subprocess.run(
            [amtool, "config", "routes", "test", f"--config.file={tmp_path / 'local.yml'}", *labels.split()],
            capture_output=True,
            text=True,
        )
        assert routed.stdout.strip() == receiver, routed.stdout + routed.stderr


def test_a_receiver_without_settings_sends_nothing_on_the_local_nodes(tmp_path: Path) -> None:
    text = plan(monitoring, "node1", components={"monitoring": {"receiver": None, "heartbeat": None}}).upload(
        "/etc/prometheus/alertmanager.yml"
    )
    assert yaml.safe_load(text)["receivers"] == [{"name": "operator"}, {"name": "heartbeat"}]
    _amtool_accepts(tmp_path, "silent", text)


def _production(secrets_dir: Path, **monitoring_settings: Any) -> Receivers:
    """The receivers of a cluster that is not the local one, from ``monitoring_settings``."""
    return receivers(Monitoring(**monitoring_settings), "hetzner", SecretDir(secrets_dir))


def _store(secrets_dir: Path, **values: str) -> None:
    for name, value in values.items():
        (secrets_dir / "alertmanager").mkdir(parents=True, exist_ok=True)
        (secrets_dir / "alertmanager" / name).write_text(value + "\n")


HEARTBEAT = {"url_secret": "alertmanager/heartbeat_url"}


def test_a_production_cluster_without_a_receiver_or_a_heartbeat_stops_at_plan_time(secrets_dir: Path) -> None:
    _store(secrets_dir, heartbeat_url="https://hc-ping.example.org/abc")
    email = {"email_configs": [{"to": "a@example.org", "from": "b@example.org", "smarthost": "smtp.example.org:587"}]}
    for receiver in (None, {}, {"email_configs": []}):
        with pytest.raises(MonitoringSettingsError, match=r"components.monitoring.receiver: cluster 'hetzner' has no"):
            _production(secrets_dir, receiver=receiver, heartbeat=HEARTBEAT)
    with pytest.raises(MonitoringSettingsError, match=r"components.monitoring.heartbeat.url_secret: .* dead-man's"):
        _production(secrets_dir, receiver=email)
    routes = _production(secrets_dir, receiver=email, heartbeat=HEARTBEAT)
    assert routes.heartbeat == {"webhook_configs": [{"url": "https://hc-ping.example.org/abc", "send_resolved": False}]}
    # The local nodes may go without (the unit plans of other tests run with the local inventory).
    assert receivers(Monitoring(), "local", SecretDir(secrets_dir)) == Receivers({}, {}, {})


def test_receiver_secrets_come_from_the_secret_store_as_files(secrets_dir: Path, tmp_path: Path) -> None:
    _store(secrets_dir, smtp_password="pa55", webhook_token="t0ken", heartbeat_url="https://hc-ping.example.org/abc")
    settings = {
        "email_configs": [
            {"to": "a@example.org", "from": "b@example.org", "smarthost": "smtp.example.org:587",
             "auth_username": "b@example.org", "auth_password_secret": "alertmanager/smtp_password"}
        ],
        "webhook_configs": [
            {"url": "https://hooks.example.org/alerts",
             "http_config": {"authorization": {"credentials_secret": "alertmanager/webhook_token"}}}
        ],
    }  # fmt: skip
    routes = _production(secrets_dir, receiver=settings, heartbeat=HEARTBEAT)
    password, token = (
        "/etc/prometheus/alertmanager-secrets/alertmanager-smtp_password",
        "/etc/prometheus/alertmanager-secrets/alertmanager-webhook_token",
    )
    assert routes.operator["email_configs"][0]["auth_password_file"] == password
    assert routes.operator["webhook_configs"][0]["http_config"]["authorization"] == {"credentials_file": token}
    assert routes.files == {password: "pa55", token: "t0ken"}  # no trailing newline: it would be sent
    # Planned: the files 0640 root:prometheus, Alertmanager restarted when one changes, no secret in the config.
    monitoring_settings = {"receiver": settings, "heartbeat": HEARTBEAT}
    p = plan(monitoring, "node1", components={"monitoring": monitoring_settings})
    put = p.op(f"Receiver secret {password}")
    assert p.upload(password) == "pa55" and "chmod 640" in " ".join(put.commands)
    assert "chown root:prometheus" in " ".join(put.commands)
    text = p.upload("/etc/prometheus/alertmanager.yml")
    assert "pa55" not in text and "t0ken" not in text and "https://hc-ping.example.org/abc" in text
    _amtool_accepts(tmp_path, "production", text, routes.files)


@pytest.mark.parametrize(
    ("receiver", "message"),
    [
        ({"email_configs": [{"to": "REPLACE-WITH-THE-ONCALL-ADDRESS"}]},
         r"receiver.email_configs\[0\].to: 'REPLACE-WITH-THE-ONCALL-ADDRESS' is a placeholder"),
        ({"email_configs": [{"to": "a@example.org", "auth_password": "hunter2"}]},
         r"email_configs\[0\].auth_password: a secret does not belong in the inventory; .*auth_password_secret"),
        ({"webhook_configs": [{"url": "https://x", "http_config": {"authorization": {"credentials": "t"}}}]},
         r"http_config.authorization.credentials: a secret does not belong"),
        ({"email_configs": [{"to": "a@example.org", "auth_password_secret": "alertmanager/missing"}]},
         r"auth_password_secret: put the secret into .*alertmanager/missing \(mode 0600\)"),
        ({"email_configs": [{"to": "a@example.org", "auth_password_secret": "../../etc/shadow"}]},
         r"name a file inside the secret store"),
        ({"webhook_configs": [{"url": "https://x", "token_secret": "alertmanager/t"}]}, r"no secret form for 'token'"),
    ],
)  # fmt: skip
def test_a_receiver_setting_that_would_leak_or_not_send_is_named(
    secrets_dir: Path, receiver: dict[str, Any], message: str
) -> None:
    _store(secrets_dir, heartbeat_url="https://hc-ping.example.org/abc")
    with pytest.raises(MonitoringSettingsError, match=message):
        _production(secrets_dir, receiver=receiver, heartbeat=HEARTBEAT)


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


def test_wal_metrics_where_postgres_archives(tmp_path: Path) -> None:
    """The script against a pg_wal with two segments waiting (.ready) and one archived (.done); the
    queue's limit is pgBackRest's archive-push-queue-max; promtool parses the result."""
    promtool = _tool("promtool")
    crons = {
        node: plan(monitoring, node).upload("/etc/cron.d/memoryctl-metrics") for node in ("node1", "node2", "node3")
    }
    assert [node for node, cron in crons.items() if "root /usr/local/sbin/memoryctl-wal-metrics" in cron] == [
        "node1",
        "node2",  # the standby member: it archives once promoted
    ]
    script = plan(monitoring, "node1").upload("/usr/local/sbin/memoryctl-wal-metrics")
    wal, textfile = tmp_path / "pg_wal", tmp_path / "textfile"
    (wal / "archive_status").mkdir(parents=True)
    textfile.mkdir()
    for segment, status in (("000000010000000000000001", "done"), ("000000010000000000000002", "ready")):
        (wal / segment).write_bytes(b"w" * 4096)
        (wal / "archive_status" / f"{segment}.{status}").touch()
    (wal / "00000002.history").write_bytes(b"h" * 100)
    (wal / "archive_status" / "00000002.history.ready").touch()
    path = tmp_path / "wal-metrics"
    path.write_text(
        script.replace("/var/lib/postgresql/17/main/pg_wal", str(wal)).replace(
            "/var/lib/prometheus/node-exporter", str(textfile)
        )
    )
    subprocess.run(["sh", str(path)], check=True)
    out = (textfile / "memoryctl-wal.prom").read_text()
    assert "memoryctl_wal_archive_queue_bytes 4196\n" in out  # the .ready segment and history file
    assert f"memoryctl_wal_archive_queue_max_bytes {20 * 1024**3}\n" in out  # 20 % of the fixtures' 100 GiB
    assert "memoryctl_pg_wal_bytes " in out
    lint = subprocess.run([promtool, "check", "metrics"], input=out, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


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


def _gpu_script(tmp_path: Path, node: str = "node3") -> tuple[Any, Path, Path]:
    p = plan(monitoring, node)
    textfile, bin_dir = tmp_path / "textfile", tmp_path / "bin"
    textfile.mkdir()
    bin_dir.mkdir()
    script = tmp_path / "gpu-metrics"
    text = p.upload("/usr/local/sbin/memoryctl-gpu-metrics").replace("/var/lib/prometheus/node-exporter", str(textfile))
    script.write_text(text.replace("smi=/usr/local/sbin/memoryctl-nvidia-smi-standin", f"smi={bin_dir}/nvidia-smi"))
    return p, script, textfile


def test_gpu_metrics_from_nvidia_smis_query_and_the_kernels_xid_lines(tmp_path: Path) -> None:
    """The gpu node's collector against a stand-in ``nvidia-smi`` (two boards, one that does not report
    its temperature) and a stand-in ``journalctl`` (two Xid lines since boot)."""
    promtool = _tool("promtool")
    p, script, textfile = _gpu_script(tmp_path)
    assert "* * * * * root /usr/local/sbin/memoryctl-gpu-metrics" in p.upload("/etc/cron.d/memoryctl-metrics")
    bin_dir = tmp_path / "bin"
    rows = "0, GPU-aa, NVIDIA RTX 4000 SFF Ada Generation, 17000, 20475, 93, 71\\n1, GPU-bb, Board, 0, 1024, 0, [N/A]"
    (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\nprintf "{rows}\\n"\n')
    xid = "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."
    (bin_dir / "journalctl").write_text(f"#!/bin/sh\necho '{xid}'\necho '{xid}'\n")
    for tool in ("nvidia-smi", "journalctl"):
        (bin_dir / tool).chmod(0o755)
    subprocess.run(["sh", str(script)], check=True, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    out = (textfile / "gpu.prom").read_text()
    samples = [line for line in out.splitlines() if not line.startswith("#")]
    board = 'gpu="0",uuid="GPU-aa",name="NVIDIA RTX 4000 SFF Ada Generation"'
    other = 'gpu="1",uuid="GPU-bb",name="Board"'
    assert samples == [
        "memoryctl_gpu_up 1",
        f"memoryctl_gpu_memory_used_bytes{{{board}}} {17000 * 1048576}",
        f"memoryctl_gpu_memory_total_bytes{{{board}}} {20475 * 1048576}",
        f"memoryctl_gpu_utilization_ratio{{{board}}} 0.93",
        f"memoryctl_gpu_temperature_celsius{{{board}}} 71",
        f"memoryctl_gpu_memory_used_bytes{{{other}}} 0",
        f"memoryctl_gpu_memory_total_bytes{{{other}}} {1024 * 1048576}",
        f"memoryctl_gpu_utilization_ratio{{{other}}} 0",
        f"memoryctl_gpu_temperature_celsius{{{other}}} NaN",
        "memoryctl_gpu_xid_errors 2",
    ]
    lint = subprocess.run([promtool, "check", "metrics"], input=out, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_gpu_metrics_say_down_when_nvidia_smi_does_not_answer(tmp_path: Path) -> None:
    _, script, textfile = _gpu_script(tmp_path)
    bin_dir = tmp_path / "bin"
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed: driver not loaded' >&2\nexit 9\n")
    (bin_dir / "journalctl").write_text("#!/bin/sh\nexit 1\n")  # no journal: no Xid lines, not a failure
    for tool in ("nvidia-smi", "journalctl"):
        (bin_dir / tool).chmod(0o755)
    subprocess.run(["sh", str(script)], check=True, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    samples = [line for line in (textfile / "gpu.prom").read_text().splitlines() if not line.startswith("#")]
    assert samples == ["memoryctl_gpu_up 0", "memoryctl_gpu_xid_errors 0"]


def test_the_nvidia_smi_standin_answers_the_collectors_query_in_its_format(tmp_path: Path) -> None:
    """Where there is no GPU the collector runs against a named stand-in of nvidia-smi's query
    interface: one row of seven fields, the node's memory as its total, refusing other queries."""
    p = plan(monitoring, "node3")
    standin = tmp_path / "nvidia-smi-standin"
    standin.write_text(p.upload("/usr/local/sbin/memoryctl-nvidia-smi-standin"))
    query = "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu,temperature.gpu"
    row = subprocess.run(
        ["python3", str(standin), query, "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True
    ).stdout.strip()
    fields = row.split(", ")
    assert fields[:3] == ["0", "GPU-STANDIN", "STAND-IN (no GPU)"] and len(fields) == 7, row
    meminfo_kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
    assert int(fields[4]) == meminfo_kib // 1024 and int(fields[3]) >= 0
    refused = subprocess.run(["python3", str(standin), "--query-gpu=power.draw"], capture_output=True, text=True)
    assert refused.returncode == 2 and "unsupported query" in refused.stderr
    assert "/usr/local/sbin/memoryctl-nvidia-smi-standin" in p.upload("/usr/local/sbin/memoryctl-gpu-metrics")


@pytest.mark.parametrize(("text", "seconds"), [("15s", 15.0), ("1m", 60.0), ("1h30m", 5400.0), ("500ms", 0.5)])
def test_the_inventorys_durations_are_read_as_prometheus_writes_them(text: str, seconds: float) -> None:
    from deploy.monitoring import duration_s

    assert duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "1 m", "60", "1m30", "1y"])
def test_a_duration_prometheus_would_refuse_is_refused_at_plan_time(text: str) -> None:
    from deploy.monitoring import duration_s

    with pytest.raises(ValueError, match="is not a duration"):
        duration_s(text)


def test_a_single_monitoring_node_runs_one_alertmanager_without_gossip() -> None:
    """``nodes: [one]`` (a small install): one Prometheus, one Alertmanager, no gossip port anywhere."""
    from deploy.firewall import firewall

    alone = {"monitoring": {"nodes": ["node3"]}}
    p = plan(monitoring, "node3", components=alone)
    config = yaml.safe_load(p.upload("/etc/prometheus/prometheus.yml"))
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["10.77.0.3:9093"]
    assert "--cluster.listen-address= " in p.upload("/etc/default/prometheus-alertmanager")
    assert "9094" not in plan(firewall, "node3", components=alone).upload("/etc/nftables.conf")
    assert not [op for op in plan(monitoring, "node1", components=alone).ops if "prometheus.yml" in str(op.uploads)]


def test_the_old_single_node_setting_is_refused_with_the_new_spelling() -> None:
    from deploy.components import InventoryError, parse

    with pytest.raises(InventoryError, match=r"components.monitoring.node: no such setting \(did you mean nodes\?"):
        parse({"monitoring": {"node": "node3"}}, "inventory/old.yaml")
    with pytest.raises(InventoryError, match=r"components.monitoring.nodes: List should have at least 1 item"):
        parse({"monitoring": {"nodes": []}}, "inventory/old.yaml")


def test_monitoring_nodes_default_to_two_nodes_off_the_gpu_node() -> None:
    from deploy.opsnode import OpsNodeError, monitoring_nodes
    from deploy.settings import load_inventory

    cluster = load_inventory(HERE.parents[2] / "inventory" / "local.yaml")
    assert monitoring_nodes(cluster, None) == ["node1", "node2"]  # node3 is the gpu node
    assert monitoring_nodes(cluster, ["node2", "node3"]) == ["node2", "node3"]
    with pytest.raises(OpsNodeError, match=r"\['node9'\] not nodes of the inventory"):
        monitoring_nodes(cluster, ["node1", "node9"])
    with pytest.raises(OpsNodeError, match="names a node twice"):
        monitoring_nodes(cluster, ["node1", "node1"])


def _alerts() -> dict[str, dict[str, Any]]:
    rules = yaml.safe_load((TEMPLATES / "prometheus" / "memoryctl.rules.yml").read_text())
    return {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule}


def test_every_alert_links_its_runbook_section_of_docs_monitoring() -> None:
    """Each rule's runbook_url is the docs base + ``#alert-<name>``, an anchor docs/monitoring.md has;
    the deploy writes the inventory's base in its place."""
    from deploy.components import RUNBOOK_BASE

    docs = (HERE.parents[2] / "docs" / "monitoring.md").read_text()
    alerts = _alerts()
    assert len(alerts) > 40
    for name, rule in alerts.items():
        assert rule["annotations"]["runbook_url"] == f"{RUNBOOK_BASE}#alert-{name.lower()}", name
        assert f'<a id="alert-{name.lower()}"></a>' in docs, f"docs/monitoring.md has no section anchor for {name}"
    base = "https://git.example.org/ops/memoryctl/src/branch/main/docs/monitoring.md"
    p = plan(monitoring, "node1", components={"monitoring": {"runbook_base": base}})
    uploaded = yaml.safe_load(p.upload("/etc/prometheus/rules/memoryctl.yml"))
    urls = {r["alert"]: r["annotations"]["runbook_url"] for g in uploaded["groups"] for r in g["rules"] if "alert" in r}
    assert urls == {name: f"{base}#alert-{name.lower()}" for name in alerts}
