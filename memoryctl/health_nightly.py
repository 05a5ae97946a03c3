"""``memoryctl health``'s ``nightly`` component: the last night's steps and what is served now.

Why in health: the night runs unattended (cron, on the GPU node), and an operator asking "is the
stack well?" also wants "did last night train, did the gate take the adapter, what does vLLM serve
now?" without reading ``memoryctl runs --json``. Everything here is read, nothing decided: the
steps come from the run record (``maintenance_runs.details`` of the last ``nightly``), the served
generation adapter from vLLM's ``/v1/models`` (what requests get, which after a vLLM restart may
differ from what the registry says is active: ``memoryctl adapters generation --serve-active``),
and the served embedding model from the version ``migrate`` activated (``model_versions``).

The component is ``degraded`` only when the last night failed, which the ``runs`` component
already counts, so it never changes the overall status on its own; it says which step and why.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memoryctl.errors import MemoryctlError

if TYPE_CHECKING:
    from memoryctl.stack import Stack

# Per step, the scalar figures of its record an operator judges a night by (the full record stays
# in `memoryctl runs`): gate and training counts for the training steps, what the swap served,
# how long the GPU pause took, which embedding slot serves a new version; what re-embed and reconcile
# found.
_TOP = (
    "cycle_status",
    "cycle_seconds",
    "promote",
    "version",
    "model_id",
    "served",
    "scanned",
    "changed",
    "drift",
    "unrepaired",
)
_NESTED = {
    "counts": ("train", "heldout"),
    "gate_metrics": None,  # all of them: the gate's own figures (recall@k, MRR, held-out loss)
    "migrate": ("status", "target"),
    "swap": ("loaded", "unloaded"),
    "serve": ("slot", "served_name", "ready_s"),  # an http embedder's new version (ops/embedding_version)
    "gpu_pause": ("ready_s", "restart_error"),
}


def night_steps(details: dict[str, Any]) -> list[dict[str, Any]]:
    """The steps of a nightly run record: name, status, seconds, the reason (or error), figures."""
    out = []
    for step in details.get("steps") or []:
        reason = step.get("reason") or step.get("error")
        figures = {k: step[k] for k in _TOP if _scalar(step.get(k))}
        for key, wanted in _NESTED.items():
            sub = step.get(key)
            if not isinstance(sub, dict):
                continue
            for k in wanted or tuple(sub):
                if _scalar(sub.get(k)):
                    figures[f"{key}.{k}" if wanted else k] = sub[k]
        out.append(
            {
                "name": step.get("name"),
                "status": step.get("status"),
                "seconds": step.get("seconds"),
                **({"reason": reason} if reason else {}),
                **({"hint": step["hint"]} if step.get("hint") else {}),
                **({"figures": figures} if figures else {}),
            }
        )
    return out


def _scalar(value: Any) -> bool:
    return value is not None and isinstance(value, str | int | float | bool)


def nightly_probe(stack: Stack, *, timeout_s: float) -> dict[str, Any]:
    """The component; ``timeout_s`` bounds the one request to vLLM. The scalars come first: the
    text table shows the first few (the steps, the night's status and time, what is served)."""
    from memoryctl.ops.pgstate import OpsState

    last = stack.runs.last_with_details("nightly")
    try:
        recorded = OpsState(stack.pool).active_embedding()
    except MemoryctlError:  # schema older than 0003: no model recorded (the postgres probe says init)
        recorded = None
    res: dict[str, Any] = {}
    if last is None:
        res["detail"] = "no `memoryctl nightly` recorded yet"
    else:
        details = last["details"] or {}
        steps = night_steps(details)
        started: datetime = last["started_at"]
        res.update(
            steps=" ".join(f"{s['name']}={s['status']}" for s in steps) or "-",
            last_night_status=last["status"],
            last_night_at=started.isoformat(timespec="seconds"),
        )
    served = _served_generation(stack, timeout_s)
    res["generation_adapter"] = served.pop("generation_adapter")
    res["embedding_model"] = recorded["model_id"] if recorded else None
    res.update(served)
    if recorded is None:
        res["embedding_note"] = "no model activated by `migrate` yet: the configured [embedder] serves"
    if last is None:
        return res
    res["last_night_age_s"] = round((datetime.now(UTC) - started).total_seconds(), 1)
    res["last_night"] = {
        "status": last["status"],
        "started_at": started.isoformat(),
        "seconds": details.get("seconds"),
        "error": last["error"],
        "steps": steps,
    }
    if last["status"] == "failed":
        failed = [f"{s['name']}: {s.get('reason') or 'failed'}" for s in steps if s["status"] == "failed"]
        why = "; ".join(failed) or last["error"] or "no step recorded"
        res.update(status="degraded", error=f"the last night failed: {why}"[:500])
    return res


def _served_generation(stack: Stack, timeout_s: float) -> dict[str, Any]:
    """``generation_adapter``: what vLLM serves now (None: the base model), or why it is unknown."""
    from memoryctl.http_service import Retry
    from memoryctl.vllm import VLLMClient

    vs = stack.settings.vllm
    if not vs.url:
        return {"generation_adapter": None, "generation_note": "[vllm] url is not configured"}
    key = vs.api_key.get_secret_value() if vs.api_key else None
    try:
        with VLLMClient(vs.url, api_key=key, timeout_s=timeout_s, retry=Retry(retries=0)) as client:
            adapters = sorted(client.models().adapter_names())  # the promotion keeps one loaded
    except MemoryctlError as exc:
        return {"generation_adapter": None, "generation_note": f"vLLM did not answer: {exc.message}"[:300]}
    if not adapters:
        return {"generation_adapter": None, "generation_note": f"no adapter loaded: vLLM serves {vs.model} itself"}
    return {"generation_adapter": adapters[0] if len(adapters) == 1 else ", ".join(adapters)}
