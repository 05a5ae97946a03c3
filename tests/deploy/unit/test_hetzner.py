"""The production path: ``inventory/hetzner.example.yaml`` planned as a new operator would run it.

A temporary home directory holds the keys the example names with ``~`` (expanded on the
controller); the sha256s the operator copies from Qdrant's and Neo4j's release pages are filled
in. Then every node's whole plan (deploy/roles.py) is built from fact fixtures of fresh Debian 13
servers, and each property the production path needs is checked on it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

import pytest
import yaml

import deploy.wheelhouse
from deploy import versions
from deploy.artefacts import ArtefactSourceError
from deploy.monitoring import MonitoringSettingsError, monitoring
from deploy.osrelease import RELEASES, UnsupportedRelease
from deploy.postgres import PostgresSettingsError, postgresql
from deploy.qdrant import qdrant
from deploy.roles import everything
from deploy.settings import REPO, load_inventory
from deploy.versions import IncompatibleVersions
from deploy.vllm import vllm
from tests.deploy.unit.plans import (
    DEBIAN_13,
    EXAMPLE,
    LOCAL,
    NODES,
    OPERATOR_DOWNLOADS,
    OPERATOR_KEY,
    RELEASE_SHA256,
    Plan,
    example_inventory,
    fill_sha256,
    plan,
)

TIMESCALE_KEY = "0641009A8366FDE4444A7B62E7391C94080429FF"


def _commands(p: Plan) -> list[str]:
    return [c for op in p.ops for c in op.commands]


def test_example_plans_clean_with_keys_from_the_operators_home(
    plans: dict[str, Plan], inventory: Path, home: Path
) -> None:
    assert all(p.ops for p in plans.values())
    host = load_inventory(inventory).host_data("mem-db")
    assert host["ssh_key"] == str(home / ".ssh" / "id_ed25519")  # `~` expanded on the controller
    for p in plans.values():
        admin = p.op("Admin user ops")
        assert any(OPERATOR_KEY in c for c in admin.commands), admin.commands


def test_a_missing_admin_key_is_named_at_plan_time(tmp_path: Path, home: Path) -> None:
    (home / ".ssh" / "id_ed25519.pub").unlink()
    with pytest.raises(ValueError, match=r"base.admin_keys: ~/.ssh/id_ed25519.pub .* cannot be read"):
        plan(everything, "mem-db", inventory=example_inventory(tmp_path, fill_sha256))


def test_the_placeholder_sha256_is_refused_before_anything_runs(tmp_path: Path, home: Path) -> None:
    with pytest.raises(ArtefactSourceError, match=r"'REPLACE-WITH-THE-RELEASE-SHA256' is not a sha256 .*release page"):
        plan(qdrant, "mem-index", inventory=EXAMPLE)

    def no_sha256(doc: dict[str, Any]) -> None:
        del doc["components"]["qdrant"]["source"]["sha256"]

    with pytest.raises(ArtefactSourceError, match=r"needs its sha256"):
        plan(qdrant, "mem-index", inventory=example_inventory(tmp_path, no_sha256))


def test_the_example_without_a_receiver_stops_at_plan_time(tmp_path: Path, home: Path) -> None:
    """Alerts that reach nobody are refused like a missing sha256: on every node, before anything runs."""

    def no_receiver(doc: dict[str, Any]) -> None:
        fill_sha256(doc)
        del doc["components"]["monitoring"]["receiver"]

    for node in NODES:
        with pytest.raises(MonitoringSettingsError, match=r"^components.monitoring.receiver: cluster 'hetzner' has no"):
            plan(everything, node, inventory=example_inventory(tmp_path, no_receiver), facts=OPERATOR_DOWNLOADS)

    def as_shipped(doc: dict[str, Any]) -> None:
        for name in ("qdrant", "neo4j"):
            doc["components"][name]["source"]["sha256"] = RELEASE_SHA256

    placeholder = r"receiver.email_configs\[0\].\w+: 'REPLACE-WITH-[A-Z-]+' is a placeholder"
    with pytest.raises(MonitoringSettingsError, match=placeholder):
        plan(monitoring, "mem-gpu", inventory=example_inventory(tmp_path, as_shipped))


def test_versions_come_from_one_place_and_match_the_local_nodes(plans: dict[str, Plan]) -> None:
    download = " ".join(plans["mem-index"].op("Download qdrant (sha256 checked)").commands)
    # The static -musl archive: no glibc floor (the -gnu one has needed GLIBC_2.38).
    url = (
        f"https://github.com/qdrant/qdrant/releases/download/v{versions.QDRANT}/qdrant-x86_64-unknown-linux-musl.tar.gz"
    )
    assert url in download and RELEASE_SHA256 in download
    neo = " ".join(plans["mem-index"].op("Download neo4j (sha256 checked)").commands)
    assert f"https://dist.neo4j.org/neo4j-community-{versions.NEO4J}-unix.tar.gz" in neo and RELEASE_SHA256 in neo
    timescale = " ".join(plans["mem-db"].op(f"TimescaleDB {versions.TIMESCALEDB}").commands)
    assert f"timescaledb-2-postgresql-17={versions.TIMESCALEDB}~debian13" in timescale
    pin = plans["mem-db"].upload("/etc/apt/preferences.d/memoryctl-timescaledb")
    assert f"Pin: version {versions.TIMESCALEDB}~debian13" in pin
    # Neither inventory restates a version.
    for path in (EXAMPLE, LOCAL):
        components = yaml.safe_load(path.read_text())["components"]
        assert [name for name, c in components.items() if "version" in c] == [], path
    # The local nodes' stand-in and the Maven build carry the same versions.
    local = yaml.safe_load(LOCAL.read_text())["components"]
    assert "{version}" in local["qdrant"]["source"]["url"] and "{version}" in local["neo4j"]["source"]["url"]
    pom = (REPO / "scripts" / "neo4j" / "pom.xml").read_text()
    assert f"<neo4j.version>{versions.NEO4J}</neo4j.version>" in pom


def test_postgres_major_is_the_releases(plans: dict[str, Plan], tmp_path: Path) -> None:
    db = plans["mem-db"]
    assert db.op("PostgreSQL | PostgreSQL").commands[-1].endswith("postgresql-17")
    assert "shared_preload_libraries = 'timescaledb'" in db.upload("/etc/postgresql/17/main/conf.d/memoryctl.conf")
    assert "Restart postgresql@17-main" in " ".join(db.names())
    assert not any("pgdg" in name for name in db.names())

    def stated(doc: dict[str, Any]) -> None:
        fill_sha256(doc)
        doc["components"]["postgres"]["version"] = 16

    with pytest.raises(PostgresSettingsError, match=r"Debian 13 \(trixie\) ships PostgreSQL 17"):
        plan(postgresql, "mem-db", inventory=example_inventory(tmp_path, stated))


def test_timescales_repository_is_signed_by_the_listed_key_only(plans: dict[str, Plan], inventory: Path) -> None:
    p = plans["mem-db"]
    key = " ".join(p.op("timescaledb apt key (fingerprints checked)").commands)
    assert "curl -fsSL --retry 3" in key and "https://packagecloud.io/timescale/timescaledb/gpgkey" in key
    assert f"grep -qx {TIMESCALE_KEY}" in key and "refusing it" in key
    assert f"gpg --batch --export {TIMESCALE_KEY}" in key and "/etc/apt/keyrings/timescaledb.gpg" in key
    repo = " ".join(p.op("timescaledb apt repository").commands)
    line = "deb [signed-by=/etc/apt/keyrings/timescaledb.gpg] https://packagecloud.io/timescale/timescaledb/debian/"
    assert f"{line} trixie main" in repo and "/etc/apt/sources.list.d/timescaledb.list" in repo
    assert not p.op("Refresh apt lists (timescaledb").conditional  # a fresh server has no lists of it
    held = plan(
        postgresql,
        "mem-db",
        {
            "KeyringFingerprints": [TIMESCALE_KEY],
            "File": lambda path, **_: {"mode": 644} if path.startswith("/var/lib/apt/lists/") else None,
            "DebPackages": {"timescaledb-2-postgresql-17": {f"{versions.TIMESCALEDB}~debian13"}},
        },
        inventory=inventory,
    )
    assert "timescaledb apt key" not in " ".join(held.names())  # the keyring holds exactly that key
    assert held.op("Refresh apt lists (timescaledb").conditional


def test_a_key_without_the_listed_fingerprint_is_refused_on_the_node(tmp_path: Path) -> None:
    """The key step itself, run here: a key file that lacks the fingerprint fails, naming what it holds."""
    if shutil.which("gpg") is None or shutil.which("curl") is None:
        pytest.skip("gpg and curl needed")
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    uid = "test key <test@memoryctl.invalid>"
    gen = ["gpg", "--batch", "--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "0"]
    subprocess.run(gen, env=env, check=True, capture_output=True)
    listed = subprocess.run(["gpg", "--with-colons", "-K"], env=env, check=True, capture_output=True, text=True)
    fingerprint = next(line.split(":")[9] for line in listed.stdout.splitlines() if line.startswith("fpr:"))
    key = tmp_path / "gpgkey"
    key.write_bytes(subprocess.run(["gpg", "--armor", "--export"], env=env, check=True, capture_output=True).stdout)
    keyring = tmp_path / "keyring.gpg"
    for wanted, ok in ((fingerprint, True), (TIMESCALE_KEY, False)):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("deploy.aptsources.KEYRINGS", str(tmp_path))
            command = _key_command(f"file://{key}", [wanted])
        command = command.replace(f"{tmp_path}/timescaledb.gpg", str(keyring))
        result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
        assert (result.returncode == 0) is ok, result.stderr
        if ok:
            shown = subprocess.run(
                ["gpg", "--show-keys", "--with-colons", str(keyring)], capture_output=True, text=True
            )
            assert f"fpr:::::::::{fingerprint}:" in shown.stdout
        else:
            assert f"does not hold the key(s) {TIMESCALE_KEY}" in result.stderr and fingerprint in result.stderr


def _key_command(url: str, wanted: list[str]) -> str:
    from pyinfra.api import Config, Inventory, State
    from pyinfra.context import ctx_host, ctx_state

    from deploy.aptsources import trusted_key

    state = State(Inventory(([("h", {})], {})), Config())
    host = state.inventory.get_host("h")
    with ctx_state.use(state), ctx_host.use(host), _no_facts():
        trusted_key("timescaledb", url, wanted)
        (op_hash,) = state.get_op_order()
        (command,) = [str(c) for c in state.get_op_data_for_host(host, op_hash).command_generator()]
    return command


def _no_facts() -> Any:
    from tests.deploy.unit.plans import _facts

    return _facts({})


def test_no_plan_uses_apt_key(plans: dict[str, Plan]) -> None:
    for name, p in plans.items():
        assert not [c for c in _commands(p) if "apt-key" in c], name


def test_only_debian_13_is_deployed_onto(inventory: Path) -> None:
    bookworm = {**DEBIAN_13, "major": 12, "release_meta": {"PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)"}}
    with pytest.raises(
        UnsupportedRelease, match=r"runs Debian GNU/Linux 12 \(bookworm\); .* Debian 13 \(trixie\) only"
    ):
        plan(everything, "mem-db", {"LinuxDistribution": bookworm}, inventory=inventory)
    ubuntu = {"name": "Ubuntu", "major": 24, "minor": 4, "release_meta": {"PRETTY_NAME": "Ubuntu 24.04 LTS"}}
    with pytest.raises(UnsupportedRelease, match=r"runs Ubuntu 24\.04 LTS"):
        plan(everything, "mem-gpu", {"LinuxDistribution": ubuntu}, inventory=inventory)


def test_one_shot_steps_are_checked_every_run(inventory: Path) -> None:
    """Installed packages, but what their first run should have done is missing: planned again."""
    pin = f"{versions.TIMESCALEDB}~debian13"
    packages = {"postgresql-17": {"17.12-0+deb13u1"}, "timescaledb-2-postgresql-17": {pin}}
    facts = {"DebPackages": packages, "Users": {"postgres": {}}, "PostgresRoles": {"memoryctl": {}}}
    pg = plan(
        postgresql,
        "mem-db",
        {**facts, "PostgresExtensions": {}, "PostgresPreloaded": ["timescaledb"]},
        inventory=inventory,
    )
    assert not pg.op("TimescaleDB extension").conditional
    marker = f"/opt/qdrant/{versions.QDRANT}/.memoryctl-installed"
    installed = plan(
        qdrant, "mem-index", {"File": lambda path, **_: {"mode": 644} if path == marker else None}, inventory=inventory
    )
    assert not any("Download qdrant" in name or "Unpack" in name for name in installed.names())


def test_the_wheelhouse_is_built_for_the_nodes_platform_whatever_the_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller on another OS, architecture and Python still fetches Debian 13 / CPython 3.13 /
    x86_64 wheels; only the pure-Python memoryctl wheel is built locally."""
    commands: list[list[str]] = []
    real_run = subprocess.run

    def run(command: list[str], *args: Any, **kwargs: Any) -> Any:
        if command[:3] != [sys.executable, "-m", "pip"]:
            return real_run(command, *args, **kwargs)  # git archive, tar: the real source export
        commands.append(command)
        if command[3] == "wheel":
            (Path(command[command.index("--wheel-dir") + 1]) / "memoryctl-0.1.0-py3-none-any.whl").write_bytes(b"w")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(deploy.wheelhouse.subprocess, "run", run)
    monkeypatch.setattr(sys, "platform", "darwin")
    deploy.wheelhouse._build(tmp_path / "wheelhouse", deploy.wheelhouse.node_platform(RELEASES[13]))
    build, download = commands
    assert build[3] == "wheel" and "--no-deps" in build
    assert download[3] == "download" and "--only-binary=:all:" in download and download[-1] == "memoryctl"
    platforms = [download[i + 1] for i, arg in enumerate(download) if arg == "--platform"]
    assert platforms[0] == "manylinux_2_41_x86_64" and "manylinux_2_17_x86_64" in platforms
    assert "manylinux2014_x86_64" in platforms and not [p for p in platforms if "macosx" in p or "aarch64" in p]
    assert download[download.index("--python-version") + 1] == "3.13"
    assert download[download.index("--implementation") + 1] == "cp"
    assert [download[i + 1] for i, arg in enumerate(download) if arg == "--abi"] == ["cp313", "abi3", "none"]


def test_the_gpu_node_gets_its_driver_once_and_vllm_in_a_venv(inventory: Path) -> None:
    p = plan(vllm, "mem-gpu", inventory=inventory)
    assert any("python3 -m venv /opt/vllm/venv" in c for c in p.op("Python venv (venv module)").commands)
    sources = p.upload("/etc/apt/sources.list.d/debian-non-free.sources")
    assert "Components: contrib non-free non-free-firmware" in sources
    assert "Suites: trixie trixie-updates" in sources and "Suites: trixie-security" in sources
    driver = " ".join(p.op("NVIDIA driver 550.163.01 (non-free)").commands)
    packages = ("nvidia-driver", "libcuda1", "linux-headers-amd64", "firmware-misc-nonfree", "nvidia-smi")
    assert all(pkg in driver for pkg in packages)  # libcuda1: no_recommends would leave it out
    pin = p.upload("/etc/apt/preferences.d/memoryctl-nvidia")
    assert "Package: src:nvidia-graphics-drivers" in pin and "Pin: version 550.163.01-*" in pin
    held = p.upload("/etc/apt/apt.conf.d/53unattended-upgrades-nvidia-memoryctl")
    assert "Unattended-Upgrade::Package-Blacklist" in held and '"libcuda1";' in held
    assert all(
        pkg in " ".join(p.op("C compiler and Python headers").commands) for pkg in ("build-essential", "python3-dev")
    )
    install = " ".join(p.op(f"vLLM {versions.VLLM} with torch 2.10.0 (CUDA 12.9) from the lock").commands)
    assert "venv/bin/pip install --require-hashes --no-deps --only-binary :all: -r /opt/vllm/vllm.lock" in install
    check = p.op("GPU: what vLLM does first")
    assert all(part in check.commands[0] for part in ("import vllm", "torch.bfloat16", "get_arch_list"))
    assert "nvidia-smi" not in check.commands[0]
    names = p.names()
    reboot = names.index("vLLM | Reboot to load the NVIDIA driver (once per cause)")
    assert names.index(next(n for n in names if "NVIDIA driver 550.163.01" in n)) < reboot
    assert reboot < names.index(check.name) < names.index("vLLM | Render /etc/vllm/vllm.env")
    loaded = plan(
        vllm,
        "mem-gpu",
        {
            "NvidiaBoot": ["loaded=1", "boot_kernel=6.12.57+deb13-amd64", "dkms_installed=1"],
            "CudaDevice": "ok   import vllm: vllm 0.19.1\nok   bf16 matmul: NVIDIA RTX 4000 SFF Ada Generation",
        },
        inventory=inventory,
    )
    assert not any("GPU: what vLLM does first" in name for name in loaded.names())
    # Loaded: a reboot only if this run changes the driver packages (planned on that condition).
    reboot = loaded.op("Reboot to load the NVIDIA driver (once per cause)")
    cause = " ".join(loaded.op("Write down why the node reboots").commands)
    assert reboot.conditional and "driver packages changed to 550.163.01" in cause
    assert not any("Stop:" in name for name in loaded.names())
    broken = plan(
        vllm, "mem-gpu", {"CudaDevice": "RuntimeError: CUDA driver version is insufficient"}, inventory=inventory
    )
    assert not broken.op("GPU: what vLLM does first").conditional  # planned again, and it fails the run


def test_an_inconsistent_gpu_stack_is_refused_at_plan_time(inventory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.33.0 pins torch 2.14.0, a CUDA 13 build, which needs driver >= 580; Debian 13 ships 550."""
    monkeypatch.setattr(versions, "VLLM", "0.33.0")
    message = (
        r"vLLM 0.33.0 needs torch 2.14.0, built for CUDA 13.0, which needs an NVIDIA driver >= 580.65.06; Debian 13"
    )
    with pytest.raises(IncompatibleVersions, match=message):
        plan(vllm, "mem-gpu", inventory=inventory)
    monkeypatch.setattr(versions, "VLLM", "0.99.0")
    with pytest.raises(IncompatibleVersions, match="no torch/CUDA data"):
        plan(vllm, "mem-gpu", inventory=inventory)
    build = versions.check_gpu_stack(RELEASES[13], "0.19.1")
    assert (build.torch, build.cuda_major) == ("2.10.0", 12)


def test_the_qdrant_archives_glibc_floor_is_checked_at_plan_time() -> None:
    older = replace(RELEASES[13], glibc=(2, 36))
    gnu = "https://github.com/qdrant/qdrant/releases/download/v1.19.0/qdrant-x86_64-unknown-linux-gnu.tar.gz"
    musl = gnu.replace("-gnu", "-musl")
    with pytest.raises(
        IncompatibleVersions, match=r"needs glibc 2.38; Debian 13 \(trixie\) has 2.36: take the .*-musl"
    ):
        versions.check_glibc(older, gnu, None)
    versions.check_glibc(older, musl, None)
    versions.check_glibc(older, gnu, "2.34")  # a binary whose floor was measured
    versions.check_glibc(RELEASES[13], gnu, None)


def test_without_leave_to_reboot_the_gpu_node_stops_and_says_why(tmp_path: Path, home: Path) -> None:
    def no_reboot(doc: dict[str, Any]) -> None:
        fill_sha256(doc)
        doc["components"]["vllm"]["gpu"]["reboot"] = False

    p = plan(vllm, "mem-gpu", inventory=example_inventory(tmp_path, no_reboot))
    stop = p.op("Stop: the NVIDIA driver needs a reboot")
    assert "reboot the node, then deploy again" in stop.commands[0] and stop.commands[0].endswith("exit 1")
    assert not any("| Reboot to load the NVIDIA driver" in name for name in p.names())


def test_vllm_models_fit_the_gex44(inventory: Path) -> None:
    """Both instances share one 20 GB GPU (docs/deploy.md has the arithmetic)."""
    p = plan(vllm, "mem-gpu", inventory=inventory)
    generate, embed = p.upload("/etc/vllm/generate.args"), p.upload("/etc/vllm/embed.args")
    assert "MODEL=Qwen/Qwen2.5-7B-Instruct-AWQ" in generate and "MODEL=BAAI/bge-m3" in embed
    shares = [
        float(share) for args in (generate, embed) for share in re.findall(r"--gpu-memory-utilization ([0-9.]+)", args)
    ]
    assert len(shares) == 2 and sum(shares) <= 0.9, shares  # room for two CUDA contexts
    assert "--max-model-len 8192" in generate and "--max-lora-rank 16" in generate and "--max-loras 2" in generate


def test_pyinfra_is_pinned_to_the_tested_range() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"pyinfra>=3.10,<3.11"' in pyproject
    major, minor = (int(x) for x in installed_version("pyinfra").split(".")[:2])
    assert (major, minor) == (3, 10)


def test_the_gpu_nodes_training_venv_comes_from_its_lock_not_through_the_controller(
    inventory: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 41 item 5: on a GPU node the nightly's venv installs deploy/locks/lora.txt from PyPI
    itself (hashes required); the controller sends memoryctl-lora's own wheel, built without
    memoryctl-lora installed on the controller (its closure is not read from the controller)."""
    import deploy.lora_wheelhouse
    import deploy.nightly
    from deploy.nightly import nightly

    asked: list[tuple[str | None, bool]] = []
    wheels = tmp_path / "lora-wheels"
    wheels.mkdir()
    (wheels / "memoryctl_lora-0.1.0-py3-none-any.whl").write_bytes(b"w")
    monkeypatch.setattr(
        deploy.nightly, "lora_wheelhouse", lambda torch, closure=True: asked.append((torch, closure)) or wheels
    )
    p = plan(nightly, "mem-gpu", inventory=inventory)
    assert asked == [(None, False)]
    lock = " ".join(p.op("memoryctl-lora's closure with torch 2.10.0 (CUDA 12.9) from the lock").commands)
    assert (
        "/opt/memoryctl/venv/bin/pip install --require-hashes --no-deps --only-binary :all: -r /opt/memoryctl/lora.lock"
        in lock
    )
    assert p.upload("/opt/memoryctl/lora.lock") == f"<file {deploy.nightly.gpulock.LORA_LOCK}>"  # the file itself

    # The wheel build itself: memoryctl-lora's own wheel, nothing asked of the controller's installs.
    def not_installed(name: str) -> None:
        raise deploy.lora_wheelhouse.PackageNotFoundError(name)

    commands: list[list[str]] = []
    monkeypatch.setattr(deploy.lora_wheelhouse, "distribution", not_installed)

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        commands.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")

    monkeypatch.setattr(deploy.lora_wheelhouse.subprocess, "run", run)
    monkeypatch.setattr(deploy.lora_wheelhouse, "_export", lambda into: "lora")
    built = deploy.lora_wheelhouse._build(
        tmp_path / "house", deploy.wheelhouse.node_platform(RELEASES[13]), None, False
    )
    assert built == tmp_path / "house"
    pips = [cmd[3] for cmd in commands if cmd[1:3] == ["-m", "pip"]]
    assert pips == ["wheel"]  # memoryctl-lora's own wheel; no `pip download` of any dependency


def test_the_gpu_node_serves_bge_reranker_v2_m3_and_memoryctl_asks_it_first(plans: dict[str, Plan]) -> None:
    """vllm@rerank on the GPU node (vLLM's score API, a pooling model with its own share of the GPU,
    docs/nightly.md's budget); the db node's memoryctl.toml points the rerank stage at it, with the
    CPU cross-encoder installed beside it as the fallback, and leaves the rerank off by default."""
    rerank = plans["mem-gpu"].upload("/etc/vllm/rerank.args")
    assert "MODEL=BAAI/bge-reranker-v2-m3\n" in rerank and "PORT=8003" in rerank
    assert "--runner pooling --max-model-len 1024 --gpu-memory-utilization 0.08" in rerank
    # Every vLLM server the GPU node runs, with its share: together at most 0.9 of the GPU (CUDA
    # contexts and the night's training need the rest).
    shares = {
        dest: float(m.group(1))
        for op in plans["mem-gpu"].ops
        for dest, text in op.uploads.items()
        for m in [re.search(r"--gpu-memory-utilization ([0-9.]+)", text)]
        if m
    }
    assert len(shares) >= 3 and sum(shares.values()) <= 0.9, shares
    assert "--gpu-memory-utilization 0.64" in plans["mem-gpu"].upload("/etc/vllm/generate.args")
    config = plans["mem-db"].upload("/etc/memoryctl/memoryctl.toml")
    assert 'rerank_url = "http://10.77.0.3:8003"' in config
    assert 'rerank_model = "BAAI/bge-reranker-v2-m3"' in config
    assert 'rerank_model_dir = "/var/lib/memoryctl-models"' in config and "rerank = false" in config
    assert (
        "upload /var/lib/memoryctl-models/ms-marco-minilm-l12-int8/model.onnx"
        in plans["mem-db"].op("ms-marco-minilm-l12-int8/model.onnx").commands
    )
