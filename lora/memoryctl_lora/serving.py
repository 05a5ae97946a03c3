"""Serving LoRA adapters on vLLM: the nightly promotion (hot swap with verification, rollback).

HTTP is memoryctl's one vLLM client (``memoryctl.vllm``: ``/v1/models`` and the runtime LoRA API,
``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``, which exist only when the server runs with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``). What is this module's is the order of those calls, so
that serving never goes without an adapter and a failed promotion leaves the serving state as it
was. vLLM warns the runtime API is risky when exposed: the deploy binds vLLM to the WireGuard
address only and sets ``--api-key``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from memoryctl.errors import StoreError
from memoryctl.vllm import STORE, VLLMClient


@dataclass(frozen=True)
class AdapterRef:
    """An adapter as vLLM sees it: the served name and the directory on the vLLM host."""

    name: str
    path: str


@dataclass
class SwapResult:
    """Outcome of a hot swap, for the nightly run record."""

    loaded: str
    unloaded: str | None
    previous_unloaded: bool
    seconds: float
    notes: list[str] = field(default_factory=list)


class AdapterServing:
    """The adapters a vLLM server serves, changed in an order that never leaves it without one.

    ``verify_attempts`` / ``verify_interval``: how long a loaded adapter may take to be listed in
    ``/v1/models`` before the load counts as failed.
    """

    def __init__(self, client: VLLMClient, *, verify_attempts: int = 5, verify_interval: float = 0.5) -> None:
        self.client = client
        self.verify_attempts = verify_attempts
        self.verify_interval = verify_interval

    def wait_for_adapter(self, name: str, path: str | None = None) -> bool:
        """Poll /v1/models until ``name`` is listed (vLLM lists it right after a 200, but a proxy or
        a restarting worker may lag); False after ``verify_attempts``."""
        for attempt in range(self.verify_attempts):
            if self.client.models().has_adapter(name, path):
                return True
            if attempt + 1 < self.verify_attempts:
                time.sleep(self.verify_interval)
        return False

    def hot_swap(self, new: AdapterRef, previous: str | None = None) -> SwapResult:
        """Load ``new``, verify it is served, then unload ``previous``.

        Serving never goes without an adapter: the previous one stays loaded until the new one is
        verified. If loading or verification fails, the new adapter is unloaded again (best effort)
        and the error propagates — the serving state is what it was. If only unloading the
        previous adapter fails, both remain loaded, which serves correctly; that is reported in
        ``SwapResult.previous_unloaded``/``notes`` rather than raised, so the caller can record
        the promotion and retry the cleanup later.
        """
        t0 = time.monotonic()
        self.client.load_lora_adapter(new.name, new.path)
        if not self.wait_for_adapter(new.name, new.path):
            self._try_unload(new.name)
            raise StoreError(
                STORE,
                f"adapter {new.name!r} was accepted but is not listed in /v1/models; unloaded it again",
                hint="check the vLLM log; the previous adapter is still serving",
            )
        result = SwapResult(loaded=new.name, unloaded=None, previous_unloaded=previous is None, seconds=0.0)
        if previous and previous != new.name:
            try:
                self.client.unload_lora_adapter(previous, missing_ok=True)
                result.unloaded = previous
                result.previous_unloaded = True
            except StoreError as exc:
                result.notes.append(f"previous adapter {previous!r} still loaded: {exc}")
        elif previous == new.name:
            result.previous_unloaded = True
        result.seconds = time.monotonic() - t0
        return result

    def rollback(self, current: str, previous: AdapterRef | None) -> SwapResult:
        """Return to ``previous`` (re-load it if needed, verify) and unload ``current``.

        ``previous=None`` means "back to the base model": just unload ``current``.
        """
        t0 = time.monotonic()
        if previous is None:
            self.client.unload_lora_adapter(current, missing_ok=True)
            return SwapResult(loaded="", unloaded=current, previous_unloaded=True, seconds=time.monotonic() - t0)
        result = self.hot_swap(previous, current)
        result.seconds = time.monotonic() - t0
        return result

    # -- internals ---------------------------------------------------------------------------
    def _try_unload(self, name: str) -> None:
        try:
            self.client.unload_lora_adapter(name, missing_ok=True)
        except StoreError:
            pass
