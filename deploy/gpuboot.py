"""Whether the GPU node reboots for its NVIDIA driver: a pure decision over what the node reports.

A reboot helps in two cases only: the driver packages changed in this run (user-space libraries
newer than the loaded module break CUDA until the module is reloaded), or DKMS has built the module
for the kernel that will boot and it is not loaded yet. It does not help when DKMS failed to build
it (a kernel whose headers are missing, a compiler error), when Secure Boot refuses an unsigned
module, or when the deploy already rebooted for this very cause and the module still is not there:
then the run stops with the diagnosis (the DKMS log, ``mokutil --sb-state``, kernel vs headers).
The cause of a reboot (what, driver version, kernel) is written on the node before it, so one cause
never gets two reboots (docs/deploy.md "The NVIDIA driver and reboots").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MARKER = "/var/lib/memoryctl/nvidia-reboot.cause"


@dataclass(frozen=True)
class BootState:
    """What the node reports (:class:`deploy.facts.NvidiaBoot`), plus whether this run changed the driver."""

    loaded: bool  # /proc/driver/nvidia/version exists
    boot_kernel: str  # the newest installed kernel: the one that boots next
    running_kernel: str
    dkms_installed: bool  # DKMS reports the module installed for boot_kernel
    dkms_log: str  # the tail of DKMS's make.log when a build left one and nothing is installed
    headers: bool  # /usr/src/linux-headers-<boot_kernel> exists
    secure_boot: bool | None  # mokutil --sb-state (None: no mokutil, no EFI)
    driver: str  # the driver version the release pins
    last_cause: str  # the marker's content: the cause of the deploy's last reboot
    driver_changed: bool = False


@dataclass(frozen=True)
class Decision:
    action: Literal["none", "reboot", "stop"]
    cause: str  # the marker's content for a reboot; the diagnosis for a stop


def decide(state: BootState) -> Decision:
    if state.loaded and not state.driver_changed:
        return Decision("none", "the NVIDIA module is loaded")
    if state.driver_changed and state.loaded:
        cause = f"driver packages changed to {state.driver} on {state.boot_kernel}"
    else:
        cause = f"module {state.driver} built for {state.boot_kernel}, not loaded"
        if state.secure_boot:
            return Decision(
                "stop",
                f"Secure Boot is on (mokutil --sb-state): the DKMS module {state.driver} is not loaded. Enroll "
                "DKMS's key (mokutil --import /var/lib/dkms/mok.pub, confirm at the next boot's console) "
                "or turn Secure Boot off, then deploy again",
            )
        if not state.dkms_installed and not state.driver_changed:
            return Decision("stop", _dkms_diagnosis(state))
    if state.last_cause == cause:
        return Decision(
            "stop",
            f"the deploy already rebooted once for this cause ({cause}) and the module is still not loaded: "
            f"{_dkms_diagnosis(state)}",
        )
    return Decision("reboot", cause)


def _dkms_diagnosis(state: BootState) -> str:
    headers = "present" if state.headers else "MISSING (install linux-headers-" + state.boot_kernel + ")"
    log = f"; DKMS make.log ends: {state.dkms_log}" if state.dkms_log else "; DKMS left no build log"
    return (
        f"DKMS has not installed nvidia {state.driver} for kernel {state.boot_kernel} (running "
        f"{state.running_kernel}; its headers {headers}){log}; a reboot would not load it"
    )


# The node's report, one ``key=value`` a line (deploy/facts.py NvidiaBoot runs it).
REPORT = f"""
k=$(linux-version list 2>/dev/null | linux-version sort 2>/dev/null | tail -n1); k=${{k:-$(uname -r)}}
echo "loaded=$(test -e /proc/driver/nvidia/version && echo 1)"
echo "boot_kernel=$k"
echo "running_kernel=$(uname -r)"
echo "dkms_installed=$(dkms status -k "$k" 2>/dev/null | grep -q ': installed' && echo 1)"
echo "dkms_log=$(tail -n 3 /var/lib/dkms/nvidia*/*/build/make.log 2>/dev/null | tr '\\n' ' ' | cut -c1-400)"
echo "headers=$(test -d "/usr/src/linux-headers-$k" && echo 1)"
echo "secure_boot=$(mokutil --sb-state 2>/dev/null | head -n1)"
echo "last_cause=$(cat {MARKER} 2>/dev/null)"
"""


def parse_report(lines: list[str], driver: str) -> BootState:
    values = dict(line.split("=", 1) for line in lines if "=" in line)
    sb = values.get("secure_boot", "")
    return BootState(
        loaded=values.get("loaded") == "1",
        boot_kernel=values.get("boot_kernel", ""),
        running_kernel=values.get("running_kernel", ""),
        dkms_installed=values.get("dkms_installed") == "1",
        dkms_log=values.get("dkms_log", "").strip(),
        headers=values.get("headers") == "1",
        secure_boot=("enabled" in sb) if sb else None,
        driver=driver,
        last_cause=values.get("last_cause", ""),
    )
