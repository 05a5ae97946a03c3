"""The mutation re-run of issue 42: each mutant is one small, plausible bug in a guarantee the
suite claims to pin, and the tests named for it must fail when it is applied.

Why a list and not a mutation tool: a tool mutates every operator and reports thousands of
survivors, most of them equivalent; the audit asked a narrower question, "does the suite notice
when *this* promise breaks?", for twelve promises (four of them survived it). Each entry names the
promise, the exact text it changes (found exactly once, or the run stops: a refactor that moved
the code must move the mutant too — tests/unit/test_mutation_list.py checks that on every CI run)
and the tests that must kill it, run as narrowly as they would be in a developer's loop (one file),
so a mutant killed only by a whole-directory run counts as surviving.

Run: ``scripts/mutants`` (all) or ``scripts/mutants NAME…``; integration targets need the test
servers (``eval "$(scripts/services env)"``). It copies the tracked tree to a temporary directory,
checks every target passes unmutated, then applies one mutant at a time; exit 1 if any survives.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Mutant:
    name: str
    promise: str  # what breaks when the mutant is in
    path: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest targets, each run alone; the mutant must fail at least one
    audit_survivor: bool = False  # one of the four the audit of issue 42 found surviving


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "breaker-half-open",
        "a half-open breaker lets exactly one trial through (concurrent callers wait for its outcome)",
        "memoryctl/deadline.py",
        "                self.opened_at = self.clock()  # half-open: let this one call try\n",
        "                pass  # MUTANT: no re-arm, every caller is a trial\n",
        ("tests/unit/test_write_delivery.py",),
        audit_survivor=True,
    ),
    Mutant(
        "generation-gate-floor",
        "the generation adapter is promoted only when its held-out loss improves by more than the floor",
        "lora/memoryctl_lora/evaluate.py",
        "    if active_loss - candidate_loss > min_improvement:\n",
        "    if active_loss - candidate_loss > 0:  # MUTANT: floor ignored\n",
        ("tests/lora/test_cycle.py",),
        audit_survivor=True,
    ),
    Mutant(
        "deploy-loss-floor",
        "the deployed nightly asks a generation adapter for a held-out loss gain of 0.01",
        "deploy/components.py",
        '"min_loss_improvement": 0.01}',
        '"min_loss_improvement": 0.0}',
        ("tests/deploy/unit/test_plans.py",),
        audit_survivor=True,
    ),
    Mutant(
        "recency-weight-doubled",
        "recency reorders only memories within RECENCY_WEIGHT of the query's relevance spread",
        "memoryctl/query/fusion.py",
        "    return relevance_ + RECENCY_WEIGHT * spread_ * recency_\n",
        "    return relevance_ + 2 * RECENCY_WEIGHT * spread_ * recency_  # MUTANT\n",
        ("tests/unit/test_fusion.py",),
        audit_survivor=True,
    ),
    Mutant(
        "embedding-gate-floor",
        "an embedding adapter is promoted only when recall@k beats the active one by more than the floor",
        "lora/memoryctl_lora/evaluate.py",
        "    if c - a > min_improvement + 1e-12:\n",
        "    if c - a > 1e-12:  # MUTANT: floor ignored\n",
        ("tests/lora/test_cycle.py",),
    ),
    Mutant(
        "json-bool-is-number",
        "an update from false to 0 is an update (JSON's bool is not a number)",
        "memoryctl/stores/records.py",
        "    if isinstance(a, bool) or isinstance(b, bool):\n        return a is b\n",
        "    if False:  # MUTANT: Python's False == 0\n        return a is b\n",
        ("tests/integration/test_write_path.py",),
    ),
    Mutant(
        "reconcile-stale-not-drift",
        "a store copy older than PostgreSQL's row counts as drift",
        "memoryctl/maintenance/reconcile.py",
        "        return self.orphan + self.missing + self.stale\n",
        "        return self.orphan + self.missing  # MUTANT: stale ignored\n",
        ("tests/integration/test_ops.py::test_reconcile_finds_and_repairs_orphans_missing_stale",),
    ),
    Mutant(
        "vector-agent-filter",
        "a vector search answers one agent's memories only",
        "memoryctl/stores/vector_filter.py",
        '        out.must.append(Match("agent_id", flt.agent_id))\n',
        "        pass  # MUTANT: no tenant filter\n",
        ("tests/integration/test_vector_stores.py",),
    ),
    Mutant(
        "until-inclusive",
        "--until is exclusive in the vector store as in PostgreSQL (created_at < until)",
        "memoryctl/stores/vector_filter.py",
        "                lt=to_utc(flt.created_to) if flt.created_to else None,\n",
        "                lte=to_utc(flt.created_to) if flt.created_to else None,  # MUTANT\n",
        ("tests/integration/test_vector_stores.py",),
    ),
    Mutant(
        "forget-not-delivered",
        "a forgotten memory is marked deleted in the vector store by the outbox",
        "memoryctl/write/outbox.py",
        "            self.vectors.set_deleted(dead, True)\n",
        "            pass  # MUTANT: the soft delete never reaches Qdrant\n",
        ("tests/integration/test_write_path.py",),
    ),
    Mutant(
        "empty-agent-is-default",
        "an empty --agent is refused, never taken for the default agent",
        "memoryctl/operations/memories.py",
        '    return validate_agent_id(p["agent"]) if p.get("agent") is not None else client.settings.default_agent\n',
        '    return validate_agent_id(p["agent"]) if p.get("agent") else client.settings.default_agent  # MUTANT\n',
        ("tests/unit/test_surfaces.py",),
    ),
    Mutant(
        "non-finite-sent",
        "the CLI refuses a non-finite number before sending it to the service",
        "memoryctl/serve/client.py",
        "            if isinstance(item, float) and not math.isfinite(item):\n",
        "            if False:  # MUTANT\n",
        ("tests/unit/test_where_nul.py",),
    ),
)


@dataclass(frozen=True, slots=True)
class Outcome:
    mutant: Mutant
    line: int
    killed_by: str | None  # the first failing test, None when every target passed
    seconds: float


def locate(root: Path, m: Mutant) -> int:
    """The line where ``m.old`` starts; an error unless it occurs exactly once."""
    text = (root / m.path).read_text()
    found = text.count(m.old)
    if found != 1:
        raise LookupError(f"mutant {m.name}: its text occurs {found} times in {m.path}, not once: move the mutant")
    return text[: text.index(m.old)].count("\n") + 1


def _copy_tree(dest: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    if (ROOT / ".cache").exists():
        (dest / ".cache").symlink_to(ROOT / ".cache")  # the bundled models, as fetched


FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def _pytest(root: Path, target: str) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{root / 'lora'}")
    cmd = [sys.executable, "-m", "pytest", target, "-x", "-q", "-rfE", "-p", "no:cacheprovider", "-m", ""]
    run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    return run.returncode, run.stdout + run.stderr


def run(mutants: list[Mutant], *, log: Path | None = None) -> list[Outcome]:
    with tempfile.TemporaryDirectory(prefix="memoryctl-mutants-") as tmp:
        root = Path(tmp)
        _copy_tree(root)
        lines = {m.name: locate(root, m) for m in mutants}
        for target in sorted({t for m in mutants for t in m.tests}):
            rc, out = _pytest(root, target)
            if rc != 0:
                raise RuntimeError(f"{target} fails without a mutant (exit {rc}):\n{out[-3000:]}")
            print(f"baseline: {target} passes", flush=True)
        outcomes = []
        for m in mutants:
            path = root / m.path
            original = path.read_text()
            path.write_text(original.replace(m.old, m.new))
            t0 = time.monotonic()
            killed_by = None
            try:
                for target in m.tests:
                    rc, out = _pytest(root, target)
                    if log is not None:
                        with log.open("a") as f:
                            f.write(f"==== {m.name}: {target} exit {rc}\n{out}\n")
                    if rc == 1:  # tests ran and failed; 2-5 (collection, usage) is not a kill
                        failed = FAILED.findall(out)
                        killed_by = failed[0] if failed else target
                        break
                    if rc != 0:
                        raise RuntimeError(f"mutant {m.name}: {target} exit {rc}, not a test failure:\n{out[-3000:]}")
            finally:
                path.write_text(original)
            outcomes.append(Outcome(m, lines[m.name], killed_by, time.monotonic() - t0))
            verdict = f"killed by {killed_by}" if killed_by else "SURVIVED"
            print(f"{m.name}: {m.path}:{lines[m.name]}: {verdict} ({time.monotonic() - t0:.1f} s)", flush=True)
        return outcomes


def table(outcomes: list[Outcome]) -> str:
    rows = ["| mutant | where | promise | audit | killed by | s |", "| --- | --- | --- | --- | --- | --- |"]
    for o in outcomes:
        m = o.mutant
        rows.append(
            f"| {m.name} | {m.path}:{o.line} | {m.promise} | {'survived it' if m.audit_survivor else ''} "
            f"| {o.killed_by or '**survived**'} | {o.seconds:.0f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/mutants", description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="mutants to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--log", type=Path, help="append every pytest output here")
    args = ap.parse_args(argv)
    by_name = {m.name: m for m in MUTANTS}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        print(f"scripts/mutants: no mutant {', '.join(unknown)} (see --list)", file=sys.stderr)
        return 2
    chosen = [by_name[n] for n in args.names] or list(MUTANTS)
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.path}:{locate(ROOT, m)} -> {' '.join(m.tests)}  ({m.promise})")
        return 0
    try:
        outcomes = run(chosen, log=args.log)
    except (LookupError, RuntimeError) as exc:
        print(f"scripts/mutants: {exc}", file=sys.stderr)
        return 2
    print(table(outcomes))
    survivors = [o.mutant.name for o in outcomes if o.killed_by is None]
    print(
        f"{len(outcomes) - len(survivors)} of {len(outcomes)} killed"
        + (f"; survived: {', '.join(survivors)}" if survivors else "")
    )
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
