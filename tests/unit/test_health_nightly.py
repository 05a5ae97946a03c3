"""health's ``nightly`` component reads a night's run record: which step did what, and why.

The record is built by the nightly's own report classes (``NightlyReport.as_dict``, as
``Nightly.run`` stores it), with step details shaped like ``CycleOutcome.to_record`` and the
re-embed/reconcile reports; the component against the real stores is in
tests/integration/test_nightly.py and test_nightly_gpu.py."""

from __future__ import annotations

from memoryctl.health.nightly import night_steps
from memoryctl.maintenance.nightly import NightlyReport, StepOutcome


def _cycle(status: str, reason: str, gate: dict[str, float], **extra: object) -> dict[str, object]:
    return {
        "kind": "generation",
        "status": status,
        "reason": reason,
        "counts": {"train": 24, "heldout": 8, "dropped": 0},
        "promote": status == "registered",
        "gate_metrics": gate,
        "train_metrics": {"steps": 20, "loss_curve": [5.7, 5.5]},
        "version": "v0002" if status == "registered" else None,
        "model_id": None,
        "seconds": 12.5,  # the cycle's (training + gate), not the step's
        **extra,
    }


def test_each_step_shows_its_status_reason_and_figures() -> None:
    report = NightlyReport(
        steps=[
            StepOutcome(
                "embedding",
                "rejected",
                _cycle(
                    "rejected",
                    "recall@1 regressed: 0.500 < active 0.600",
                    {"k": 1, "candidate_recall_at_k": 0.5, "active_recall_at_k": 0.6, "candidate_mrr": None},
                ),
                30.0,
            ),
            StepOutcome(
                "generation",
                "ok",
                _cycle(
                    "registered",
                    "held-out loss improved 5.7490 -> 5.2700",
                    {"candidate_heldout_loss": 5.27, "active_heldout_loss": 5.749},
                    gpu_pause={"units": ["vllm@generate"], "ready_s": 4.2, "restored": {"active": "x"}},
                    served=True,
                    swap={"loaded": "memoryctl-generation-v0002", "unloaded": "memoryctl-generation-v0001"},
                ),
                60.0,
            ),
            StepOutcome("reembed", "ok", {"model_id": "m1", "scanned": 40, "changed": 3, "pipeline": {"batches": 1}}),
            StepOutcome("reconcile", "failed", {"error": "Qdrant did not answer", "hint": "is it up?"}),
        ]
    )
    steps = {s["name"]: s for s in night_steps(report.as_dict())}
    assert list(steps) == ["embedding", "generation", "reembed", "reconcile"]
    emb = steps["embedding"]
    assert emb["status"] == "rejected" and emb["reason"].startswith("recall@1 regressed")
    assert emb["seconds"] == 30.0  # the step's: the cycle's own seconds are a figure
    assert emb["figures"] == {
        "cycle_status": "rejected",
        "cycle_seconds": 12.5,
        "promote": False,
        "counts.train": 24,
        "counts.heldout": 8,
        "k": 1,
        "candidate_recall_at_k": 0.5,
        "active_recall_at_k": 0.6,
    }  # None (no MRR) and the training curve (a list) are left to `memoryctl runs`
    gen = steps["generation"]
    assert gen["seconds"] == 60.0 and gen["reason"] == "held-out loss improved 5.7490 -> 5.2700"
    assert gen["figures"]["version"] == "v0002" and gen["figures"]["served"] is True
    assert gen["figures"]["swap.loaded"] == "memoryctl-generation-v0002"
    assert gen["figures"]["swap.unloaded"] == "memoryctl-generation-v0001"
    assert gen["figures"]["gpu_pause.ready_s"] == 4.2
    assert gen["figures"]["candidate_heldout_loss"] == 5.27
    assert steps["reembed"] == {
        "name": "reembed",
        "status": "ok",
        "seconds": 0.0,
        "figures": {"model_id": "m1", "scanned": 40, "changed": 3},
    }
    assert steps["reconcile"] == {
        "name": "reconcile",
        "status": "failed",
        "seconds": 0.0,
        "reason": "Qdrant did not answer",
        "hint": "is it up?",
    }


def test_a_night_that_recorded_no_steps_has_none() -> None:
    """A night that crashed before recording (or is still running) has empty details."""
    assert night_steps({}) == []
    assert night_steps({"steps": None}) == []


def test_a_new_embedding_version_shows_the_slot_that_serves_it() -> None:
    """An http embedder's night (memoryctl/maintenance/embedding_version.py): the slot, the served name and
    how long the slot took to serve it, beside migrate's outcome."""
    serve = {"slot": "http://10.77.0.3:8002", "served_name": "BAAI--bge-m3+lora-v0001", "restarted": "vllm@embed-b"}
    detail = _cycle(
        "registered",
        "recall@1 0.688 -> 0.781",
        {"candidate_recall_at_k": 0.781},
        serve={**serve, "ready_s": 27.4},
        migrate={"status": "swapped", "target": "http:BAAI--bge-m3+lora-v0001", "verify": {"recall_new": 1.0}},
    )
    (emb,) = night_steps(NightlyReport(steps=[StepOutcome("embedding", "ok", detail, 105.6)]).as_dict())
    assert emb["seconds"] == 105.6 and emb["figures"]["cycle_seconds"] == 12.5
    assert {k: v for k, v in emb["figures"].items() if k.startswith(("serve.", "migrate."))} == {
        "serve.slot": "http://10.77.0.3:8002",
        "serve.served_name": "BAAI--bge-m3+lora-v0001",
        "serve.ready_s": 27.4,
        "migrate.status": "swapped",
        "migrate.target": "http:BAAI--bge-m3+lora-v0001",
    }


def _registry(**kinds: dict[str, object]) -> dict[str, object]:
    return {"root": "/srv/adapters", **kinds}


def test_the_served_embedding_model_is_matched_to_the_registry_version() -> None:
    from memoryctl.health.nightly import served_adapters

    emb = {
        "active": "v0004",
        "previous": "v0003",
        "versions": 4,
        "base_model": "BAAI/bge-m3",
        "checksum": "0123456789ab",
    }
    merged = served_adapters(_registry(embedding=emb), None, "http:BAAI--bge-m3+lora-v0004")  # a merged version
    assert merged["embedding"]["in_served_model"] is True and "note" not in merged["embedding"]
    applied = served_adapters(_registry(embedding=emb), None, "minilm/all-MiniLM-L6-v2@1+lora:0123456789ab")
    assert applied["embedding"]["in_served_model"] is True
    behind = served_adapters(_registry(embedding=emb), None, "http:BAAI--bge-m3+lora-v0003")  # after a rollback
    assert behind["embedding"]["in_served_model"] is False
    assert "does not hold the active adapter v0004" in behind["embedding"]["note"]
    unknown = served_adapters(_registry(embedding=emb), None, None)  # nothing migrated: not judged
    assert "in_served_model" not in unknown["embedding"]


def test_generation_is_judged_only_when_vllm_answered() -> None:
    from memoryctl.health.nightly import served_adapters

    gen = {"active": None, "previous": None, "versions": 1}
    stray = served_adapters(_registry(generation=gen), [{"id": "memoryctl-generation-v0001", "base": "b"}], None)
    assert stray["generation"]["loaded"] is False and "no active adapter" in stray["generation"]["note"]
    base_only = served_adapters(_registry(generation=gen), [], None)
    assert base_only["generation"]["loaded"] is True  # nothing active, nothing loaded: as it should be
    silent = served_adapters(_registry(generation={**gen, "active": "v0001"}), None, None)
    assert "loaded" not in silent["generation"] and "vllm_loaded" not in silent
