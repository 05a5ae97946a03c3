"""``memoryctl nightly`` without ``--json``, as cron runs it, prints its report.

The table was written against a report shape the nightly never had (``failed``, a nested
``detail``): every human-readable nightly, i.e. every cron night on a deployed node, ended in a
KeyError traceback and exit 1 after the work was done and recorded as ok. The report here is
built by ``NightlyReport`` itself, so the renderer and the report cannot drift apart again.
"""

from __future__ import annotations

import pytest

from memoryctl.cli import render
from memoryctl.declaration.table import OPERATIONS
from memoryctl.maintenance.nightly import NightlyReport, StepOutcome
from memoryctl.operations.maintenance import nightly as nightly_operation


class _Client:
    def __init__(self, report: NightlyReport) -> None:
        self.report = report

    def nightly(self) -> NightlyReport:
        return self.report


def _report(*steps: StepOutcome) -> NightlyReport:
    return NightlyReport(steps=list(steps), window={"since": None, "until": "2026-12-02T02:15:00+00:00"}, seconds=3.25)


def _show(report: NightlyReport, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    op = OPERATIONS["nightly"]
    reply = nightly_operation(_Client(report), None)  # type: ignore[arg-type]
    code = render.show(op, reply, {"json": False})
    return code, capsys.readouterr().out


def test_a_night_that_skips_training_prints_each_step_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    report = _report(
        StepOutcome("embedding", "skipped", {"reason": "the embedder 'http:e5' cannot take LoRA"}, 0.01),
        StepOutcome("reembed", "ok", {"model_id": "http:e5", "scanned": 3000, "changed": 12}, 0.45),
        StepOutcome("reconcile", "ok", {"drift": 0, "stores": {"vector": {}}}, 1.79),
    )
    code, text = _show(report, capsys)
    assert code == 0
    assert "nightly: ok (3.2 s)" in text
    assert "cannot take LoRA" in text
    assert "scanned=3000" in text and "changed=12" in text and "drift=0" in text


def test_a_failed_step_makes_the_night_failed_with_its_error_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    report = _report(
        StepOutcome("generation", "failed", {"error": "vLLM refused the adapter", "hint": "see the log"}, 2.0),
        StepOutcome("reembed", "ok", {"scanned": 0}, 0.1),
    )
    code, text = _show(report, capsys)
    assert code == 1
    assert "nightly: failed (3.2 s)" in text and "vLLM refused the adapter" in text
