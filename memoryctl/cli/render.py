"""How the command line prints an operation's reply: its ``--json`` document as it is, or a human
rendering drawn from that document (never from objects only one path has), then its warnings on
stderr. Shared by the typer commands and the console script's fast path, so the output is the same
whichever parsed the command and wherever it ran. rich is imported when a table is drawn.

Every text that comes from a user or a store is printed with ``markup=False`` (a memory's text
``[red]`` is text, not a style).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memoryctl.cli.output import err, out, print_json

if TYPE_CHECKING:
    from rich.table import Table

    from memoryctl.declaration.declare import Operation
    from memoryctl.operations.reply import Reply

Human = Callable[[Any, Mapping[str, Any]], None]  # (data, the command's values)


def show(op: Operation, reply: Reply, values: Mapping[str, Any]) -> int:
    """Print ``reply`` as the command's options ask; returns the exit code."""
    data = reply.data
    if isinstance(data, dict) and values.get("prometheus") and "prometheus" in data:
        sys.stdout.write(data["prometheus"])
    elif values.get("json"):
        print_json(data)
    else:
        HUMAN.get(op.name, _nothing)(data, values)
    for line in reply.warnings:
        err.print(line, markup=False, highlight=False)
    return reply.exit_code


def _nothing(data: Any, values: Mapping[str, Any]) -> None:
    return None


def _table(title: str | None = None, columns: tuple[str, ...] = (), **options: Any) -> Table:
    from rich.table import Table

    table = Table(title=title, **options)
    for col in columns:
        table.add_column(col)
    return table


def _print(text: str) -> None:
    out.print(text, markup=False, highlight=False)


# ---- memories ----------------------------------------------------------------------------------
def query(data: dict[str, Any], values: Mapping[str, Any]) -> None:
    hits(data)
    if values.get("explain"):
        plan(data)


def hits(result: dict[str, Any]) -> None:
    """The hits of a ``query --json`` document as a table."""
    from rich.table import Table

    rows = result["hits"]
    table = Table(title=f"{len(rows)} hits ({result['explain']['total_ms']:.0f} ms)", expand=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("score", no_wrap=True)
    table.add_column("created / kind", no_wrap=True)
    table.add_column("text", ratio=3, overflow="fold")
    table.add_column("entities", ratio=1, overflow="fold")
    table.add_column("from", no_wrap=True)
    for rank, h in enumerate(rows, start=1):
        text = h["text"] if len(h["text"]) <= 200 else h["text"][:197] + "…"
        ents = ", ".join(f"{e['type']}:{e['name']}" for e in h["entities"][:4])
        src = "+".join(s.replace("postgres-mentions", "pg-mentions").replace("postgres", "pg") for s in h["sources"])
        created = f"{datetime.fromisoformat(h['created_at']):%Y-%m-%d %H:%M}"
        table.add_row(str(rank), f"{h['score']:.4f}", f"{created}\n{h['kind']}", text, ents, src)
    out.print(table, markup=False, highlight=False)


def plan(result: dict[str, Any]) -> None:
    from rich.tree import Tree

    ex = result["explain"]
    tree = Tree(f"plan: {ex['plan']}  ({ex['total_ms']:.1f} ms)", highlight=False)
    for s in ex["steps"]:
        flow = ""
        if s["rows_in"] is not None or s["rows_out"] is not None:
            rows_in, rows_out = ("-" if s[k] is None else s[k] for k in ("rows_in", "rows_out"))
            flow = f"  {rows_in} → {rows_out}"
        node = tree.add(f"{s['name']} [{s['store']}] {s['ms']:.1f} ms{flow}  {s['status']}", highlight=False)
        for k, v in s["detail"].items():
            node.add(f"{k}: {v}", highlight=False)
        if s["error"]:
            node.add(f"error: {s['error']}", highlight=False)
    for note in ex["notes"]:
        tree.add(f"note: {note}", highlight=False)
    out.print(tree, markup=False)


def memory(data: dict[str, Any], values: Mapping[str, Any]) -> None:
    """``get``: one memory, field by field."""
    table = _table(show_header=False)
    for key, value in data.items():
        table.add_row(key, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
    out.print(table, markup=False, highlight=False)


def added(data: dict[str, Any], values: Mapping[str, Any]) -> None:
    _print(data["id"])


def forgotten(data: dict[str, Any], values: Mapping[str, Any]) -> None:
    _print(f"forgotten: {len(data['forgotten'])}")


def imported(data: dict[str, Any], values: Mapping[str, Any]) -> None:
    table = _table(f"import {data['file']}", show_header=False)
    for label, value in (
        ("inserted", data["inserted"]),
        ("updated", data["updated"]),
        ("unchanged", data["unchanged"]),
        ("invalid lines", len(data["invalid"])),
        *((f"pending {store}", n) for store, n in data["pending"].items()),
    ):
        table.add_row(label, str(value))
    out.print(table, markup=False)
    for bad in data["invalid"][:50]:
        err.print(f"line {bad['line']}: {bad['error']}", markup=False, highlight=False)
    if len(data["invalid"]) > 50:
        err.print(f"… and {len(data['invalid']) - 50} more bad lines", markup=False)


def synced(data: dict[str, Any], values: Mapping[str, Any]) -> None:
    delivered = ", ".join(f"{t} {n}" for t, n in data["delivered"].items())
    waiting = ", ".join(f"{s} {n}" for s, n in data["pending"].items())
    _print(f"delivered: {delivered}; pending: {waiting}")


def stats(data: dict[str, Any], values: Mapping[str, Any]) -> None:
    from memoryctl.cli.chart import bars, sparkline

    metric, bucket = values.get("metric"), values.get("bucket")
    # The trend of what the table is about: the metric's average when there is one, else the count.
    trend_of = "avg" if metric else "count"
    series = [d.get(trend_of) for d in data["buckets"]]
    cols = ("bucket", "count", *(("n", "avg", "min", "max") if metric else ()))
    table = _table(f"stats{f' of {metric}' if metric else ''} per {bucket}", cols)
    table.add_column(trend_of, no_wrap=True)
    for d, bar in zip(data["buckets"], bars(series), strict=True):
        table.add_row(*[_fmt(d.get(col)) for col in cols], bar)
    out.print(table, markup=False)
    _print(f"{trend_of} trend: {sparkline(series)}")


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def health(report: dict[str, Any], values: Mapping[str, Any]) -> None:
    table = _table(f"memoryctl health: {report['status']}", ("component", "status", "latency ms", "detail"))
    from memoryctl.health.alerting import summary as alerting_summary
    from memoryctl.health.nightly import nightly_lines
    from memoryctl.health.postgres import member_lines

    for name, comp in report["components"].items():
        detail = comp.get("error") or (
            alerting_summary(comp) if name == "alerting" and comp["status"] == "ok" else _summary(comp)
        )
        table.add_row(name, comp["status"], str(comp["latency_ms"]), detail)
        if name == "postgres" and isinstance(comp.get("cluster"), dict):
            for role, line in member_lines(comp["cluster"]):  # one row per member, under postgres
                table.add_row(f"  {role}", "", "", line)
        if comp.get("note"):  # e.g. postgres: settings pending a restart
            table.add_row("  note", "", "", comp["note"])
        if name == "nightly":
            for label, status, line in nightly_lines(comp):  # the last night's steps, the adapters
                table.add_row(label, status, "", line)
    out.print(table, markup=False)


def _summary(comp: dict[str, Any]) -> str:
    keys = [k for k in comp if k not in ("status", "latency_ms", "error")]
    return ", ".join(f"{k}={comp[k]}" for k in keys[:6] if not isinstance(comp[k], list | dict)) or ""


def initialised(result: dict[str, Any], values: Mapping[str, Any]) -> None:
    schema = ", ".join(f"{r['version']}:{r['variant']}" for r in result["schema"])
    _print(f"schema: {schema}")
    _print(f"applied now: {len(result['migrations_applied'])}")
    _print(f"vector model: {result['vector_model']}")
    for store, why in result["degraded"].items():
        _print(f"{store}: unavailable ({why})")


# ---- the operator's ----------------------------------------------------------------------------
def cypher(rows: list[dict[str, Any]], values: Mapping[str, Any]) -> None:
    if not rows:
        _print("(no rows)")
        return
    table = _table(None, tuple(str(col) for col in rows[0]))
    for r in rows:
        table.add_row(
            *[v if isinstance(v, str) else json.dumps(v, default=str, ensure_ascii=False) for v in r.values()]
        )
    out.print(table, markup=False, highlight=False)


def runs(rows: list[dict[str, Any]], values: Mapping[str, Any]) -> None:
    table = _table("maintenance runs", ("id", "command", "started", "seconds", "status", "trigger", "counts", "error"))
    for r in rows:
        started = datetime.fromisoformat(r["started_at"]) if isinstance(r["started_at"], str) else r["started_at"]
        table.add_row(
            str(r["id"]),
            r["command"],
            started.isoformat(timespec="seconds"),
            f"{r['seconds']:.1f}" if r["seconds"] is not None else "-",
            r["status"],
            r["trigger"],
            str(r["counts"]),
            r["error"] or "",
        )
    out.print(table, markup=False, highlight=False)


def reconciled(report: dict[str, Any], values: Mapping[str, Any]) -> None:
    from memoryctl.maintenance.reconcile import CATEGORIES

    repair = report["repair"]
    table = _table(
        f"reconcile{' --repair' if repair else ' (dry run)'}: {report['drift']} finding(s)",
        ("store", "scanned", *CATEGORIES, "pending", "repaired"),
    )
    table.add_row("postgres", str(report["postgres"]["scanned"]), "-", "-", "-", "-", "-")
    for name, s in report["stores"].items():
        counts = [str(s[c]) for c in ("scanned", *CATEGORIES, "pending")]
        table.add_row(name, *counts, str(s["repaired"]) if repair else "-")
    out.print(table, markup=False)
    purged = f", purged {report['purged']}" if repair else ""
    _print(f"purge due (soft-deleted past the grace period): {report['purge_due']}{purged}")
    model = report["model"]
    if model and not model.get("match", True):
        _print(f"model: collection {model['collection']!r} vs embedder {model['embedder']!r} — {model['hint']}")
    for name, why in report["skipped"].items():
        err.print(f"skipped {name}: {why}", markup=False)
    for e in report["errors"]:
        err.print(f"error: {e}", markup=False)
    _print(f"{report['seconds']:.1f} s, {report['ids_per_s']:,.0f} ids/s")
    if report["drift"] and not repair:
        _print("run `memoryctl reconcile --repair` to fix")


MIGRATION_KEYS = (
    "action",
    "status",
    "source_model",
    "target_model",
    "resumed_from",
    "copied",
    "caught_up",
    "removed",
    "swapped",
    "dropped",
    "kept",
    "verify",
    "pipeline",
    "seconds",
)


def migrated(d: dict[str, Any], values: Mapping[str, Any]) -> None:
    for key in MIGRATION_KEYS:
        if d[key] not in (None, [], {}):
            _print(f"{key}: {d[key]}")
    if d["config_hint"]:
        _print(f"note: {d['config_hint']}")


def reembedded(report: dict[str, Any], values: Mapping[str, Any]) -> None:
    _print(
        f"re-embedded {report['changed']} of {report['scanned']} memories into {report['model_id']} "
        f"in {report['seconds']:.1f} s"
    )


def nightly(report: dict[str, Any], values: Mapping[str, Any]) -> None:
    table = _table(f"nightly: {report['status']} ({report['seconds']:.1f} s)")
    for col in ("step", "status", "seconds", "detail"):
        table.add_column(col, overflow="fold")
    for step in report["steps"]:
        table.add_row(step["name"], step["status"], f"{step['seconds']:.1f}", _step_detail(step))
    out.print(table, markup=False)


def _step_detail(step: Mapping[str, Any]) -> str:
    """Why a step did not run or failed; else its scalar figures (``--json`` has them all).

    A step's dict is flat (``NightlyReport.as_dict``): its details sit beside name/status/seconds.
    """
    for key in ("reason", "error"):
        if step.get(key):
            return str(step[key])
    figures = [
        f"{k}={v}"
        for k, v in step.items()
        if k not in ("name", "status", "seconds") and isinstance(v, (str, int, float)) and not isinstance(v, bool)
    ]
    return ", ".join(figures[:6])


def recorded(data: Any, values: Mapping[str, Any]) -> None:
    _print("recorded")


def adapters(rows: list[dict[str, Any]], values: Mapping[str, Any]) -> None:
    table = _table(f"{values.get('kind')} adapters", ("version", "active", "model_id", "created_at"))
    for r in rows:
        table.add_row(str(r["version"]), "*" if r["active"] else "", str(r["model_id"]), r["created_at"])
    out.print(table, markup=False)


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def backups(report: dict[str, Any], values: Mapping[str, Any]) -> None:
    table = _table(
        "memoryctl backups",
        ("store", "method", "newest backup", "age", "newest restorable", "kept", "size", "note"),
    )
    for name, store in report["stores"].items():
        age = store["last_backup_age_s"]
        note = store["error"] or store.get("note") or ("STALE" if store["stale"] else "")
        if store["archive_failing"]:
            note = "WAL archiving failing"
        table.add_row(
            name,
            store["method"],
            store["last_backup"] or "-",
            f"{age / 3600:.1f} h" if age is not None else "-",
            store["newest_restorable"] or "-",
            str(store["count"]) if store["configured"] else "-",
            _size(store["bytes"]),
            note,
        )
    out.print(table, markup=False)


def snapshot(result: dict[str, Any], values: Mapping[str, Any]) -> None:
    _print(
        f"snapshot set {result['set']}: {result['collections']} collection(s), {result['shards']} shard(s), "
        f"{result['points']} points, {_size(result['bytes'])} -> {result['target']} in {result['total_s']} s"
    )
    if result["pruned"]:
        _print(f"pruned: {', '.join(result['pruned'])}")


def restored(result: dict[str, Any], values: Mapping[str, Any]) -> None:
    points = ", ".join(f"{name}: {n}" for name, n in result["collections"].items())
    _print(f"restored set {result['set']} in {result['total_s']} s ({points})")
    if "catch_up" in result:
        _print(f"caught up: {result['catch_up']['repaired']} re-delivered, {result['catch_up']['left']} left")


def rebuilt(result: dict[str, Any], values: Mapping[str, Any]) -> None:
    _print(
        f"graph rebuilt: {result['memories']} memories in {result['write_s']} s "
        f"({result['memories_per_s']}/s), {result['orphans_removed']} orphan(s) removed, "
        f"graph now holds {result['graph_count']}"
    )


def demo(data: dict[str, Any], values: Mapping[str, Any]) -> None:
    from rich.rule import Rule

    from memoryctl.cli.chart import bars

    _print(
        f"profile {data['profile']}: {data['inserted']} sample memories added, {data['unchanged']} already there;"
        f" pending deliveries {data['pending']}"
    )
    for example in data["queries"]:
        out.print(Rule(f"memoryctl query {example['title']}"), markup=False)
        hits(example["result"])
        if values.get("explain"):
            plan(example["result"])
        if example["result"]["degraded"]:
            _print(f"degraded: {example['result']['degraded']}")
    out.print(Rule("memoryctl stats --metric sentiment --bucket 1d --since 7d"), markup=False)
    rows = data["stats"]
    for row, bar in zip(rows, bars([r["avg"] for r in rows]), strict=True):
        avg = f"{row['avg']:+.2f}" if row["avg"] is not None else "  -  "
        day = datetime.fromisoformat(row["bucket"])
        _print(f"{day:%Y-%m-%d}  memories {row['count']:>2}  sentiment avg {avg} {bar}")


def set_aside(rows: list[dict[str, Any]], values: Mapping[str, Any]) -> None:
    table = _table(f"outbox: {len(rows)} set aside")
    for col in ("row", "memory", "agent", "store", "op", "attempts", "queued", "error"):
        table.add_column(col, overflow="fold")
    for r in rows:
        queued = datetime.fromisoformat(str(r["created_at"])).isoformat(timespec="seconds")
        cells = (r["id"], r["memory_id"], r["agent_id"] or "-", r["target"], r["op"], r["attempts"], queued)
        table.add_row(*(str(c) for c in cells), r["last_error"] or "")
    out.print(table, markup=False)


def token_issued(data: dict[str, Any], values: Mapping[str, Any]) -> None:
    _print(f"{data['token']}")
    bound = "operator token" if data.get("operator") else f"token for agent {data['agent']!r}"
    err.print(f"{bound} {data['id']} ({data['name']})", markup=False, highlight=False)


def token_list(rows: list[dict[str, Any]], values: Mapping[str, Any]) -> None:
    table = _table("issued tokens", ("id", "agent", "name", "created"))
    for r in rows:
        table.add_row(r["id"], "(operator)" if r.get("operator") else r["agent"], r["name"], r["created_at"])
    out.print(table, markup=False)


def token_revoked(data: dict[str, Any], values: Mapping[str, Any]) -> None:
    _print(f"revoked: {', '.join(data['revoked'])}")


HUMAN: dict[str, Human] = {
    "query": query,
    "get": memory,
    "add": added,
    "import": imported,
    "forget": forgotten,
    "sync": synced,
    "stats": stats,
    "health": health,
    "init": initialised,
    "cypher": cypher,
    "runs": runs,
    "reconcile": reconciled,
    "migrate": migrated,
    "reembed": reembedded,
    "nightly": nightly,
    "feedback": recorded,
    "adapters": adapters,
    "backup status": backups,
    "backup qdrant": snapshot,
    "restore qdrant": restored,
    "rebuild graph": rebuilt,
    "demo": demo,
    "outbox list": set_aside,
    "outbox retry": lambda data, values: _print(f"back in the queue: {data['retried']}"),
    "outbox drop": lambda data, values: _print(f"dropped: {data['dropped']}"),
    "token issue": token_issued,
    "token list": token_list,
    "token revoke": token_revoked,
}
