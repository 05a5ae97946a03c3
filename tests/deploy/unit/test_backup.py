"""Backup plans (pgBackRest both sides, the Qdrant snapshot drop box) from fact fixtures, in pairs."""

from __future__ import annotations

import hashlib
import ipaddress
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from deploy.backup import GIB, BackupSettingsError, PgbackrestStanza, backup, parse_size
from deploy.common import has_role
from deploy.facts import FilesystemSize
from deploy.memoryctl import memoryctl
from deploy.opsnode import OpsNodeError, ops_node
from deploy.osrelease import RELEASES
from deploy.pki import CertificateAuthority
from deploy.postgres import postgresql
from deploy.settings import REPO, InventoryError, load_inventory
from tests.deploy.unit.plans import Plan, cluster_order
from tests.deploy.unit.plans import plan as plan_of
from tests.deploy.unit.test_plans import _no_commands, _present
from wireguard.keys import SecretDir

PGBACKREST = f"pgbackrest={RELEASES[13].pgbackrest}"

BACKED_UP = {"status": 0, "backups": 1}
DAY_TWO = {"backup": {"enabled": True}, "monitoring": {"enabled": True}}


def plan(
    deploy_fn: Callable[[], None],
    node: str,
    facts: dict[str, Any] | None = None,
    components: dict[str, Any] | None = None,
) -> Plan:
    """The local inventory with backups and monitoring on (whatever local.yaml says today)."""
    merged = {
        name: {**DAY_TWO.get(name, {}), **(components or {}).get(name, {})} for name in {*DAY_TWO, *(components or {})}
    }
    return plan_of(deploy_fn, node, facts, merged)


def _ini(text: str) -> dict[str, dict[str, str]]:
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
        elif "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            current[key] = value
    return sections


def test_database_side_archives_wal_to_the_repository_node_over_tls() -> None:
    fresh = plan(backup, "node1")
    conf = _ini(fresh.upload("/etc/pgbackrest.conf"))
    assert conf["global"]["repo1-host"] == "10.77.0.3" and conf["global"]["repo1-host-type"] == "tls"
    assert conf["global"]["tls-server-address"] == "10.77.0.1"
    assert conf["global"]["tls-server-auth"] == "node3=memoryctl"  # only the repository node may back up
    assert "repo1-cipher-pass" not in conf["global"]  # the key stays on the repository side
    assert conf["memoryctl"]["pg1-path"] == "/var/lib/postgresql/17/main"
    archiving = fresh.upload("/etc/postgresql/17/main/conf.d/pgbackrest.conf")
    assert "archive_mode = on" in archiving
    assert "archive_command = 'pgbackrest --stanza=memoryctl archive-push %p'" in archiving
    assert fresh.op("Restart PostgreSQL (WAL archiving changed)").conditional
    rule = fresh.upload("/etc/sudoers.d/memoryctl-pgbackrest")
    assert "memoryctl ALL=(postgres) NOPASSWD: /usr/bin/pgbackrest --stanza=memoryctl --output=json info" in rule
    cron = fresh.upload("/etc/cron.d/memoryctl-backup")
    assert "memoryctl flock -n /run/lock/memoryctl-backup-qdrant.lock /usr/local/bin/memoryctl backup qdrant" in cron
    assert "stanza-create" not in " ".join(fresh.names())  # the repository side creates it


def test_the_archive_queue_is_bounded_by_a_share_of_the_wal_disk() -> None:
    """20 % of the filesystem under pg_wal (a 100 GiB disk in the fixtures), whole GiB, at least 1 GiB,
    on every node that archives (the standby member too: it archives once promoted); or as stated."""
    for node in ("node1", "node2"):
        conf = _ini(plan(backup, node).upload("/etc/pgbackrest.conf"))
        assert conf["global"]["archive-async"] == "y"
        assert conf["global"]["archive-push-queue-max"] == str(20 * GIB)
    small = plan(backup, "node1", {"FilesystemSize": 3 * GIB}).upload("/etc/pgbackrest.conf")
    assert _ini(small)["global"]["archive-push-queue-max"] == str(GIB)
    stated = plan(backup, "node1", components={"backup": {"archive_push_queue_max": "6GiB"}})
    assert _ini(stated.upload("/etc/pgbackrest.conf"))["global"]["archive-push-queue-max"] == str(6 * GIB)
    assert parse_size(512 * 1024**2, "s") == 512 * 1024**2 and parse_size("512MB", "s") == 512 * 1024**2
    with pytest.raises(BackupSettingsError, match=r"components.backup.archive_push_queue_max: 'lots' is not a size"):
        plan(backup, "node1", components={"backup": {"archive_push_queue_max": "lots"}})
    with pytest.raises(BackupSettingsError, match=r"could not be read; set it"):
        plan(backup, "node1", {"FilesystemSize": None})


def test_filesystem_size_fact_reads_df_of_the_nearest_existing_parent(tmp_path: Path) -> None:
    command = FilesystemSize().command(path=str(tmp_path / "not" / "yet" / "pg_wal"))
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    size = FilesystemSize().process(output.splitlines())
    assert size is not None and size > 0
    assert FilesystemSize().process([]) is None


def present(fresh: Plan, services: list[str], packages: list[str]) -> dict[str, Any]:
    """``_present`` plus the directories the plan creates, with the owner and mode it gives them."""
    facts = _present(fresh, services, packages)
    directories: dict[str, dict[str, Any]] = {}
    for op in fresh.ops:
        words = [command.split() for command in op.commands]
        if [w[0] for w in words] == ["mkdir", "chmod", "chown"] and len({w[-1] for w in words}) == 1:
            user, _, group = words[2][1].partition(":")  # a files.directory that creates its path
            directories[words[0][-1]] = {"mode": int(words[1][1]), "user": user, "group": group}
    facts["Directory"] = lambda path, **_: directories.get(path, {"mode": 755, "user": "root", "group": "root"})
    # Files uploaded as they are (files.put) are in the plan as "<file SRC>": hash the file itself.
    put = {dest: Path(up[6:-1]) for op in fresh.ops for dest, up in op.uploads.items() if up.startswith("<file ")}
    rendered = facts["Sha1File"]
    facts["Sha1File"] = lambda path, **kw: (
        hashlib.sha1(put[path].read_bytes()).hexdigest() if path in put else rendered(path, **kw)
    )
    return facts


def test_database_side_no_op() -> None:
    fresh = plan(backup, "node1")
    assert "chown postgres:postgres /etc" not in [c for op in fresh.ops for c in op.commands]
    _no_commands(plan(backup, "node1", present(fresh, ["pgbackrest"], [PGBACKREST, "rsync"])))


def test_repository_side_fresh_creates_the_stanza_and_a_first_full_backup(secrets_dir: Path) -> None:
    fresh = plan(backup, "node3")
    conf = _ini(fresh.upload("/etc/pgbackrest.conf"))
    cipher = (secrets_dir / "pgbackrest" / "cipher_pass").read_text().strip()
    assert conf["global"]["repo1-cipher-type"] == "aes-256-cbc" and conf["global"]["repo1-cipher-pass"] == cipher
    assert conf["global"]["repo1-retention-full"] == "2" and conf["global"]["repo1-path"] == "/var/lib/pgbackrest"
    # Both Patroni members push WAL (whichever is primary) and are backed up (from the standby).
    auth = [line for line in fresh.upload("/etc/pgbackrest.conf").splitlines() if line.startswith("tls-server-auth=")]
    assert auth == ["tls-server-auth=node1=memoryctl", "tls-server-auth=node2=memoryctl"]
    assert conf["memoryctl"]["pg1-host"] == "10.77.0.1" and conf["memoryctl"]["pg1-host-type"] == "tls"
    assert conf["memoryctl"]["pg2-host"] == "10.77.0.2" and conf["global"]["backup-standby"] == "y"
    names = fresh.names()
    assert names.index("Backups | User postgres") < names.index("Backups | pgBackRest 2.55.1-1, rsync")
    stanza = fresh.op("pgBackRest stanza memoryctl").commands[-1]
    assert "pgbackrest --stanza=memoryctl stanza-create" in stanza and "*LockAcquireError*" in stanza
    first = fresh.op("First full backup").commands
    assert "check" in first[-2] and first[-1].endswith("--type=full backup")
    cron = fresh.upload("/etc/cron.d/pgbackrest")
    assert "30 1 * * 0 postgres" in cron and "--type=full" in cron and "--type=diff" in cron


def test_the_stanza_waits_for_the_database_node(secrets_dir: Path) -> None:
    """pyinfra runs one chain of steps per node, merged by call site: nothing made the repository
    node wait, and the first deploy on the local nodes failed creating the stanza before the
    database node's pgBackRest server was listening."""

    def db_node_busy_first() -> None:  # as in deploy/roles.py: the db node has more to do before
        if has_role("db"):
            postgresql()
            memoryctl()
        backup()

    at = {step: i for i, step in enumerate(cluster_order(db_node_busy_first, components=DAY_TWO))}
    stanza = at[("node3", "Backups | pgBackRest stanza memoryctl")]
    for db_step in ("pgbackrest running and enabled", "Restart PostgreSQL (WAL archiving changed)"):
        assert at[("node1", f"Backups | {db_step}")] < stanza, db_step
    assert at[("node3", "Backups | pgbackrest running and enabled")] < stanza


def test_repository_side_no_op_once_backed_up() -> None:
    fresh = plan(backup, "node3")
    facts = present(fresh, ["pgbackrest", "rsync"], [PGBACKREST, "rsync"])
    postgres = {"home": "/var/lib/pgbackrest", "group": "postgres", "groups": [], "shell": "/bin/sh"}
    facts.update(PgbackrestStanza=BACKED_UP, Users={"postgres": postgres})
    facts["Groups"] = ["postgres"]
    again = plan(backup, "node3", facts)
    _no_commands(again)
    assert not any("stanza" in name or "First full" in name for name in again.names())


def test_repository_side_resumes_a_failed_first_run() -> None:
    """Stanza created but the first backup never finished: the next run takes it, nothing else."""
    p = plan(backup, "node3", {"PgbackrestStanza": {"status": 2, "backups": 0}})
    assert "Backups | First full backup (after checking WAL archiving)" in p.names()
    assert "Backups | pgBackRest stanza memoryctl" not in p.names()


def test_snapshot_drop_box_is_on_the_mesh_for_the_db_node_only(secrets_dir: Path) -> None:
    fresh = plan(backup, "node3")
    conf = fresh.upload("/etc/rsyncd.conf")
    assert "address = 10.77.0.3" in conf and "hosts allow = 10.77.0.1" in conf and "hosts deny = *" in conf
    password = (secrets_dir / "backup" / "rsync_password").read_text().strip()
    assert fresh.upload("/etc/rsyncd.secrets").endswith(f"memoryctl:{password}\n")
    assert "chmod 600 /etc/rsyncd.secrets" in fresh.op("Render /etc/rsyncd.secrets").commands


def test_index_and_disabled_nodes_get_nothing() -> None:
    single = {"postgres": {"members": ["node1"]}}  # node2 is a PostgreSQL member only in a cluster
    assert all("pgbackrest" not in " ".join(op.commands) for op in plan(backup, "node2", components=single).ops)
    standby = plan(backup, "node2")
    assert "Backups | Render /etc/postgresql/17/main/conf.d/pgbackrest.conf" in standby.names()
    assert not any("cron.d/memoryctl-backup" in name for name in standby.names())
    assert plan(backup, "node1", components={"backup": {"enabled": False}}).ops == []


def test_pgbackrest_parses_both_configs(tmp_path: Path) -> None:
    """pgBackRest itself reads each rendered file: every option name and section is one it knows."""
    if shutil.which("pgbackrest") is None:
        pytest.skip("needs pgbackrest (apt-get install pgbackrest)")
    for node in ("node1", "node3"):
        path = tmp_path / f"{node}.conf"
        path.write_text(plan(backup, node).upload("/etc/pgbackrest.conf"))
        result = subprocess.run(
            ["pgbackrest", f"--config={path}", "--stanza=memoryctl", "--log-level-console=warn", "help", "backup"],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0 and "WARN" not in result.stdout + result.stderr, result.stdout + result.stderr


def test_s3_repository_needs_its_keys_from_the_secrets_directory(secrets_dir: Path) -> None:
    s3 = {"repository": {"type": "s3", "endpoint": "fsn1.your-objectstorage.com", "bucket": "mem", "region": "fsn1"}}
    with pytest.raises(ValueError, match="s3 key into"):
        plan(backup, "node3", components={"backup": s3})
    (secrets_dir / "pgbackrest").mkdir(parents=True, exist_ok=True)
    (secrets_dir / "pgbackrest" / "s3_key").write_text("AKIA\n")
    (secrets_dir / "pgbackrest" / "s3_key_secret").write_text("very-secret\n")
    conf = _ini(plan(backup, "node3", components={"backup": s3}).upload("/etc/pgbackrest.conf"))["global"]
    assert conf["repo1-type"] == "s3" and conf["repo1-s3-endpoint"] == "fsn1.your-objectstorage.com"
    assert conf["repo1-s3-key"] == "AKIA" and conf["repo1-s3-key-secret"] == "very-secret"
    assert conf["repo1-path"] == "/memoryctl" and conf["repo1-cipher-type"] == "aes-256-cbc"


def test_second_repository_in_s3_beside_the_first_with_its_own_keys_retention_and_schedule(secrets_dir: Path) -> None:
    """repo2 is rendered on the repository side (keys from ``pgbackrest/repo2_s3_key*``, its own
    retention, backups of its own in cron) and reached through the repository node from the
    database side, which never holds its keys or the passphrase."""
    second = {"repository2": {"endpoint": "fsn1.your-objectstorage.com", "bucket": "mem-offsite", "region": "fsn1"}}
    with pytest.raises(
        BackupSettingsError, match=r"backup.repository2 \(s3\): put the bucket's s3 key into .*repo2_s3_key"
    ):
        plan(backup, "node3", components={"backup": second})
    (secrets_dir / "pgbackrest").mkdir(parents=True, exist_ok=True)
    (secrets_dir / "pgbackrest" / "repo2_s3_key").write_text("AKIA2\n")
    (secrets_dir / "pgbackrest" / "repo2_s3_key_secret").write_text("second-secret\n")
    repository = plan(backup, "node3", components={"backup": {**second, "retention_full": 2}})
    conf = _ini(repository.upload("/etc/pgbackrest.conf"))["global"]
    assert conf["repo1-type"] == "posix" and conf["repo1-retention-full"] == "2"  # the first one unchanged
    assert (
        conf["repo2-type"] == "s3" and conf["repo2-s3-bucket"] == "mem-offsite" and conf["repo2-path"] == "/memoryctl"
    )
    assert conf["repo2-s3-key"] == "AKIA2" and conf["repo2-s3-key-secret"] == "second-secret"
    assert conf["repo2-retention-full"] == "4" and conf["repo2-cipher-pass"] == conf["repo1-cipher-pass"]
    assert "repo2-storage-port" not in conf
    cron = repository.upload("/etc/cron.d/pgbackrest")
    assert "30 3 * * 0 postgres" in cron and "--repo=2 --type=full" in cron and "--repo=2 --type=diff" in cron
    database = _ini(plan(backup, "node1", components={"backup": second}).upload("/etc/pgbackrest.conf"))["global"]
    assert database["repo2-host"] == database["repo1-host"] == "10.77.0.3" and database["repo2-host-type"] == "tls"
    assert not [key for key in database if key.startswith("repo2-s3") or "cipher" in key]
    with pytest.raises(InventoryError, match=r"components\.backup\.repository2\.type"):
        plan(backup, "node3", components={"backup": {"repository2": {"type": "posix"}}})
    single = plan(backup, "node3")
    assert "repo2" not in single.upload("/etc/pgbackrest.conf") and "--repo=2" not in single.upload(
        "/etc/cron.d/pgbackrest"
    )


def test_node_certificates_chain_to_the_controller_ca_and_are_kept(tmp_path: Path) -> None:
    ca = CertificateAuthority(SecretDir(tmp_path), "pgbackrest")
    first = ca.node("node1", "10.77.0.1")
    assert ca.node("node1", "10.77.0.1") == first  # read back, not regenerated
    cert = x509.load_pem_x509_certificate(first.cert.encode())
    root = x509.load_pem_x509_certificate(first.ca.encode())
    assert cert.issuer == root.subject
    public = root.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    cert.verify_directly_issued_by(root)
    assert cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "node1"
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("10.77.0.1") in names.get_values_for_type(x509.IPAddress)
    # pgBackRest 2.45 (Debian 12) matches the address it connects to against DNS names only.
    assert "10.77.0.1" in names.get_values_for_type(x509.DNSName)
    assert "PRIVATE" not in repr(first)
    assert oct((tmp_path / "pgbackrest" / "node1.key").stat().st_mode & 0o777) == "0o600"


def test_a_node_certificate_that_no_longer_fits_is_issued_again(tmp_path: Path) -> None:
    ca = CertificateAuthority(SecretDir(tmp_path), "pgbackrest")
    before = ca.node("node1", "10.77.0.1")
    moved = ca.node("node1", "10.77.0.9")
    assert moved.cert != before.cert and moved.key == before.key  # same key, new names
    names = x509.load_pem_x509_certificate(moved.cert.encode()).extensions
    san = names.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["node1", "10.77.0.9"]
    assert ca.node("node1", "10.77.0.9") == moved  # and kept from then on
    assert oct((tmp_path / "pgbackrest" / "node1.crt").stat().st_mode & 0o777) == "0o600"


def test_backup_node_is_never_the_database_node() -> None:
    cluster = load_inventory(REPO / "inventory" / "local.yaml")
    assert ops_node(cluster, "backup", None) == "node3"
    assert ops_node(cluster, "monitoring", "node2") == "node2"
    with pytest.raises(OpsNodeError, match="runs PostgreSQL"):
        ops_node(cluster, "backup", "node1")
    with pytest.raises(OpsNodeError, match="not a node"):
        ops_node(cluster, "backup", "node9")


def test_stanza_fact_reads_pgbackrest_info(tmp_path: Path) -> None:
    """The fact parses what pgBackRest itself prints (here: a repository without the stanza yet)."""
    fact = PgbackrestStanza()
    assert fact.process(["garbage"]) is None and fact.process([]) is None
    if shutil.which("pgbackrest") is None:
        pytest.skip("needs pgbackrest (apt-get install pgbackrest)")
    config = tmp_path / "pgbackrest.conf"
    config.write_text(
        f"[global]\nrepo1-path={tmp_path / 'repo'}\nlock-path={tmp_path}\n[memoryctl]\npg1-path={tmp_path}\n"
    )
    command = fact.command(stanza="memoryctl").replace("pgbackrest ", f"pgbackrest --config={config} ", 1)
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    assert fact.process(output.splitlines()) == {"status": 1, "backups": 0}


def test_firewall_opens_the_day_two_ports_on_the_mesh() -> None:
    from deploy.firewall import firewall

    def ports(node: str) -> set[int]:
        rules = plan(firewall, node).upload("/etc/nftables.conf")
        line = next(line for line in rules.splitlines() if "services over the mesh" in line)
        assert 'iifname "wg0"' in line
        return {int(p) for p in line.split("{")[1].split("}")[0].split(",")}

    assert {8432, 9100, 9187} <= ports("node1")  # pgBackRest, node and postgres exporters
    # node2 is the Patroni standby: pgBackRest's TLS server too (it archives once it is primary)
    assert {8432, 9100, 9090, 9093} <= ports("node2") and not {873, 9187} & ports("node2")
    assert {873, 8432, 9100} <= ports("node3") and not {9090, 9093} & ports("node3")  # rsync, pgBackRest
    assert {9090, 9093} <= ports("node1")  # the monitoring pair: node1 and node2 (Prometheus, Alertmanager)
    # Alertmanager's gossip: from the other monitoring node's mesh address only, TCP and UDP.
    gossip = 'iifname "wg0" ip saddr { 10.77.0.2 } meta l4proto { tcp, udp } th dport 9094 accept'
    assert gossip in plan(firewall, "node1").upload("/etc/nftables.conf")
    assert "9094" not in plan(firewall, "node3").upload("/etc/nftables.conf")
