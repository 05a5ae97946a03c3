"""Backups: pgBackRest for PostgreSQL, and the place Qdrant's snapshots are shipped to.

PostgreSQL is the source of truth, so it gets continuous WAL archiving plus full/differential base
backups (pgBackRest from Debian's archive) into a repository on the **backup node**, never the
database's (:mod:`deploy.opsnode`), at the release's exact version on both ends, held there by an
apt pin (the two sides refuse each other across versions). They talk TLS over the mesh (port 8432,
firewalled to the mesh), each admitting the other by the common name of a certificate from a CA
generated on the controller (:mod:`deploy.pki`): no SSH keys between nodes. The repository is encrypted
(aes-256-cbc) with a passphrase generated on the controller like every other secret; it can live
on the backup node's disk (``repository: {type: posix}``, the default) or in an S3-compatible
bucket such as Hetzner Object Storage (``type: s3``; docs/backup.md). Backups run on the
repository side from cron (full weekly, differential daily by default), retention is pgBackRest's.

Qdrant's snapshots (one per shard, through its API) are taken by ``memoryctl backup qdrant`` on
the db node and shipped to the backup node's rsync daemon (mesh address only, one module, one user
with a generated password). Neo4j is rebuilt from PostgreSQL (``memoryctl rebuild graph``): it has
no backup of its own (docs/backup.md says why).

One-shot steps converge: whether the stanza exists and has a backup is asked of pgBackRest on
every run (:class:`PgbackrestStanza`), so a run that failed half-way finishes the job next time.
"""

from __future__ import annotations

from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server, systemd

from deploy import aptsources, patroni, ports
from deploy.common import (
    after_mesh,
    barrier,
    components,
    has_role,
    inventory,
    keep_running,
    secrets,
    service_account,
    sudoers,
    template,
)
from deploy.components import BackupRepository, BackupRepository2
from deploy.facts import FilesystemSize, PgbackrestStanza, PostgresSetting
from deploy.opsnode import ops_node
from deploy.osrelease import release
from deploy.pki import CertificateAuthority
from deploy.postgres import AS_POSTGRES, major, restart

STANZA = "memoryctl"
CONFIG = "/etc/pgbackrest.conf"  # the Debian package's path
TLS_DIR = "/etc/pgbackrest/tls"
TLS_PORT = ports.PGBACKREST_TLS
RSYNC_PORT = ports.RSYNC
RSYNC_MODULE = "qdrant-snapshots"
RSYNC_USER = "memoryctl"
SNAPSHOT_DIR = "/var/backups/memoryctl/qdrant"
REPO_PATH = "/var/lib/pgbackrest"
S3_PATH = "/memoryctl"
# The archive queue limit's default: this share of the disk that holds pg_wal (docs/backup.md).
ARCHIVE_QUEUE_SHARE = 0.2
GIB = 1024**3
SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2, "mib": 1024**2}
SIZE_UNITS.update({"g": GIB, "gb": GIB, "gib": GIB, "t": 1024**4, "tb": 1024**4, "tib": 1024**4})


class BackupSettingsError(ValueError):
    """``components.backup`` that cannot be deployed as written."""


def enabled() -> bool:
    return components().backup.enabled


def backup_node() -> str:
    return ops_node(inventory(), "backup", components().backup.node)


def mesh_ports() -> list[int]:
    """What this host serves over the mesh for backups (the firewall opens these on ``wg0``)."""
    if not enabled():
        return []
    ports = [TLS_PORT] if has_role("db") or patroni.is_standby_member() else []
    if host.name == backup_node():
        ports += [TLS_PORT, RSYNC_PORT]
    return sorted(set(ports))


def repository() -> dict[str, Any]:
    """The pgBackRest repository settings, with the S3 credentials read from the secrets directory."""
    settings = components().backup.repository
    if settings.type == "posix":
        return {"type": "posix", "path": settings.path or REPO_PATH}
    return _s3(settings, "backup.repository", "")


def _s3(settings: BackupRepository | BackupRepository2, setting: str, key_prefix: str) -> dict[str, Any]:
    """An S3 repository's settings; its keys are files of the secret store (``pgbackrest/<key_prefix>s3_key``),
    never inventory values: the object storage issues them, the deploy cannot generate them."""
    missing = [key for key in ("endpoint", "bucket", "region") if not getattr(settings, key)]
    if missing:
        raise BackupSettingsError(f"{setting} (s3) needs {', '.join(missing)}")
    store = secrets().dir
    credentials = {}
    for name in ("s3_key", "s3_key_secret"):
        path = store.path / "pgbackrest" / f"{key_prefix}{name}"
        if not path.is_file():
            raise BackupSettingsError(
                f"{setting} (s3): put the bucket's {name.replace('_', ' ')} into {path} (mode 0600); "
                "access keys cannot be generated, the object storage issues them"
            )
        credentials[name] = path.read_text().strip()
    return {
        "type": "s3",
        "path": settings.path or S3_PATH,
        "endpoint": settings.endpoint,
        "bucket": settings.bucket,
        "region": settings.region,
        "uri_style": settings.uri_style,
        "port": settings.port,
        "key": credentials["s3_key"],
        "key_secret": credentials["s3_key_secret"],
    }


def repository2() -> dict[str, Any] | None:
    """The optional second repository (``components.backup.repository2``): an S3 bucket off the
    cluster, so that losing the backup node (it is also the GPU node that reboots and trains) loses
    no backup. WAL goes to both repositories; its retention is its own (in full backups: the
    bucket is cheaper per GB than the node's disk). Its keys: ``pgbackrest/repo2_s3_key`` and
    ``repo2_s3_key_secret`` in the secret store."""
    settings = components().backup.repository2
    if settings is None:
        return None
    repo = _s3(settings, "backup.repository2", "repo2_")
    repo["retention_full"] = settings.retention_full
    repo["retention_diff"] = settings.retention_diff
    return repo


def pg_data() -> str:
    return f"/var/lib/postgresql/{major()}/main"


def parse_size(value: Any, setting: str) -> int:
    """Bytes from an int or a size as pgBackRest writes it (``8GiB``, ``512MB``: powers of 1024)."""
    text = str(value).strip().lower().replace(" ", "")
    number = text.rstrip("kmgtib")
    unit = text[len(number) :]
    if not number.isdigit() or unit not in SIZE_UNITS:
        raise BackupSettingsError(f"{setting}: {value!r} is not a size (bytes, or e.g. 8GiB, 512MiB)")
    return int(number) * SIZE_UNITS[unit]


def archive_push_queue_max() -> int:
    """How much un-archived WAL pgBackRest lets pile up in pg_wal before it drops it (bytes).

    With the repository away, PostgreSQL keeps every WAL segment it could not archive; without a
    limit pg_wal grows until the disk is full and PostgreSQL stops. Past the limit pgBackRest
    reports the queued WAL archived and drops it: PostgreSQL keeps running, point-in-time recovery
    past that gap is lost until the next backup (docs/backup.md). ``components.backup.
    archive_push_queue_max`` sets it; by default 20 % of the filesystem that holds pg_wal, read on
    the node at plan time (its size, not its free space: the value stays put from run to run), in
    whole GiB, at least 1 GiB.
    """
    setting = "components.backup.archive_push_queue_max"
    stated = components().backup.archive_push_queue_max
    if stated is not None:
        return parse_size(stated, setting)
    size = host.get_fact(FilesystemSize, path=f"{pg_data()}/pg_wal")
    if size is None:
        raise BackupSettingsError(f"{setting}: the size of {pg_data()}'s filesystem could not be read; set it")
    return max(1, int(size * ARCHIVE_QUEUE_SHARE) // GIB) * GIB


def memoryctl_settings() -> dict[str, Any] | None:
    """The ``[backup]`` section of memoryctl.toml (the db node reads backups through these)."""
    if not enabled():
        return None
    node = backup_node()
    return {
        "pgbackrest_stanza": STANZA,
        "snapshot_target": f"rsync://{RSYNC_USER}@{inventory().nodes[node]['mesh']}/{RSYNC_MODULE}",
        "snapshot_password": secrets().token("backup/rsync_password"),
        "snapshot_keep": components().backup.snapshot_keep,
    }


def _schedule() -> dict[str, str]:
    return components().backup.schedule.model_dump()


def _tls_files(peer_name: str) -> list[Any]:
    """The node's certificate and key, and the CA, readable by the postgres user only."""
    cert = CertificateAuthority(secrets().dir, "pgbackrest").node(host.name, host.data.mesh_address)
    files.directory(name="pgBackRest TLS directory", path=TLS_DIR, user="postgres", group="postgres", mode="750")
    ops = []
    for name, content, mode in (
        ("ca.crt", cert.ca, "644"),
        ("node.crt", cert.cert, "644"),
        ("node.key", cert.key, "600"),
    ):
        ops.append(
            template(
                "pgbackrest/pem.j2", f"{TLS_DIR}/{name}", pem=content, user="postgres", group="postgres", mode=mode
            )
        )
    return ops


def _config(side: str, peers: list[str], **extra: Any) -> Any:
    """``peers``: the repository node (database side), or every PostgreSQL member (repository
    side: with Patroni, WAL arrives from whichever is primary and backups read the standby)."""
    return template(
        "pgbackrest/pgbackrest.conf.j2",
        CONFIG,
        side=side,
        stanza=STANZA,
        mesh_address=host.data.mesh_address,
        tls_port=TLS_PORT,
        tls_dir=TLS_DIR,
        peer_names=peers,
        peer_addresses=[inventory().nodes[peer]["mesh"] for peer in peers],
        pg_data=pg_data(),
        process_max=components().backup.process_max,
        user="postgres",
        group="postgres",
        mode="640",
        create_remote_dir=False,  # else pyinfra would chown /etc to postgres
        **extra,
    )


def _server(changes: list[Any]) -> None:
    """pgBackRest's TLS server: the Debian package's unit (as postgres), which it leaves stopped;
    it binds the mesh address, so it starts after the tunnel."""
    dropin = after_mesh("pgbackrest", "pgBackRest's TLS server")
    systemd.daemon_reload(name="Reload systemd units (pgbackrest drop-in)", _if=dropin.did_change)
    keep_running("pgbackrest", [*changes, dropin])


def install_pgbackrest() -> None:
    """pgBackRest at the release's exact version, held there, on both ends from the same source
    (Debian's archive): its two sides refuse to talk across versions ("greeting key 'version'")."""
    version = release().pgbackrest
    aptsources.pin("pgbackrest", ["pgbackrest"], version)
    apt.packages(name=f"pgBackRest {version}, rsync", packages=[f"pgbackrest={version}", "rsync"], no_recommends=True)


@deploy("Backups")
def backup() -> None:
    if not enabled():
        host.noop("backup: disabled in the inventory")
        return
    if has_role("db") or patroni.is_standby_member():
        database_side()
    if host.name == backup_node():
        repository_side()
    # The stanza and the first backup reach the database node's pgBackRest server and WAL archiving.
    barrier("the database side of the backups is up")
    if host.name == backup_node():
        first_backup()


def database_side() -> None:
    """WAL archiving into the repository, the TLS server the repository backs up through, and the
    Qdrant snapshot job of memoryctl (it runs where memoryctl runs)."""
    node = backup_node()
    install_pgbackrest()
    changes = _tls_files(node)
    changes.append(
        _config(
            "database",
            [node],
            archive_push_queue_max=archive_push_queue_max(),
            repository2=components().backup.repository2 is not None,
        )
    )
    _server(changes)
    archiving = template(
        "pgbackrest/archiving.conf.j2",
        f"/etc/postgresql/{major()}/main/conf.d/pgbackrest.conf",
        stanza=STANZA,
        repository_node=node,
        archive_timeout=components().backup.archive_timeout,
        user="postgres",
        group="postgres",
        mode="644",
    )
    # Asked of the running server, not only "the file changed": a run that failed between writing
    # the file and the restart would otherwise leave archiving off for good.
    archive_mode = host.get_fact(PostgresSetting, setting="archive_mode", **AS_POSTGRES)
    restart(
        major(),
        "WAL archiving changed",
        lambda: archiving.did_change() or archive_mode not in (None, "on"),
        # Backups come after PostgreSQL in the run: a member's Patroni runs by now, even on the
        # run that converts it (a plan-time "handed over" said no there, and the Debian unit's
        # restart of a cluster Patroni runs failed: fresh-clone CI rehearsal of 2f85316).
        patroni.is_member(),
        name="Restart PostgreSQL (WAL archiving changed)",
    )
    if not has_role("db"):
        return  # a standby member: archiving and the TLS server; memoryctl's jobs run on the db node
    sudoers("pgbackrest/sudoers-memoryctl.j2", "/etc/sudoers.d/memoryctl-pgbackrest", run_as="memoryctl", stanza=STANZA)
    template(
        "backup/cron.j2",
        "/etc/cron.d/memoryctl-backup",
        backup_node=node,
        schedule=_schedule()["qdrant"],
        run_as="memoryctl",
        config_path="/etc/memoryctl/memoryctl.toml",
        memoryctl="/usr/local/bin/memoryctl",
        log_dir="/var/log/memoryctl",
        mode="644",
    )


def repository_side() -> None:
    """The repository (encrypted), the scheduled backups and the snapshot drop box."""
    db_node = inventory().group("db")[0]
    members = patroni.members()
    settings = components().backup
    repo = repository()
    repo2 = repository2()
    # pgBackRest's user on the repository side (the db node's comes with PostgreSQL).
    service_account("postgres", REPO_PATH, {repo["path"]: "750"} if repo["type"] == "posix" else {}, shell="/bin/sh")
    install_pgbackrest()
    changes = _tls_files(db_node)
    changes.append(
        _config(
            "repository",
            members,
            repository=repo,
            cipher_pass=secrets().token("pgbackrest/cipher_pass"),
            retention_full=settings.retention_full,
            retention_diff=settings.retention_diff,
            repository2=repo2,
        )
    )
    _server(changes)
    template(
        "pgbackrest/cron.j2",
        "/etc/cron.d/pgbackrest",
        stanza=STANZA,
        schedule=_schedule(),
        repository2=repo2 is not None,
        mode="644",
    )
    snapshot_box(db_node)


STANZA_LOCK_TRIES, STANZA_LOCK_WAIT_S = 6, 10


def stanza_create() -> str:
    """``stanza-create``, tried again while another pgBackRest process holds the database's lock.

    Right after PostgreSQL starts (a first deploy, or the run after one that was stopped), its
    asynchronous ``archive-push`` is busy with the WAL it could not archive while there was no
    stanza, and holds the archive lock that ``stanza-create`` takes on the database side: it fails
    with ``LockAcquireError`` ("is another pgBackRest process running?") although nothing is wrong
    (seen once in a CI rehearsal). That error alone is waited out, a few times; any other fails at once.
    """
    return (
        f"n=0; rc=1; while [ $n -lt {STANZA_LOCK_TRIES} ]; do"
        f' out=$(pgbackrest --stanza={STANZA} stanza-create 2>&1) && {{ echo "$out"; rc=0; break; }};'
        ' echo "$out" >&2;'
        f' case "$out" in *LockAcquireError*) n=$((n+1)); sleep {STANZA_LOCK_WAIT_S};; *) break;; esac;'
        " done; [ $rc -eq 0 ]"
    )


def first_backup() -> None:
    """The stanza and a first full backup, unless pgBackRest says they exist (asked every run)."""
    stanza = host.get_fact(PgbackrestStanza, stanza=STANZA, **AS_POSTGRES)
    if stanza is None or stanza["status"] in (1, 3):
        server.shell(name=f"pgBackRest stanza {STANZA}", commands=[stanza_create()], **AS_POSTGRES)
    if stanza is None or stanza["backups"] == 0:
        # `check` proves WAL reaches the repository before the first full backup relies on it.
        server.shell(
            name="First full backup (after checking WAL archiving)",
            commands=[f"pgbackrest --stanza={STANZA} check", f"pgbackrest --stanza={STANZA} --type=full backup"],
            **AS_POSTGRES,
        )


def snapshot_box(db_node: str) -> None:
    """rsync's daemon on the mesh address: the db node ships Qdrant snapshots here and fetches them back."""
    files.directory(name="Qdrant snapshot directory", path=SNAPSHOT_DIR, user="backup", group="backup", mode="750")
    conf = template(
        "backup/rsyncd.conf.j2",
        "/etc/rsyncd.conf",
        mesh_address=host.data.mesh_address,
        port=RSYNC_PORT,
        module=RSYNC_MODULE,
        path=SNAPSHOT_DIR,
        rsync_user=RSYNC_USER,
        clients=[inventory().nodes[db_node]["mesh"]],
        mode="644",
    )
    secret = template(
        "backup/rsyncd.secrets.j2",
        "/etc/rsyncd.secrets",
        rsync_user=RSYNC_USER,
        password=secrets().token("backup/rsync_password"),
        user="root",
        group="root",
        mode="600",
    )
    dropin = after_mesh("rsync", "rsync's daemon")
    systemd.daemon_reload(name="Reload systemd units (rsync drop-in)", _if=dropin.did_change)
    keep_running("rsync", [conf, secret, dropin])  # the package's unit waits for /etc/rsyncd.conf
