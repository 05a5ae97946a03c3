"""The reboot decision for the NVIDIA driver (deploy/gpuboot.py), as a table: reboot only when it
helps, never twice for one cause, otherwise stop with the diagnosis."""

from __future__ import annotations

from dataclasses import replace

import pytest

from deploy.gpuboot import BootState, decide, parse_report

KERNEL = "6.12.57+deb13-amd64"
# A node whose driver was installed by an earlier run and whose DKMS module is built, not loaded.
BUILT = BootState(
    loaded=False,
    boot_kernel=KERNEL,
    running_kernel=KERNEL,
    dkms_installed=True,
    dkms_log="",
    headers=True,
    secure_boot=False,
    driver="550.163.01",
    last_cause="",
)
BUILT_CAUSE = f"module 550.163.01 built for {KERNEL}, not loaded"
CHANGED_CAUSE = f"driver packages changed to 550.163.01 on {KERNEL}"
NEW_KERNEL = "6.12.63+deb13-amd64"
FAILED = replace(BUILT, dkms_installed=False, boot_kernel=NEW_KERNEL, headers=False, dkms_log="error: nv.o failed")

TABLE = [
    # (case, state, action, the cause or a fragment of the diagnosis)
    ("loaded, nothing changed", replace(BUILT, loaded=True), "none", "loaded"),
    ("loaded, driver packages changed", replace(BUILT, loaded=True, driver_changed=True), "reboot", CHANGED_CAUSE),
    (
        "first install: packages changed",
        replace(BUILT, dkms_installed=False, driver_changed=True),
        "reboot",
        BUILT_CAUSE,
    ),
    ("module built, not loaded", BUILT, "reboot", BUILT_CAUSE),
    ("same cause again after a reboot", replace(BUILT, last_cause=BUILT_CAUSE), "stop", "already rebooted once"),
    ("DKMS failed for the new kernel", FAILED, "stop", f"not installed nvidia 550.163.01 for kernel {NEW_KERNEL}"),
    ("Secure Boot on, not loaded", replace(BUILT, secure_boot=True), "stop", "Secure Boot is on"),
    (
        "Secure Boot on, packages changed",
        replace(BUILT, secure_boot=True, driver_changed=True),
        "stop",
        "mokutil --import",
    ),
    (
        "Secure Boot on, loaded, changed",
        replace(BUILT, loaded=True, secure_boot=True, driver_changed=True),
        "reboot",
        CHANGED_CAUSE,
    ),
    (
        "changed again after that reboot",
        replace(BUILT, loaded=True, driver_changed=True, last_cause=CHANGED_CAUSE),
        "stop",
        "already rebooted once",
    ),
]


@pytest.mark.parametrize(("case", "state", "action", "said"), TABLE, ids=[row[0] for row in TABLE])
def test_the_reboot_decision_table(case: str, state: BootState, action: str, said: str) -> None:
    decision = decide(state)
    assert (decision.action, said in decision.cause) == (action, True), case


def test_a_dkms_failure_says_why() -> None:
    cause = decide(FAILED).cause
    assert f"MISSING (install linux-headers-{NEW_KERNEL})" in cause and "make.log ends: error: nv.o failed" in cause
    assert f"running {KERNEL}" in cause


def test_the_nodes_report_is_read() -> None:
    report = [
        "loaded=",
        f"boot_kernel={KERNEL}",
        f"running_kernel={KERNEL}",
        "dkms_installed=1",
        "dkms_log=",
        "headers=1",
        "secure_boot=SecureBoot enabled",
        f"last_cause={BUILT_CAUSE}",
    ]
    state = parse_report(report, "550.163.01")
    assert state == replace(BUILT, secure_boot=True, last_cause=BUILT_CAUSE)
    assert parse_report([], "550.163.01").secure_boot is None  # no mokutil: no EFI, nothing to refuse
