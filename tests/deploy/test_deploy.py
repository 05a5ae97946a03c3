"""The deployed cluster, verified on the three local nodes over SSH (pytest-testinfra).

Every service of the stack runs for real here (vLLM as its named stand-in) on Debian 13: the base
role, the WireGuard mesh, the firewall, PostgreSQL 17 + TimescaleDB from the stand-in's signed apt
repository, a three-peer Qdrant cluster from the release archive, Neo4j 5.26 from the archive
assembled from Maven Central, the vLLM stand-in with real embeddings, memoryctl with its cron jobs.
What the nodes run is read back and compared with the data the deploy holds (deploy/osrelease.py):
the release, PostgreSQL's major, pgBackRest on both ends, Python, glibc against Qdrant's binary.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import tomllib
from concurrent.futures import ThreadPoolExecutor

import pytest

from deploy.osrelease import DEFAULT, RELEASES
from deploy.versions import QDRANT, TIMESCALEDB
from tests.deploy.cluster import MESH, NODES, REPO, SSH_KEY, SSH_OPTIONS, memoryctl, node, peer_api, put
from tests.deploy.conftest import Deployed
from wireguard.facts import WireguardInterface

pytestmark = pytest.mark.deploy
RELEASE = RELEASES[DEFAULT]

# What listens where: every service on the node's mesh address (PostgreSQL also on loopback for
# local administration), SSH on every address; nothing else anywhere.
SERVICES = {
    # PostgreSQL; Qdrant peer; memoryctl serve (HTTP); day two: pgBackRest TLS, node and postgres
    # exporters; one of the monitoring pair: Prometheus, Alertmanager and its gossip
    "node1": {5432, 6333, 6334, 6335, 8765, 8432, 9090, 9093, 9094, 9100, 9187},
    # Qdrant peer; Neo4j http, bolt; node exporter; the other of the monitoring pair
    "node2": {6333, 6334, 6335, 7474, 7687, 9090, 9093, 9094, 9100},
    # Qdrant peer; vLLM stand-in generate, embedding slots a and b, rerank; the backup node:
    # pgBackRest TLS, rsync (Qdrant snapshots); node exporter
    "node3": {6333, 6334, 6335, 8000, 8001, 8002, 8003, 8432, 873, 9100},
}
# Alertmanager's gossip: admitted from the other monitoring node's mesh address only (not the mesh).
GOSSIP = {"node1": "node2", "node2": "node1"}


def _listening(name: str) -> set[tuple[str, int]]:
    """(address, port) pairs from ``ss -ltnH`` on a node."""
    pairs = set()
    for line in node(name).check_output("ss -ltnH").splitlines():
        local = line.split()[3]
        address, _, port = local.rpartition(":")
        pairs.add((address.strip("[]").removeprefix("::ffff:"), int(port)))
    return pairs


_PROBE = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def probe(target):
    try:
        socket.create_connection((target[0], target[1]), timeout=2).close()
        return True
    except OSError:
        return False
targets = json.loads(sys.argv[1])
with ThreadPoolExecutor(max_workers=len(targets)) as pool:
    print(json.dumps(list(pool.map(probe, targets))))
"""


def _reachable_from(name: str, targets: list[tuple[str, int]]) -> dict[tuple[str, int], bool]:
    """Whether ``name`` can open a TCP connection to each (address, port), probed concurrently there."""
    out = node(name).check_output(f"python3 -c {shlex.quote(_PROBE)} {shlex.quote(json.dumps(targets))}")
    return dict(zip(targets, json.loads(out), strict=True))


def _reachable(address: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def test_second_deploy_changes_nothing(deployed: Deployed) -> None:
    second = deployed.second
    assert second.returncode == 0 and second.errors == 0
    assert second.operations > 0, "could not read pyinfra's results table"
    assert second.changed == 0, f"second run changed: {second.changed_operations()}"
    assert second.unchanged == second.operations


# -- base role ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(NODES))
def test_admin_user_logs_in_with_its_key_and_sudoes(deployed: Deployed, name: str) -> None:
    host = node(name)
    ops = host.user("ops")
    assert ops.exists and "sudo" in ops.groups and ops.shell == "/bin/bash"
    controller_key = (SSH_KEY.with_suffix(".pub")).read_text().split()[1]
    assert controller_key in host.file("/home/ops/.ssh/authorized_keys").content_string
    assert host.run("visudo -c").rc == 0
    # A real login as the admin user with the controller's key, then password-less sudo.
    login = subprocess.run(
        ["ssh", "-i", str(SSH_KEY), *SSH_OPTIONS.split(), "-o", "BatchMode=yes", f"ops@{NODES[name]}", "sudo -n id -u"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert login.returncode == 0 and login.stdout.strip() == "0", login.stderr


@pytest.mark.parametrize("name", list(NODES))
def test_sshd_is_hardened_and_offers_keys_only(deployed: Deployed, name: str) -> None:
    effective = dict(line.split(" ", 1) for line in node(name).check_output("sshd -T").splitlines() if " " in line)
    assert effective["passwordauthentication"] == "no"
    assert effective["kbdinteractiveauthentication"] == "no"
    assert effective["permitrootlogin"] == "without-password"  # sshd -T's name for prohibit-password
    assert effective["x11forwarding"] == "no" and effective["allowagentforwarding"] == "no"
    assert effective["maxauthtries"] == "3"
    # What the server offers a client that has no key: public keys, nothing else.
    probe = subprocess.run(
        [
            "ssh",
            *SSH_OPTIONS.split(),
            "-o",
            "BatchMode=yes",
            "-o",
            "PreferredAuthentications=none",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "IdentityFile=/dev/null",
            f"nobody@{NODES[name]}",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode != 0
    assert re.search(r"Permission denied \(publickey\)", probe.stderr), probe.stderr


@pytest.mark.parametrize("name", list(NODES))
def test_unattended_security_upgrades_are_on(deployed: Deployed, name: str) -> None:
    host = node(name)
    periodic = host.check_output("apt-config dump APT::Periodic")
    assert 'APT::Periodic::Unattended-Upgrade "1";' in periodic
    assert 'APT::Periodic::Update-Package-Lists "1";' in periodic
    upgrades = host.check_output("apt-config dump Unattended-Upgrade")
    assert 'Unattended-Upgrade::Automatic-Reboot "false";' in upgrades
    pattern = "Unattended-Upgrade::Origins-Pattern:: "
    origins = [line.removeprefix(pattern) for line in upgrades.splitlines() if line.startswith(pattern)]
    assert origins == ['"origin=Debian,codename=${distro_codename}-security,label=Debian-Security";']
    held = "Unattended-Upgrade::Package-Blacklist:: "
    blacklist = {line.removeprefix(held) for line in upgrades.splitlines() if line.startswith(held)}
    assert {'"patroni$";', '"etcd-server$";', '"postgresql-";', '"timescaledb-";'} <= blacklist  # docs/ha.md


def test_unattended_upgrade_runs_with_security_origins_only(deployed: Deployed) -> None:
    """unattended-upgrade itself (a dry run, ~20 s, on one node: the config is the same on all)."""
    dry = node("node1").run("unattended-upgrade --dry-run --debug 2>&1 | head -n 40")
    assert dry.rc == 0
    allowed = next(line for line in dry.stdout.splitlines() if line.startswith("Allowed origins are:"))
    assert allowed == f"Allowed origins are: origin=Debian,codename={RELEASE.codename}-security,label=Debian-Security"


# -- mesh and firewall ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(NODES))
def test_mesh_peers_and_handshakes(deployed: Deployed, name: str) -> None:
    host = node(name)
    fact = WireguardInterface()
    status = fact.process(host.check_output(fact.command("wg0")).splitlines())
    assert status is not None
    peers = status["peers"]
    assert len(peers) == len(NODES) - 1
    assert {p["allowed_ips"][0] for p in peers} == {f"{MESH[n]}/32" for n in NODES if n != name}
    # Ping first: a peer that has not spoken since the deploy may not have handshaken yet.
    for other in NODES:
        if other != name:
            assert host.run(f"ping -c 2 -W 2 {MESH[other]}").rc == 0, f"{name} cannot reach {other} over the mesh"
    status = fact.process(host.check_output(fact.command("wg0")).splitlines())
    assert status is not None
    assert all(p["up"] for p in status["peers"]), status["peers"]


@pytest.mark.parametrize("name", list(NODES))
def test_every_service_listens_on_the_mesh_only(deployed: Deployed, name: str) -> None:
    listening = _listening(name)
    ssh = {("0.0.0.0", 22), ("::", 22)}
    loopback = {("127.0.0.1", 5432)} if name == "node1" else set()
    assert listening == ssh | loopback | {(MESH[name], port) for port in SERVICES[name]}


@pytest.mark.parametrize("name", list(NODES))
def test_services_reachable_over_the_mesh_not_the_public_side(deployed: Deployed, name: str) -> None:
    other = next(n for n in NODES if n != name)
    ports = sorted(SERVICES[name])
    # Every (address, port) probed at once from the other node (one Python there, a thread per
    # probe) and from the controller: a dropped packet costs its 2 s timeout once, not per port.
    from_other = _reachable_from(other, [(address, port) for address in (MESH[name], NODES[name]) for port in ports])
    with ThreadPoolExecutor(max_workers=len(ports)) as pool:
        from_controller = dict(zip(ports, pool.map(lambda port: _reachable(NODES[name], port), ports), strict=True))
    for port in ports:
        assert from_other[(MESH[name], port)], f"{other} -> {name}:{port} over the mesh"
        assert not from_other[(NODES[name], port)], f"{other} -> {name}:{port} public side"
        assert not from_controller[port], f"controller -> {name}:{port}"


@pytest.mark.parametrize("name", list(NODES))
def test_firewall_public_side_ssh_and_wireguard_only(deployed: Deployed, name: str) -> None:
    host = node(name)
    assert host.service("nftables").is_enabled
    ruleset = host.check_output("nft list chain inet memoryctl input")
    assert "policy drop" in ruleset
    assert 'tcp dport 22 accept comment "ssh"' in ruleset
    # WireGuard only from the other nodes' public addresses (issue 40): one line, the peers named.
    (wireguard,) = [line for line in ruleset.splitlines() if 'comment "wireguard from the peers"' in line]
    assert "ip saddr" in wireguard and "udp dport 51820 accept" in wireguard
    assert all(NODES[peer] in wireguard for peer in NODES if peer != name) and NODES[name] not in wireguard
    services = [line for line in ruleset.splitlines() if "services over the mesh" in line]
    assert len(services) == 1 and 'iifname "wg0"' in services[0] and "10.77.0.0/24" in services[0]
    opened = {int(p) for p in re.findall(r"\d+", services[0].split("dport", 1)[1].split("accept")[0])}
    assert opened == SERVICES[name] - ({9094} if name in GOSSIP else set())
    gossip = [line for line in ruleset.splitlines() if "alertmanager gossip" in line]
    if name in GOSSIP:
        (line,) = gossip
        assert f"ip saddr {MESH[GOSSIP[name]]} " in line and "th dport 9094 accept" in line, line
        # the node that is not its peer is refused (the gossip port is the pair's alone)
        assert not _reachable_from("node3", [(MESH[name], 9094)])[(MESH[name], 9094)]
    else:
        assert gossip == []
    assert _reachable(NODES[name], 22)


# -- the services ---------------------------------------------------------------------------------


def test_postgres_runs_with_timescaledb_preloaded_and_created(deployed: Deployed) -> None:
    host = node("node1")
    assert host.service(f"postgresql@{RELEASE.postgres}-main").is_running
    package = host.package(f"timescaledb-2-postgresql-{RELEASE.postgres}")
    assert package.is_installed and package.version == f"{TIMESCALEDB}~source1"
    # Installed from the stand-in repository (its lists are there), not from a file.
    policy = host.check_output(f"apt-cache policy timescaledb-2-postgresql-{RELEASE.postgres}")
    assert "http://10.78.0.254:8090/packagecloud.io/timescale/timescaledb/debian trixie/main" in policy, policy
    psql = "sudo -u postgres psql -XAtd memoryctl -c"
    assert host.check_output(f"{psql} 'SHOW shared_preload_libraries'") == "timescaledb"
    extension = "SELECT extversion FROM pg_extension WHERE extname = 'timescaledb'"
    assert host.check_output(f'{psql} "{extension}"') == TIMESCALEDB


@pytest.mark.parametrize("name", list(NODES))
def test_the_nodes_run_the_release_the_deploy_holds_data_for(deployed: Deployed, name: str) -> None:
    """What deploy/osrelease.py says of Debian 13, read back from the node."""
    host = node(name)
    release = dict(line.split("=", 1) for line in host.check_output("cat /etc/os-release").splitlines() if "=" in line)
    assert (release["VERSION_ID"].strip('"'), release["VERSION_CODENAME"]) == (str(RELEASE.major), RELEASE.codename)
    assert host.check_output("python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'") == RELEASE.python
    assert host.check_output("getconf GNU_LIBC_VERSION") == f"glibc {RELEASE.glibc_text()}"


def test_the_apt_key_is_the_one_the_inventory_names(deployed: Deployed) -> None:
    """The keyring holds exactly the stand-in's key, whose fingerprint the controller published."""
    wanted = (REPO / ".cache" / "standin" / "apt-key.fingerprints").read_text().split()
    shown = node("node1").check_output("gpg --show-keys --with-colons /etc/apt/keyrings/timescaledb.gpg")
    assert [line.split(":")[9] for line in shown.splitlines() if line.startswith("fpr:")][:1] == wanted
    assert shown.count("\npub:") + shown.startswith("pub:") == 1


def test_pgbackrest_is_the_same_version_from_the_same_source_on_both_ends(deployed: Deployed) -> None:
    versions = {}
    for name in ("node1", "node3"):  # the database and the repository node
        host = node(name)
        versions[name] = host.check_output("pgbackrest version")
        assert host.package("pgbackrest").version == RELEASE.pgbackrest
        policy = host.check_output("apt-cache policy pgbackrest")
        assert f"*** {RELEASE.pgbackrest} 1001" in policy, policy  # held by the pin
        assert "deb.debian.org/debian trixie/main" in policy
    assert versions["node1"] == versions["node3"] == f"pgBackRest {RELEASE.pgbackrest.split('-')[0]}"


@pytest.mark.parametrize("name", list(NODES))
def test_qdrants_glibc_floor_is_within_the_nodes(deployed: Deployed, name: str) -> None:
    """Read from the installed binary's symbol versions, against the node's own glibc."""
    host = node(name)
    binary = f"/opt/qdrant/{QDRANT}/qdrant"
    floor = host.check_output(f"grep -aoE 'GLIBC_[0-9]+[.][0-9]+' {binary} | cut -d_ -f2 | sort -uV | tail -n1")
    have = host.check_output("getconf GNU_LIBC_VERSION").split()[1]
    assert floor, "the artefact is a -gnu build: it names glibc symbol versions"
    assert tuple(map(int, floor.split("."))) <= tuple(map(int, have.split("."))), (floor, have)
    assert host.run(f"{binary} --version").rc == 0


def test_qdrant_peers_form_one_cluster_over_the_mesh(deployed: Deployed) -> None:
    views = {name: peer_api(name, "/cluster") for name in NODES}
    for name, view in views.items():
        assert view["status"] == "enabled"
        assert node(name).check_output("/opt/qdrant/1.19.0/qdrant --version").endswith("1.19.0")
        uris = sorted(peer["uri"] for peer in view["peers"].values())
        assert uris == sorted(f"http://{MESH[n]}:6335/" for n in NODES), uris
        assert view["consensus_thread_status"]["consensus_thread_status"] == "working"
    assert len({view["raft_info"]["leader"] for view in views.values()}) == 1, "the peers disagree on the leader"


def test_neo4j_runs_from_the_archive_with_the_deployed_password(deployed: Deployed) -> None:
    host = node("node2")
    assert host.service("neo4j").is_running
    assert host.file("/usr/share/neo4j").linked_to == "/opt/neo4j/5.26.30"
    assert host.file("/opt/neo4j/5.26.30/lib/neo4j-5.26.30.jar").is_file
    assert RELEASE.java.split("-jre")[0].replace("openjdk-", 'version "') in host.check_output("java -version 2>&1")
    # The server JVM is Neo4j's own entry point, configured by /etc/neo4j/neo4j.conf.
    assert "org.neo4j.server.CommunityEntryPoint" in host.check_output("ps -eo args")
    assert (
        host.run(
            "sudo -u neo4j NEO4J_CONF=/etc/neo4j NEO4J_HOME=/usr/share/neo4j /usr/share/neo4j/bin/neo4j-admin --version"
        ).rc
        == 0
    )


def test_vllm_standin_serves_real_embeddings_behind_its_key(deployed: Deployed) -> None:
    """The embedding slots (deploy/embedding_slots.py) both serve the base model, MiniLM through the
    stand-in, under the name of the directory their link points at: the db node's embedder is slot a."""
    host = node("node3")
    for instance in ("generate", "embed-a", "embed-b"):
        assert host.service(f"vllm@{instance}").is_running
    assert "vLLM STAND-IN" in host.check_output("journalctl -u vllm@embed-a --no-pager -n 50")
    for slot in ("embed-a", "embed-b"):
        linked = host.check_output(f"readlink /var/lib/memoryctl-embedding/{slot}.model").strip()
        assert linked == "/var/lib/memoryctl-embedding/models/all-MiniLM-L6-v2", linked
    config = tomllib.loads(node("node1").check_output("cat /etc/memoryctl/memoryctl.toml"))
    texts = ["the mesh is up", "the mesh network is running", "bake the bread at noon"]
    script = (
        "import json, sys, urllib.request\n"
        f"body = json.dumps({{'model': sys.argv[2], 'input': {texts!r}}}).encode()\n"
        "headers = {'Content-Type': 'application/json', 'Authorization': 'Bearer ' + sys.argv[3]}\n"
        "answer = urllib.request.urlopen(urllib.request.Request(sys.argv[1], body, headers), timeout=60)\n"
        "print(answer.read().decode())\n"
    )
    embedder = config["embedder"]
    assert embedder["model"] == "all-MiniLM-L6-v2"
    answers = {}
    for url in (embedder["url"], f"http://{MESH['node3']}:8002"):
        args = [f"{url}/v1/embeddings", embedder["model"], embedder["api_key"]]
        answers[url] = json.loads(node("node1").check_output(shlex.join(["python3", "-c", script, *args])))
    vectors = [item["embedding"] for item in answers[embedder["url"]]["data"]]
    assert [len(v) for v in vectors] == [384, 384, 384]

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    close, apart = cosine(vectors[0], vectors[1]), cosine(vectors[0], vectors[2])
    assert close > apart + 0.3, f"a paraphrase should embed closer than an unrelated sentence: {close:.3f} {apart:.3f}"
    other = [item["embedding"] for item in answers[f"http://{MESH['node3']}:8002"]["data"]]
    assert max(abs(x - y) for a, b in zip(vectors, other, strict=True) for x, y in zip(a, b, strict=True)) < 1e-5
    unauthorised = node("node1").run(shlex.join(["python3", "-c", script, args[0], args[1], "wrong"]))
    assert unauthorised.rc != 0 and "401" in unauthorised.stderr


def test_memoryctl_installed_configured_and_scheduled(deployed: Deployed) -> None:
    host = node("node1")
    assert host.file("/opt/memoryctl/venv/bin/memoryctl").is_file
    config = host.file("/etc/memoryctl/memoryctl.toml")
    assert (config.user, config.group, config.mode) == ("root", "memoryctl", 0o640)
    settings = tomllib.loads(host.check_output("cat /etc/memoryctl/memoryctl.toml"))
    assert settings["profile"] == "cluster"
    assert settings["postgres"]["dsn"] == f"postgresql://memoryctl@{MESH['node1']}:5432/memoryctl"
    assert settings["qdrant"]["url"] == f"http://{MESH['node1']}:6333"  # the db node's own peer
    assert (settings["qdrant"]["shard_number"], settings["qdrant"]["replication_factor"]) == (3, 2)
    assert settings["neo4j"]["uri"] == f"bolt://{MESH['node2']}:7687"
    assert settings["embedder"]["url"] == f"http://{MESH['node3']}:8001"
    assert settings["vllm"]["url"] == f"http://{MESH['node3']}:8000"
    assert settings["query"]["rerank_url"] == f"http://{MESH['node3']}:8003"
    assert settings["query"]["rerank_model_dir"] == "/var/lib/memoryctl-models" and settings["query"]["rerank"] is False
    cron = host.file("/etc/cron.d/memoryctl").content_string
    assert "MEMORYCTL_TRIGGER=cron" in cron.splitlines()
    schedules = {"sync": "*/5 * * * *", "reconcile": "*/10 * * * *"}
    for job, schedule in schedules.items():
        line = next(line for line in cron.splitlines() if f"/bin/memoryctl {job}" in line)
        assert line.startswith(f"{schedule} memoryctl flock -n /run/lock/memoryctl-{job}.lock ")
        assert line.endswith(f">> /var/log/memoryctl/{job}.log 2>&1")
    # The night runs from the gpu node's cron (deploy/nightly.py), with the same locking and log.
    assert "/bin/memoryctl nightly" not in cron
    night = node("node3").file("/etc/cron.d/memoryctl").content_string
    line = next(line for line in night.splitlines() if "/bin/memoryctl nightly" in line)
    assert line.startswith("15 2 * * * memoryctl flock -n /run/lock/memoryctl-nightly.lock ")
    assert line.endswith(">> /var/log/memoryctl/nightly.log 2>&1")
    assert host.service("cron").is_running
    assert host.run("logrotate --debug /etc/logrotate.d/memoryctl").rc == 0
    assert memoryctl("--help").returncode == 0


# -- secrets --------------------------------------------------------------------------------------


def generated_secrets() -> dict[str, str]:
    """Every secret the deploy generated on the controller (``{file: value}``): passwords, API
    keys, WireGuard private keys, the repository passphrase, and each line of the TLS private keys'
    bodies; certificates are public and left out."""
    root = REPO / ".cache" / "secrets" / "local"
    found: dict[str, str] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix != ".crt"):
        text = path.read_text().strip()
        name = str(path.relative_to(root))
        if "PRIVATE KEY-----" in text:
            for number, line in enumerate(text.splitlines()):
                if not line.startswith("-----") and len(line) >= 32:
                    found[f"{name} (line {number})"] = line
        else:
            found[name] = text
    return found


@pytest.mark.parametrize("name", list(NODES))
def test_no_generated_secret_in_the_nodes_journal_or_logs(deployed: Deployed, name: str) -> None:
    """After the deploys, grep the node's whole journal (every field: sudo logs the command lines
    it runs) and every file under /var/log (auth.log where rsyslog writes one, PostgreSQL's and
    pgBackRest's logs) for every secret the deploy generated."""
    secrets = generated_secrets()
    assert {"postgres/memoryctl", "neo4j/password", "qdrant/api_key", "pgbackrest/cipher_pass"} <= set(secrets)
    assert any(key.startswith("wireguard/") for key in secrets)
    remote = "/root/.memoryctl-secrets-to-find"
    put(name, "".join(f"{value}\n" for value in secrets.values()), remote)
    try:
        files = "find /var/log -type f ! -path '/var/log/journal/*' -exec cat {} +"
        logs = f"{{ journalctl --no-pager -q -o verbose; {files}; }}"
        found = node(name).run(f"{logs} 2>/dev/null | grep -aoF -f {remote} | sort -u")
        size = node(name).check_output(f"{logs} 2>/dev/null | wc -c")
    finally:
        node(name).run(f"rm -f {remote}")
    leaked = [key for key, value in secrets.items() if value in found.stdout.splitlines()]
    assert int(size) > 10_000, "the journal is empty: the grep proves nothing"
    assert leaked == [], f"{name}: generated secrets in its logs: {leaked}"
