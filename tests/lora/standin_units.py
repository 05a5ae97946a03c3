"""A STAND-IN for ``systemctl stop|start UNIT...`` over real processes — not systemd.

The nightly stops vLLM while the generation adapter trains (``memoryctl.maintenance.gpu_pause``) through
``[nightly] unit_command``; production's is ``sudo -n systemctl``. Tests point it at this script,
which manages the vLLM stand-in as a real separate process: ``DIR/<unit>.json`` holds the unit's
``{"argv": [...], "env": {...}}`` (written by the test), ``DIR/<unit>.pid`` the running process, and every call is
appended to ``DIR/journal`` (``<verb> <unit> <pid>``) so a test can see what was stopped and when.

    python standin_units.py --dir DIR stop|start|restart|status UNIT...

``stop`` sends SIGTERM and waits for the process to exit (as ``systemctl stop`` waits), ``start``
spawns the command line detached and returns at once (as ``systemctl start`` of a ``simple``
unit), ``restart`` is a stop then a start, ``status`` exits 3 when a unit is not running (``systemctl status``'s code).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def running(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    try:  # a zombie (exited, not yet reaped by its parent) counts as stopped
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
    return None if state == "Z" else pid


def stop(pid: int, timeout_s: float = 30.0) -> None:
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except OSError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="standin_units.py")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("verb", choices=["stop", "start", "restart", "status"])
    parser.add_argument("units", nargs="+")
    args = parser.parse_args(argv)
    code = 0
    for unit in args.units:
        spec, pid_file = args.dir / f"{unit}.json", args.dir / f"{unit}.pid"
        if not spec.is_file():
            print(f"Unit {unit}.service not found.", file=sys.stderr)
            return 5
        pid = running(pid_file)
        if args.verb in ("stop", "restart") and pid:
            stop(pid)
        if (args.verb == "start" and not pid) or args.verb == "restart":
            unit_spec = json.loads(spec.read_text())
            with open(args.dir / f"{unit}.log", "ab") as log:
                proc = subprocess.Popen(
                    unit_spec["argv"],
                    env={**os.environ, **unit_spec.get("env", {})},
                    stdout=log,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            pid = proc.pid
            pid_file.write_text(str(pid))
        elif args.verb == "status" and not pid:
            code = 3
        with open(args.dir / "journal", "a") as journal:
            journal.write(f"{args.verb} {unit} {pid or '-'}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
