"""The inventory's ``components:`` as typed settings: one class per component, one default per setting.

Every setting a deploy module reads is declared here with its type, its default and what it does
(docs/deploy.md's settings table is checked against these classes), and the deploy modules read
attributes (``components().vllm.max_loras``) instead of ``.get(key, default)`` on a dict. The
inventory is parsed into :class:`Components` once, when it is loaded (deploy/settings.py, after the
``$MEMORYCTL_INVENTORY_OVERLAY`` files are merged over it as dictionaries), so a misspelt or
mistyped setting stops the run before anything is planned, with an :class:`InventoryError` naming
the file, the component and the key (and the setting it probably meant).

pydantic rather than dataclasses: the validation, the coercion YAML needs (``"2"`` and ``2``), the
refusal of unknown keys (``extra="forbid"``) and the field descriptions the docs table is made from
come with it, as in memoryctl's own settings (memoryctl/config.py). The models are frozen: a
deploy module cannot change a setting another module reads.

A setting whose default depends on the cluster (``postgres.members``: the ``db`` node;
``qdrant.peers``: the ``index`` nodes; ``backup.node``: :mod:`deploy.opsnode`) is ``None`` here and
decided where the cluster is known; its description says how. Pure: no pyinfra state, so every
layer of deploy/ may import it.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from memoryctl.config import NightlySettings

# Defaults shared by more than one setting or module, stated once.
NIGHTLY_SCHEDULE = "15 2 * * *"
GENERATION_UNIT = "vllm@generate"
SERVE_PORT = 8765
# What the tests' nights train with (tests/integration/test_nightly.py); production sets its own
# steps. The gate's noise floor: a candidate must lower the held-out loss by more than 0.01 nats
# to replace the served adapter (measured on the local nodes' tiny model: a first night 5.75 ->
# 5.50 against the base, a second night on the same kind of turns 0.001-0.005 against the first:
# a swap for nothing), docs/nightly.md.
GENERATION_LORA = {"steps": 20, "min_examples": 8, "min_heldout": 2, "min_loss_improvement": 0.01}
# Where an alert's runbook_url points: by default the file's path in the memoryctl repository (the
# project names no web address of its own); an operator states where the team reads it, e.g. an
# internal Git web UI or docs site (components.monitoring.runbook_base).
RUNBOOK_BASE = "docs/monitoring.md"
# PostgreSQL's and Patroni's smallest accepted values of the postmaster settings the inventory
# declares (Patroni raises a smaller one, which would then read as a drift on every run).
PATRONI_MINIMUM = {"max_connections": 25, "max_worker_processes": 2, "max_locks_per_transaction": 32}


class InventoryError(ValueError):
    """The inventory YAML is missing a field or contradicts itself."""


class Settings(BaseModel):
    """One component's settings: unknown keys refused, values frozen once parsed."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


class Base(Settings):
    admin_user: str = Field("ops", description="The admin user created on every node, with sudo.")
    admin_keys: list[str] = Field(
        default_factory=list,
        description="Controller paths of the OpenSSH public keys that may log in as the admin user.",
    )
    permit_root_login: str = Field(
        "prohibit-password", description="sshd's PermitRootLogin (the deploy itself logs in as root with a key)."
    )


class Firewall(Settings):
    ssh_port: int = Field(22, ge=1, le=65535, description="The SSH port the public side accepts.")


class Postgres(Settings):
    members: list[str] | None = Field(
        None,
        description="The PostgreSQL members, the db node first; two or more make a Patroni cluster"
        " (docs/ha.md). Default: the db node alone (the single server).",
    )
    version: int | None = Field(
        None, description="Refused unless it is the release's major (17 on Debian 13): leave it out."
    )
    shared_buffers: str = Field("1GB", description="PostgreSQL's shared_buffers.")
    effective_cache_size: str = Field("3GB", description="PostgreSQL's effective_cache_size.")
    work_mem: str = Field("16MB", description="PostgreSQL's work_mem.")
    maintenance_work_mem: str = Field("256MB", description="PostgreSQL's maintenance_work_mem.")
    max_connections: StrictInt = Field(
        100,
        ge=PATRONI_MINIMUM["max_connections"],
        description="PostgreSQL's max_connections (in Patroni's DCS when replicated; every member the same).",
    )
    max_worker_processes: StrictInt = Field(
        8,
        ge=PATRONI_MINIMUM["max_worker_processes"],
        description="PostgreSQL's max_worker_processes (TimescaleDB's jobs need slots); the single server's"
        " file sets it only when stated.",
    )
    max_locks_per_transaction: StrictInt = Field(
        64,
        ge=PATRONI_MINIMUM["max_locks_per_transaction"],
        description="PostgreSQL's max_locks_per_transaction (a lock per hypertable chunk touched); the single"
        " server's file sets it only when stated.",
    )


class Timescaledb(Settings):
    enabled: bool = Field(False, description="TimescaleDB from sources.apt.timescaledb, preloaded and created.")
    version: str | None = Field(
        None, description="The extension's version; default deploy/versions.py's (an upgrade rehearsal states another)."
    )
    package_version: str = Field(
        "{version}~debian{release}",
        description="The apt version of the package: {version} and {release} (the Debian major) filled in.",
    )


class Source(Settings):
    """A release archive by URL, verified against a sha256 (deploy/artefacts.py)."""

    url: str = Field(description="The archive's URL; {version} is filled in from deploy/versions.py.")
    sha256: str | None = Field(None, description="The archive's sha256, as the release page publishes it.")
    sha256sums: str | None = Field(
        None, description="A controller path of a SHA256SUMS file listing the archive (the local stand-in's)."
    )


class QdrantSource(Source):
    glibc_floor: str | None = Field(
        None, description="The binary's glibc floor (x.y); default: known from the archive's target."
    )


class Qdrant(Settings):
    source: QdrantSource | None = Field(
        None, description="The release archive {url, sha256 or sha256sums}; null: nothing installed."
    )
    version: str | None = Field(None, description="Qdrant's version; default deploy/versions.py's.")
    peers: list[str] | None = Field(
        None, description="The nodes that run a Qdrant peer (one cluster over the mesh). Default: the index nodes."
    )
    shard_number: int | None = Field(
        None, ge=1, description="Shards of each collection memoryctl creates on a cluster. Default: one per peer."
    )
    replication_factor: int = Field(2, ge=1, description="Peers holding each shard (a cluster of two or more).")
    write_consistency_factor: int = Field(1, ge=1, description="Replicas that acknowledge a write before it returns.")
    log_level: str = Field("INFO", description="Qdrant's log level.")


class Neo4j(Settings):
    enabled: bool = Field(True, description="Neo4j on the index nodes.")
    source: Source | None = Field(None, description="The release tarball {url, sha256 or sha256sums}; required.")
    version: str | None = Field(None, description="Neo4j's version; default deploy/versions.py's.")
    heap: str = Field("2g", description="The JVM heap (initial and maximum).")
    pagecache: str = Field("2g", description="Neo4j's page cache.")
    jvm_additional: list[str] = Field(default_factory=list, description="JVM flags after upstream's defaults.")


class VllmGpu(Settings):
    reboot: bool = Field(False, description="Let the deploy reboot the node once to load the NVIDIA driver.")
    mirror: str = Field("http://deb.debian.org/debian", description="The Debian mirror of the non-free driver.")
    security_mirror: str = Field(
        "http://deb.debian.org/debian-security", description="The Debian security mirror of the non-free driver."
    )


class Vllm(Settings):
    mode: Literal["vllm", "standin", "off"] = Field(
        "vllm", description="vllm: the real server on a GPU; standin: the named stand-in (no GPU); off: nothing."
    )
    # GEX44 (20 GB): Qwen2.5-7B-Instruct in 4-bit AWQ (~5.6 GB of weights) leaves room for the KV cache
    # and the adapters; BGE-M3 (568M parameters, fp16 ~1.1 GB) beside it.
    model: str = Field("Qwen/Qwen2.5-7B-Instruct-AWQ", description="The generation model vllm@generate serves.")
    embedding_model: str = Field("BAAI/bge-m3", description="The embedding model's served name.")
    max_loras: int = Field(2, ge=1, description="vllm@generate's --max-loras.")
    max_lora_rank: int = Field(16, ge=1, description="vllm@generate's --max-lora-rank.")
    max_model_len: int = Field(8192, ge=1, description="vllm@generate's --max-model-len.")
    # 0.64 of the GEX44's 20 GB: 5.6 GB of weights and ~7 GB of KV cache (Qwen2.5-7B: 57 KB a token,
    # ~120,000 tokens); it was 0.68 before vllm@rerank took its 0.08 (docs/nightly.md's budget).
    gpu_memory_utilization: float = Field(0.64, gt=0, le=1, description="vllm@generate's share of the GPU.")
    generate_args: list[str] = Field(default_factory=list, description="More options of vllm@generate.")
    embed_max_model_len: int = Field(8192, ge=1, description="The embedding server's --max-model-len.")
    embed_gpu_memory_utilization: float = Field(
        0.17, gt=0, le=1, description="vllm@embed's share of the GPU (one embedding server, no slots)."
    )
    # BGE-M3's weights are ~1.1 GB in fp16 and a pooling model keeps no KV cache worth the name, so
    # 0.08 of the GEX44's 20 GB (1.6 GB) each; with the generation server's 0.68 that is 0.84.
    embed_slot_gpu_memory_utilization: float = Field(
        0.08, gt=0, le=1, description="Each embedding slot's share of the GPU (deploy/embedding_slots.py)."
    )
    embed_args: list[str] = Field(default_factory=list, description="More options of every embedding server.")
    rerank: bool = Field(
        True,
        description="Serve a cross-encoder (vllm@rerank, vLLM's score API) that memoryctl's rerank stage asks"
        " first ([query] rerank_url on every node), the CPU model behind it.",
    )
    # bge-reranker-v2-m3 is BGE-M3's size (568M parameters, fp16 ~1.1 GB): the embedding slots' 0.08.
    rerank_model: str = Field(
        "BAAI/bge-reranker-v2-m3",
        description="The cross-encoder vllm@rerank serves (mode vllm); with the stand-in, the name it answers to.",
    )
    rerank_by_default: bool = Field(
        False,
        description="memoryctl's [query] rerank on every node: every text query reranked unless --no-rerank.",
    )
    rerank_max_model_len: int = Field(
        1024, ge=1, description="vllm@rerank's --max-model-len (a question and one turn with its context)."
    )
    rerank_gpu_memory_utilization: float = Field(0.08, gt=0, le=1, description="vllm@rerank's share of the GPU.")
    rerank_args: list[str] = Field(default_factory=list, description="More options of vllm@rerank.")
    gpu: VllmGpu = Field(default_factory=VllmGpu, description="The NVIDIA driver's install (mode vllm).")


class Nightly(Settings):
    enabled: bool | None = Field(
        None, description="The nightly LoRA cycle on the first gpu node. Default: on unless vllm.mode is off."
    )
    schedule: str = Field(NIGHTLY_SCHEDULE, description="The night's cron schedule on the gpu node.")
    generation_base_model: str | None = Field(
        None,
        description="The directory of the served generation model's weights on the gpu node. Default: none"
        " (the tests' tiny model with the stand-in).",
    )
    embedding_base_model: str | None = Field(
        None, description="The directory of the embedding model's weights on the gpu node: two embedding slots."
    )
    pause_units: list[str] = Field(
        default_factory=lambda: [GENERATION_UNIT], description="Units stopped while the generation adapter trains."
    )
    vllm_ready_s: float = Field(
        NightlySettings.model_fields["vllm_ready_s"].default,
        gt=0,
        description="How long vLLM may take to answer after its start (memoryctl's [nightly] vllm_ready_s).",
    )
    generation_lora: dict[str, Any] = Field(
        default_factory=lambda: dict(GENERATION_LORA),
        description="The generation adapter's training settings, merged key by key over the default.",
    )
    embedding_lora: dict[str, Any] = Field(
        default_factory=dict, description="The embedding adapter's training settings (memoryctl-lora's defaults)."
    )

    @field_validator("generation_lora", mode="before")
    @classmethod
    def _over_default(cls, value: Any) -> Any:
        """A stated key replaces the default's, the others stay."""
        return {**GENERATION_LORA, **value} if isinstance(value, dict) else value


class MemoryctlSchedules(Settings):
    sync: str = Field("*/5 * * * *", description="memoryctl sync's cron schedule on the db node.")
    reconcile: str = Field("*/10 * * * *", description="memoryctl reconcile --repair's cron schedule.")
    nightly: str = Field(
        NIGHTLY_SCHEDULE, description="The night's schedule on the db node (when no gpu node runs it)."
    )


class Memoryctl(Settings):
    wheelhouse: str = Field(
        ".cache/wheelhouse", description="The controller directory of the nodes' wheels (one per platform)."
    )
    serve_port: int = Field(
        SERVE_PORT, ge=1, le=65535, description="memoryctl serve's HTTP port on the db node's mesh address."
    )
    schedules: MemoryctlSchedules = Field(default_factory=MemoryctlSchedules, description="The db node's cron jobs.")


class BackupRepository(Settings):
    type: Literal["posix", "s3"] = Field("posix", description="posix: the backup node's disk; s3: a bucket.")
    path: str | None = Field(None, description="The repository's path. Default: /var/lib/pgbackrest, in S3 /memoryctl.")
    endpoint: str | None = Field(None, description="The S3 endpoint (s3).")
    bucket: str | None = Field(None, description="The S3 bucket (s3).")
    region: str | None = Field(None, description="The S3 region (s3).")
    uri_style: Literal["host", "path"] = Field("host", description="The S3 URI style (s3).")
    port: int | None = Field(None, ge=1, le=65535, description="The S3 endpoint's port (s3). Default: 443.")


class BackupRepository2(Settings):
    type: Literal["s3"] = Field("s3", description="Always s3: a bucket off the cluster.")
    path: str | None = Field(None, description="The repository's path in the bucket. Default: /memoryctl.")
    endpoint: str | None = Field(None, description="The S3 endpoint.")
    bucket: str | None = Field(None, description="The S3 bucket.")
    region: str | None = Field(None, description="The S3 region.")
    uri_style: Literal["host", "path"] = Field("host", description="The S3 URI style.")
    port: int | None = Field(None, ge=1, le=65535, description="The S3 endpoint's port. Default: 443.")
    retention_full: int = Field(4, ge=1, description="Full backups kept in the bucket.")
    retention_diff: int = Field(7, ge=1, description="Differential backups kept in the bucket.")


class BackupSchedule(Settings):
    full: str = Field("30 1 * * 0", description="The full backup's cron schedule.")
    diff: str = Field("30 1 * * 1-6", description="The differential backup's cron schedule.")
    qdrant: str = Field("45 1 * * *", description="The Qdrant snapshots' cron schedule (db node).")
    repo2_full: str = Field("30 3 * * 0", description="The second repository's full backup (after the first's).")
    repo2_diff: str = Field("30 3 * * 1-6", description="The second repository's differential backup.")


class Backup(Settings):
    enabled: bool = Field(True, description="pgBackRest and the Qdrant snapshots.")
    node: str | None = Field(
        None, description="The repository's node, never the db node's. Default: deploy/opsnode.py's choice."
    )
    repository: BackupRepository = Field(default_factory=BackupRepository, description="pgBackRest's repository.")
    repository2: BackupRepository2 | None = Field(
        None, description="An optional second repository, an S3 bucket off the cluster (docs/backup.md)."
    )
    schedule: BackupSchedule = Field(default_factory=BackupSchedule, description="The backups' cron schedules.")
    retention_full: int = Field(2, ge=1, description="Full backups kept.")
    retention_diff: int = Field(7, ge=1, description="Differential backups kept.")
    process_max: int = Field(2, ge=1, description="pgBackRest's process-max.")
    archive_timeout: int = Field(60, ge=1, description="PostgreSQL's archive_timeout (seconds).")
    archive_push_queue_max: str | None = Field(
        None, description="Un-archived WAL kept before it is dropped (8GiB ...). Default: 20 % of pg_wal's disk."
    )
    snapshot_keep: int = Field(7, ge=1, description="Qdrant snapshots kept on the backup node.")


class Monitoring(Settings):
    enabled: bool = Field(True, description="Prometheus, Alertmanager and the exporters.")
    nodes: list[str] | None = Field(
        None,
        min_length=1,
        description="The nodes that each run Prometheus and Alertmanager (two: a pair, Alertmanagers in a"
        " cluster; one: a single instance). Default: the first two nodes without the gpu role (docs/monitoring.md).",
    )
    runbook_base: str = Field(
        RUNBOOK_BASE,
        description="Where your team reads docs/monitoring.md (a URL); every alert's runbook_url is this#alert-<name>.",
    )
    receiver: dict[str, Any] | None = Field(
        None, description="Alertmanager's operator receiver (email_configs, webhook_configs; secrets as *_secret)."
    )
    heartbeat: dict[str, Any] | None = Field(None, description="The dead-man's switch: {url_secret} (or url).")
    heartbeat_interval: str = Field("1m", description="How often the Watchdog pings the heartbeat.")
    scrape_interval: str = Field("15s", description="Prometheus' scrape interval.")
    evaluation_interval: str = Field("15s", description="Prometheus' rule evaluation interval.")
    retention: str = Field("30d", description="Prometheus' retention.")
    group_wait: str = Field("30s", description="How long Alertmanager gathers a group's first alerts.")
    group_interval: str = Field("5m", description="How long Alertmanager waits between a group's notifications.")
    repeat_interval: str = Field("4h", description="How often Alertmanager repeats a firing alert.")


class Etcd(Settings):
    members: list[str] | None = Field(
        None,
        description="etcd's members (an odd number) when PostgreSQL is replicated. Default: the first three nodes.",
    )


class Upgrades(Settings):
    held: Literal["hold", "roll"] = Field(
        "hold", description="roll: a deploy run upgrades the held cluster packages node by node (docs/ha.md)."
    )


class Components(Settings):
    """The inventory's ``components:`` mapping; a component left out has every default."""

    base: Base = Field(default_factory=Base)
    firewall: Firewall = Field(default_factory=Firewall)
    postgres: Postgres = Field(default_factory=Postgres)
    timescaledb: Timescaledb = Field(default_factory=Timescaledb)
    qdrant: Qdrant = Field(default_factory=Qdrant)
    neo4j: Neo4j = Field(default_factory=Neo4j)
    vllm: Vllm = Field(default_factory=Vllm)
    nightly: Nightly = Field(default_factory=Nightly)
    memoryctl: Memoryctl = Field(default_factory=Memoryctl)
    backup: Backup = Field(default_factory=Backup)
    monitoring: Monitoring = Field(default_factory=Monitoring)
    etcd: Etcd = Field(default_factory=Etcd)
    upgrades: Upgrades = Field(default_factory=Upgrades)

    @model_validator(mode="before")
    @classmethod
    def _empty_is_default(cls, value: Any) -> Any:
        """``neo4j:`` with nothing under it (YAML null) is the component with its defaults."""
        if isinstance(value, dict):
            return {name: ({} if settings is None else settings) for name, settings in value.items()}
        return value


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The settings class an error location points into (for the names it knows)."""
    model: type[BaseModel] = Components
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return model
        inner = [arg for arg in (field.annotation, *typing.get_args(field.annotation)) if isinstance(arg, type)]
        found = next((arg for arg in inner if issubclass(arg, BaseModel)), None)
        if found is None:
            return model
        model = found
    return model


def _describe(error: Any) -> str:
    loc = tuple(error["loc"])
    where = "components." + ".".join(map(str, loc)) if loc else "components"
    if error["type"] == "extra_forbidden":
        known = sorted((_model_at(loc[:-1]) or Components).model_fields)
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        return f"{where}: no such setting ({hint}known: {', '.join(known)})"
    if error["type"] == "missing":
        return f"{where}: required"
    return f"{where}: {error['msg']} (got {error['input']!r})"


def parse(raw: Any, where: str) -> Components:
    """``components:`` of an inventory (``where`` names its file), validated; an :class:`InventoryError`
    saying each wrong key otherwise."""
    try:
        return Components.model_validate({} if raw is None else raw)
    except ValidationError as exc:
        raise InventoryError(f"{where}: " + "; ".join(_describe(e) for e in exc.errors())) from None


def with_settings(components: Components, overrides: dict[str, dict[str, Any]], where: str) -> Components:
    """``components`` with some settings replaced (per component, key by key), validated again."""
    stated = components.model_dump(exclude_unset=True)
    return parse(
        {**stated, **{name: {**stated.get(name, {}), **settings} for name, settings in overrides.items()}}, where
    )


def _type_name(annotation: Any) -> str:
    """A setting's type as the docs table writes it."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(map(str, args))
    if origin in (typing.Union, types.UnionType):
        named = [_type_name(arg) for arg in args if arg is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in args else "")
    if origin is list:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    name = getattr(annotation, "__name__", str(annotation))
    return "int" if name == "StrictInt" or "StrictInt" in str(annotation) else name


def _default_text(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "(none)"
    if isinstance(value, BaseModel):
        return "(below)"
    return "`" + json.dumps(value) + "`" if not isinstance(value, str) else f"`{value}`"


def settings_rows(model: type[BaseModel] = Components, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(setting, type, default, what it does) for every setting, nested ones after their parent."""
    rows: list[tuple[str, str, str, str]] = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        inner = [arg for arg in (field.annotation, *typing.get_args(field.annotation)) if isinstance(arg, type)]
        nested = next((arg for arg in inner if issubclass(arg, BaseModel)), None)
        if model is not Components:
            rows.append((dotted, _type_name(field.annotation), _default_text(field), field.description or ""))
        if nested is not None:
            rows += settings_rows(nested, f"{dotted}.")
    return rows


def settings_table() -> str:
    """docs/deploy.md's table of ``components:`` (tests/deploy/unit/test_components.py keeps them equal)."""
    lines = ["| setting | type | default | what it does |", "|---|---|---|---|"]
    cells = [[cell.replace("|", "\\|") for cell in row] for row in settings_rows()]
    lines += [f"| `{name}` | {kind} | {default} | {text} |" for name, kind, default, text in cells]
    return "\n".join(lines)


if __name__ == "__main__":
    print(settings_table())
