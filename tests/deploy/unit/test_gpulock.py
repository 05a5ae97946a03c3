"""The GPU node's lock (deploy/locks/vllm.txt): it parses, every pin is hashed, one CUDA line, the
chain check covers it, and the vLLM STAND-IN claims the version the lock installs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deploy import gpulock, versions
from deploy.osrelease import RELEASES
from deploy.versions import IncompatibleVersions

REPO = Path(__file__).resolve().parents[3]
STANDIN = REPO / "tests" / "lora" / "vllm_standin.py"


def test_the_lock_parses_every_line_is_hashed_and_it_is_on_one_cuda_line() -> None:
    lock = gpulock.load()
    text = gpulock.LOCK.read_text()
    pins = [line for line in text.splitlines() if re.match(r"^[A-Za-z0-9]", line)]
    assert len(pins) == len(lock) > 100  # every requirement line became one hashed package
    assert all(package.hashes for package in lock.values())
    assert gpulock.cuda_line(lock) == versions.VLLM_CUDA[versions.VLLM] == "12.9"
    assert gpulock.version(lock, "vllm") == versions.VLLM
    assert gpulock.version(lock, "torch") == versions.torch_build(versions.VLLM).torch
    overrides = gpulock.parse_pins((gpulock.LOCKS / "vllm-cuda.txt").read_text())
    assert all(gpulock.version(lock, name) == version for name, version in overrides.items())


def test_the_inputs_of_the_lock_are_the_deploys_pins() -> None:
    inputs = gpulock.parse_pins((gpulock.LOCKS / "vllm.in").read_text())
    lock = gpulock.load()
    assert inputs["vllm"] == versions.VLLM
    assert all(gpulock.version(lock, name) == version for name, version in inputs.items())
    dev = re.search(r'"xgrammar==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert dev is not None and inputs["xgrammar"] == dev[1]  # the contract's xgrammar is the node's


def test_the_standin_claims_the_locked_vllm() -> None:
    lock = gpulock.load()
    text = STANDIN.read_text()
    claimed = set(re.findall(r"vLLM (\d+\.\d+\.\d+)", text))
    assert claimed == {gpulock.version(lock, "vllm")}
    assert f'VLLM_VERSION = "{gpulock.version(lock, "vllm")}"' in text
    assert (REPO / "tests" / "fixtures" / f"vllm-{gpulock.version(lock, 'vllm')}").is_dir()


BAD = [
    ("torch==2.10.0\n", "torch==2.10.0 has no --hash"),
    ("torch>=2.10\n    --hash=sha256:" + "a" * 64 + "\n", "not a name==version pin"),
    ("--hash=sha256:" + "a" * 64 + "\n", "a hash outside a requirement"),
    (("a==1 \\\n    --hash=sha256:" + "b" * 64 + "\n") * 2, "a is pinned twice"),
    ("", "no requirements"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_a_broken_lock_is_refused_with_the_line(text: str, message: str) -> None:
    with pytest.raises(gpulock.LockError, match=re.escape(message)):
        gpulock.parse(text)


def _lock(**pins: str) -> dict[str, gpulock.Locked]:
    return {name: gpulock.Locked(name, version, ("0" * 64,)) for name, version in pins.items()}


BASE = {"vllm": "0.19.1", "torch": "2.10.0", "nvidia-cublas-cu12": "12.9.1.4", "nvidia-cuda-runtime-cu12": "12.9.79"}


def test_the_chain_check_extends_to_the_whole_lock() -> None:
    trixie = RELEASES[13]
    assert versions.check_gpu_stack(trixie, "0.19.1", _lock(**BASE)).cuda == "12.9"
    two_lines = {**BASE, "nvidia-cublas-cu12": "12.8.4.1"}
    with pytest.raises(IncompatibleVersions, match=r"not on one CUDA line \(nvidia-cublas-cu12 12.8, "):
        versions.check_gpu_stack(trixie, "0.19.1", _lock(**two_lines))
    with pytest.raises(IncompatibleVersions, match="mixes CUDA majors: nvidia-cublas-cu13"):
        versions.check_gpu_stack(trixie, "0.19.1", _lock(**BASE, **{"nvidia-cublas-cu13": "13.0.0.19"}))
    on_128 = {**BASE, "nvidia-cublas-cu12": "12.8.4.1", "nvidia-cuda-runtime-cu12": "12.8.90"}
    with pytest.raises(IncompatibleVersions, match=r"is on CUDA 12.8; vLLM 0.19.1 is built for CUDA 12.9"):
        versions.check_gpu_stack(trixie, "0.19.1", _lock(**on_128))
    with pytest.raises(IncompatibleVersions, match=r"pins vllm 0.19.1 and torch 2.9.0"):
        versions.check_gpu_stack(trixie, "0.19.1", _lock(**{**BASE, "torch": "2.9.0"}))
    old_driver = trixie.__class__(**{**trixie.__dict__, "nvidia_driver": "520.61.05"})
    with pytest.raises(IncompatibleVersions, match=r"needs an NVIDIA driver >= 525.60.13"):
        versions.check_gpu_stack(old_driver, "0.19.1", _lock(**BASE))


# The GPU node's marker environment (Debian 13: CPython 3.13.5, x86_64).
NODE = {
    "python_version": "3.13",
    "python_full_version": "3.13.5",
    "platform_machine": "x86_64",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}


def test_every_requirement_of_the_locked_vllm_is_in_the_lock_at_an_allowed_version() -> None:
    """An offline resolver check, one level deep: vLLM 0.19.1's own ``Requires-Dist`` (read from its
    wheel's METADATA: tests/fixtures/vllm-0.19.1/requires_dist.txt), evaluated for the node, each
    satisfied by the lock (the whole closure was resolved by uv: scripts/lock-gpu)."""
    from packaging.requirements import Requirement

    lock = gpulock.load()
    fixture = REPO / "tests" / "fixtures" / f"vllm-{gpulock.version(lock, 'vllm')}" / "requires_dist.txt"
    unmet = []
    applied = 0
    for line in fixture.read_text().splitlines():
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate(NODE):
            continue
        applied += 1
        locked = lock.get(gpulock.normalise(requirement.name))
        if locked is None or not requirement.specifier.contains(locked.version, prereleases=True):
            unmet.append(f"{requirement} (lock: {locked.version if locked else 'missing'})")
    assert applied > 50 and unmet == []


def test_the_training_lock_is_memoryctl_loras_closure_on_the_vllm_locks_torch_and_cuda_line() -> None:
    """deploy/locks/lora.txt (issue 41 item 5): what the GPU node installs its training venv from,
    hashed, on the vLLM lock's torch, Triton and CUDA libraries, with every requirement of
    memoryctl-lora at the version the tests train with (constraints.txt, its Python >= 3.12 lines)."""
    training = gpulock.parse(gpulock.LORA_LOCK.read_text(), "lora.txt")
    serving = gpulock.load()
    assert len(training) > 50 and all(package.hashes for package in training.values())
    assert gpulock.cuda_line(training) == gpulock.cuda_line(serving) == "12.9"
    torch_side = [name for name in training if name in ("torch", "triton") or name.startswith(("nvidia-", "cuda-"))]
    assert "torch" in torch_side and len(torch_side) > 10
    assert all(training[name].version == serving[name].version for name in torch_side), torch_side
    pyproject = (REPO / "lora" / "pyproject.toml").read_text()
    required = {gpulock.normalise(m) for m in re.findall(r'^    "([A-Za-z0-9_.-]+)[=<>]', pyproject, re.M)}
    assert required - set(training) == {"memoryctl"}  # memoryctl comes from the controller's wheelhouse
    tested = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        pin = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;]+)(.*)$", line)
        if pin and "< '3.12'" not in pin[3]:
            tested[gpulock.normalise(pin[1])] = pin[2]
    inputs = gpulock.parse_pins((gpulock.LOCKS / "lora.in").read_text())
    assert all(training[gpulock.normalise(name)].version == version for name, version in inputs.items())
    held = {
        name: (p.version, tested[name]) for name, p in training.items() if name in tested and name not in torch_side
    }
    assert all(locked == wanted for locked, wanted in held.values()), held
