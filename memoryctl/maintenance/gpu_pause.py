"""The GPU the nightly trains on, freed from the services that hold it while it trains.

Why: on the production GPU node (Hetzner GEX44, one 20 GB RTX 4000 SFF Ada) vLLM keeps 0.68 of the
GPU for the generation server and 0.17 for the embedding server (``--gpu-memory-utilization``), so
about 3 GB are left, and a LoRA step on the 7B generation model needs ~8-9 GB (docs/nightly.md).
So while the generation adapter trains, ``[nightly] pause_units`` (``["vllm@generate"]`` there) are
stopped through ``[nightly] unit_command`` (``sudo -n systemctl``; on the node a sudoers rule is
to allow exactly ``systemctl stop|start`` of those units) and started again afterwards, whatever
happened: the start is in a ``finally``, so a training that fails, is rejected or crashes still
gives the node its server back.

A vLLM restart forgets every adapter loaded at run time, so "the served adapter as it was" needs
two more steps after the start: wait until vLLM answers ``/health`` (``[nightly] vllm_ready_s``:
loading a 7B model and capturing CUDA graphs takes minutes) and load the adapter the registry says
is active again (``restore``, the caller's). Meanwhile the LLM extractor degrades to the rules
extractor, as whenever vLLM is away; the whole pause goes into the run record.

Without ``pause_units`` (the default; a GPU with room for both) nothing is stopped.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from memoryctl.config import Settings
from memoryctl.deadline import poll_until
from memoryctl.errors import MemoryctlError, StoreError
from memoryctl.vllm import VLLMClient


class PauseFailed(MemoryctlError):
    """A unit could not be stopped or started again, or vLLM did not come back in time."""


def _stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def run_unit_command(settings: Settings, verb: str, units: list[str]) -> None:
    argv = [*settings.nightly.unit_command, verb, *units]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=settings.nightly.unit_command_timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PauseFailed(
            f"{' '.join(argv)}: {exc}", hint="check [nightly] unit_command and the sudoers rule for it"
        ) from None
    if done.returncode != 0:
        raise PauseFailed(
            f"{' '.join(argv)} exited {done.returncode}: {(done.stderr or done.stdout).strip()[:500]}",
            hint="the nightly's user may run exactly `systemctl stop|start` of [nightly] pause_units and"
            " `systemctl restart` of the embedding slots' units (sudoers rule); check `systemctl status` of the unit",
        )


def wait_until_ready(client: VLLMClient, deadline_s: float, interval_s: float = 1.0) -> float:
    """Poll ``/health`` until vLLM answers 200; the seconds it took, or PauseFailed at the deadline."""
    # A StoreError is a server not listening yet.
    polled = poll_until(
        lambda: client.health(timeout_s=5.0), timeout_s=deadline_s, interval_s=interval_s, retry_on=(StoreError,)
    )
    if not polled.ok:
        raise PauseFailed(
            f"vLLM at {client.url} did not answer /health within {deadline_s:.0f} s after its start",
            hint="see `journalctl -u vllm@generate`; raise [nightly] vllm_ready_s if it is only slow",
        )
    return polled.seconds


@contextmanager
def gpu_freed(
    settings: Settings, client: Callable[[], VLLMClient], restore: Callable[[VLLMClient], dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    """Stop ``[nightly] pause_units`` for the block, then start them, wait for vLLM, ``restore``.

    Yields the record (units, times, what ``restore`` did), filled in as it goes. If the block
    raised, that error propagates and a failure while starting again is added to the record; if
    only the start failed, PauseFailed says so.
    """
    units = list(settings.nightly.pause_units)
    record: dict[str, Any] = {"units": units}
    if not units:
        yield record
        return
    run_unit_command(settings, "stop", units)
    record["stopped_at"] = _stamp()
    body_failed = False
    try:
        yield record
    except BaseException:
        body_failed = True
        raise
    finally:
        try:
            run_unit_command(settings, "start", units)
            record["started_at"] = _stamp()
            with client() as vllm:
                record["ready_s"] = round(wait_until_ready(vllm, settings.nightly.vllm_ready_s), 3)
                record["restored"] = restore(vllm)
        except MemoryctlError as exc:
            record["restart_error"] = exc.message
            if not body_failed:
                raise
