"""``memoryctl health``'s ``nightly`` component: the last night's steps and what is served now.

Why in health: the night runs unattended (cron, on the GPU node), and an operator asking "is the
stack well?" also wants "did last night train, did the gate take the adapter, what does vLLM serve
now?" without reading ``memoryctl runs --json``. Everything here is read, nothing decided: the
steps come from the run record (``maintenance_runs.details`` of the last ``nightly``), the served
generation adapter from vLLM's ``/v1/models`` (what requests get, which after a vLLM restart may
differ from what the registry says is active: ``memoryctl adapters generation --serve-active``),
and the served embedding model from the version ``migrate`` activated (``model_versions``).

The adapter registry (``[nightly] adapters_dir``, where one exists on this host: the node that
trains) is read from its files, ``<kind>/state.json`` and the active version's ``manifest.json``,
without memoryctl-lora (not installed everywhere) and without checksumming the weights: which
version each kind has active and the one before it, next to what vLLM has loaded (its
``/v1/models`` cards with a ``parent``) and which version the served embedding model holds. A
registry that disagrees with what is served gets a note, never a status: vLLM forgets adapters it
loaded at run time when it restarts, and ``memoryctl adapters generation --serve-active`` says so
too. vLLM is asked in a thread of its own while PostgreSQL and the registry are read, and waited
for no longer than the probe's request budget: a slow vLLM costs a note, never the component.

The component is ``degraded`` only when the last night failed, which the ``runs`` component
already counts, so it never changes the overall status on its own; it says which step and why.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memoryctl.config import revealed
from memoryctl.deadline import Call, deadline_in
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
    "serve": ("slot", "served_name", "ready_s"),  # an http embedder's new version (maintenance/embedding_version)
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
    """The component; ``timeout_s`` bounds the wait for vLLM (asked while the rest is read). The
    scalars come first: the text table shows the first few (the steps, the night's status and
    time, what is served)."""
    from memoryctl.maintenance.pgstate import OpsState

    deadline = deadline_in(timeout_s)
    vllm = Call(partial(_served_generation, stack, timeout_s), name="nightly-vllm")
    last = stack.runs.last_with_details("nightly")
    try:
        recorded = OpsState(stack.pool).active_embedding()
    except MemoryctlError:  # schema older than 0003: no model recorded (the postgres probe says init)
        recorded = None
    registry = registry_state(stack)
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
    served = dict(vllm.result or {}) if vllm.wait_until(deadline) else {}
    if not served:
        served = {"generation_adapter": None, "generation_note": f"vLLM did not answer within {timeout_s:g} s"}
    loaded = served.pop("loaded_adapters", None)
    res["generation_adapter"] = served.pop("generation_adapter")
    res["embedding_model"] = recorded["model_id"] if recorded else None
    res.update(served)
    if recorded is None:
        res["embedding_note"] = "no model activated by `migrate` yet: the configured [embedder] serves"
    res["adapters"] = served_adapters(registry, loaded, res["embedding_model"])
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
    """``generation_adapter``: what vLLM serves now (None: the base model), or why it is unknown;
    ``loaded_adapters``: every adapter card of ``/v1/models`` (id, base), when vLLM answered."""
    from memoryctl.http_service import Retry
    from memoryctl.vllm import VLLMClient

    vs = stack.settings.vllm
    if not vs.url:
        return {"generation_adapter": None, "generation_note": "[vllm] url is not configured"}
    key = revealed(vs.api_key)
    try:
        with VLLMClient(vs.url, api_key=key, timeout_s=timeout_s, retry=Retry(retries=0)) as client:
            cards = client.models().adapters
    except MemoryctlError as exc:
        return {"generation_adapter": None, "generation_note": f"vLLM did not answer: {exc.message}"[:300]}
    loaded = sorted(({"id": a.id, "base": a.parent} for a in cards), key=lambda a: str(a["id"]))
    adapters = [str(a["id"]) for a in loaded]  # the promotion keeps one loaded
    if not adapters:
        note = f"no adapter loaded: vLLM serves {vs.model} itself"
        return {"generation_adapter": None, "generation_note": note, "loaded_adapters": []}
    return {"generation_adapter": ", ".join(adapters), "loaded_adapters": loaded}


_VERSION = re.compile(r"^v\d{4,}$")
KINDS = ("generation", "embedding")


def registry_state(stack: Stack) -> dict[str, Any]:
    """Per kind, what the adapter registry on this host holds: ``active`` and ``previous`` (the
    rollback target), how many ``versions``, the ``latest`` registered (a rejected night's too) and
    the active one's base model and checksum; ``{"root": ..., "note": ...}`` without a registry."""
    from memoryctl.maintenance.adapters import registry_root

    root = registry_root(stack.settings)
    out: dict[str, Any] = {"root": str(root)}
    kinds = [k for k in KINDS if (root / k).is_dir()]
    if not kinds:
        out["note"] = f"no adapter registry on this host ({root}): it is on the node that trains"
        return out
    for kind in kinds:
        try:
            out[kind] = _kind_state(root / kind)
        except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
            out[kind] = {"error": f"{root / kind}: {exc}"[:300]}
    return out


def _kind_state(kind_dir: Path) -> dict[str, Any]:
    state_file = kind_dir / "state.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    active, history = state.get("active"), list(state.get("history") or [])
    versions = sorted(
        (d.name for d in kind_dir.iterdir() if _VERSION.match(d.name) and (d / "manifest.json").is_file()),
        key=lambda name: int(name[1:]),
    )
    out: dict[str, Any] = {
        "active": active,
        "previous": history[history.index(active) - 1] if active in history and history.index(active) > 0 else None,
        "versions": len(versions),
        "latest": versions[-1] if versions else None,
    }
    if active:
        manifest = json.loads((kind_dir / active / "manifest.json").read_text())
        out["base_model"] = manifest.get("base_model_id")
        out["checksum"] = str((manifest.get("checksum") or {}).get("combined") or "")[:12] or None
        out["created_at"] = manifest.get("created_at")
    return out


def served_adapters(
    registry: dict[str, Any], loaded: list[dict[str, Any]] | None, embedding_model: str | None
) -> dict[str, Any]:
    """The registry next to what is served: for generation, vLLM's loaded adapters (``loaded``:
    None when vLLM is not configured or did not answer) and whether the active version is among
    them; for embedding, whether the served model (``migrate``'s) holds the active version."""
    from memoryctl.maintenance.embedding_version import served_name

    out: dict[str, Any] = {"registry": registry["root"]}
    if "note" in registry:
        out["registry_note"] = registry["note"]
    if loaded is not None:
        out["vllm_loaded"] = loaded
    for kind in KINDS:
        entry = dict(registry.get(kind) or {})
        if not entry or "error" in entry:
            if entry:
                out[kind] = entry
            continue
        active = entry.get("active")
        if kind == "generation":
            name = f"memoryctl-generation-{active}" if active else None
            entry["served_name"] = name
            if loaded is not None:
                names = {str(a["id"]) for a in loaded}
                entry["loaded"] = name in names if name else not names
                if not entry["loaded"]:
                    entry["note"] = (
                        f"the registry's active adapter {name} is not loaded in vLLM:"
                        " `memoryctl adapters generation --serve-active`"
                        if name
                        else "the registry has no active adapter, vLLM has one loaded"
                    )
        elif active and embedding_model is not None:
            model_id = f"{entry.get('base_model')}+lora-{active}"
            held = embedding_model == f"http:{served_name(model_id)}" or bool(
                entry.get("checksum") and embedding_model.endswith(f"+lora:{entry['checksum']}")
            )
            entry["in_served_model"] = held
            if not held:
                entry["note"] = (
                    f"the served embedding model {embedding_model} does not hold the active adapter {active}"
                )
        out[kind] = entry
    return out


def nightly_lines(component: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Rows under ``nightly`` in the text table: (label, status, detail) per step of the last night
    (its seconds, why) and per adapter kind (the registry's active and previous, what is served)."""
    rows: list[tuple[str, str, str]] = []
    for step in (component.get("last_night") or {}).get("steps") or []:
        seconds = step.get("seconds")
        parts = [f"{seconds:.1f} s" if isinstance(seconds, int | float) else "- s"]
        if step.get("reason"):
            parts.append(str(step["reason"]))
        rows.append((f"  {step.get('name')}", str(step.get("status")), "; ".join(parts)))
    adapters = component.get("adapters") or {}
    for kind in KINDS:
        entry = adapters.get(kind)
        served = component.get("generation_adapter") if kind == "generation" else component.get("embedding_model")
        if not entry:
            continue
        if "error" in entry:
            rows.append((f"  {kind} adapter", "", entry["error"]))
            continue
        previous = f" (previous {entry['previous']})" if entry.get("previous") else ""
        detail = f"registry: active {entry.get('active') or 'none'}{previous}, {entry.get('versions')} version(s)"
        detail += f"; served: {served or 'the base model'}"
        if entry.get("note"):
            detail += f"; {entry['note']}"
        rows.append((f"  {kind} adapter", "", detail))
    if adapters.get("registry_note"):
        rows.append(("  adapters", "", adapters["registry_note"]))
    return rows
