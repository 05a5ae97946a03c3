"""What the operator's operations do: cypher, runs, reconcile, migrate, reembed, nightly, feedback,
adapters, backups and restores, the demo, agent tokens. Like ``memoryctl.operations.memories``:
validated parameters in, the ``Reply`` every surface prints out, so that the command line runs
them through the service (the embedded profile's single owner of the stores) or in-process alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memoryctl.declaration import replies as R
from memoryctl.errors import ExitCode, MemoryctlError, UsageError
from memoryctl.operations.memories import only_agent
from memoryctl.operations.reply import Reply

if TYPE_CHECKING:
    from memoryctl.client import MemoryClient
    from memoryctl.operations import Call


def _exit(failed: bool, code: ExitCode = ExitCode.PARTIAL) -> int:
    return int(code) if failed else int(ExitCode.OK)


def cypher(client: MemoryClient, call: Call) -> Reply:
    from memoryctl.operations.memories import agent_of

    p = call.params
    return Reply(client.cypher(p["statement"], p["params"] or {}, agent_id=agent_of(client, p)))


def runs(client: MemoryClient, call: Call) -> Reply:
    rows = client.runs(command=call.params["command"], limit=call.params["limit"])
    for row in rows:
        seconds = (row["finished_at"] - row["started_at"]).total_seconds() if row["finished_at"] else None
        row["seconds"] = None if seconds is None else round(seconds, 3)
    return Reply(rows)


def _bar(call: Call, phase: str, total: int | None) -> Any:
    """``advance(n)`` for one progress bar, or None when the caller draws none."""
    report = call.progress
    if report is None:
        return None
    return lambda n: report(phase, n, total)


def reconcile(client: MemoryClient, call: Call) -> Reply:
    p = call.params
    agent_id = only_agent(p)
    total = client.count(agent_id=agent_id, include_deleted=True) if call.progress else None
    report = client.reconcile(agent_id=agent_id, repair=p["repair"], progress=_bar(call, "reconcile", total))
    left = report.unrepaired if p["repair"] else report.drift
    return Reply(report.as_dict(), _exit(bool(left or report.skipped or report.errors)))


def migrate(client: MemoryClient, call: Call) -> Reply:
    from memoryctl.maintenance.models import parse_model_spec
    from memoryctl.model import parse_duration

    p = call.params  # exactly one action: the declaration's one_of
    options: dict[str, Any] = {"batch": p["batch"], "sample": p["sample"], "min_recall": p["min_recall"]}
    if p["to_model"] is not None:
        options["target"] = parse_model_spec(p["to_model"], client.settings.embedder)
        action = "migrate"
    else:
        action = next(a for a in ("rollback", "cleanup", "abandon") if p[a])
        if p["cleanup"]:
            options["grace"] = parse_duration(p["grace"])
    report = client.migrate_model(action, progress=call.progress, **options)
    return Reply(report.as_dict(), _exit(report.status == "verify-failed"))


def reembed(client: MemoryClient, call: Call) -> Reply:
    p = call.params
    if not p["changed"]:
        raise UsageError(
            "reembed needs --changed",
            hint="to re-embed everything with another model use `memoryctl migrate --to-model ...`",
        )
    agent_id = only_agent(p)
    total = client.count(agent_id=agent_id) if call.progress else None
    report = client.reembed_changed(agent_id=agent_id, batch=p["batch"], progress=_bar(call, "reembed", total))
    return Reply(report.as_dict())


def nightly(client: MemoryClient, call: Call) -> Reply:
    report = client.nightly()
    return Reply(report.as_dict(), _exit(report.failed, ExitCode.FAILURE))


def feedback(client: MemoryClient, call: Call) -> Reply:
    from memoryctl.model import parse_uuid

    p = call.params
    client.feedback(parse_uuid(p["query_id"]), parse_uuid(p["memory_id"]), useful=p["useful"])
    return Reply(R.Recorded(recorded=True))


def adapters(client: MemoryClient, call: Call) -> Reply:
    from memoryctl.maintenance.adapters import (
        adapter_kind,
        embedding_rolled_back,
        list_adapters,
        rollback_adapter,
        serve_active_adapter,
    )
    from memoryctl.maintenance.training import training_side

    kind = call.params["kind"]
    warnings = []
    if call.params["rollback"] and adapter_kind(kind) == "embedding":
        training_side()  # the registry is here (memoryctl-lora installed), or the hint
        warnings.append(embedding_rolled_back(client.migrate_model("rollback")))  # the registry follows
    elif call.params["rollback"]:
        warnings.append(rollback_adapter(client.stack, kind))
    if call.params["serve_active"]:
        warnings.append(
            serve_active_adapter(client.settings, kind, wait=call.params["wait"], night_running=night_running(client))
        )
    return Reply(list_adapters(client.settings, kind), warnings=warnings)


def night_running(client: MemoryClient) -> Callable[[], bool]:
    """Whether a ``memoryctl nightly`` holds its advisory lock now. PostgreSQL not answering counts
    as no night: a night cannot run without it (its lock is there), and at a boot with the database
    node still down the active adapter should be served all the same."""

    def check() -> bool:
        from memoryctl.maintenance.nightly import LOCK
        from memoryctl.maintenance.pgstate import OpsState

        try:
            with OpsState(client.stack.pool).exclusive(LOCK) as got:
                return not got
        except MemoryctlError:
            return False

    return check


def backup_status(client: MemoryClient, call: Call) -> Reply:
    from memoryctl.backup.status import prometheus

    report = client.backup_status()
    if call.params["prometheus"]:
        return Reply({"prometheus": prometheus(report)}, report.exit_code)
    return Reply(report.as_dict(), report.exit_code)


def backup_qdrant(client: MemoryClient, call: Call) -> Reply:
    return Reply(client.backup_vectors())


def restore_qdrant(client: MemoryClient, call: Call) -> Reply:
    """Restore a snapshot set, then (``catch_up``) deliver what waited in the outbox while the
    collection was gone and repair what the snapshot predates: the vector store only (the graph
    is ``rebuild graph``'s)."""
    result = client.restore_vectors(name=call.params["set"])
    left = 0
    if call.params["catch_up"]:
        client.sync()
        report = client.reconcile(repair=True, stores=("vector",))
        left = report.unrepaired
        result["catch_up"] = {"repaired": sum(s.repaired for s in report.stores.values()), "left": left}
    return Reply(result, _exit(bool(left)))


def rebuild_graph(client: MemoryClient, call: Call) -> Reply:
    return Reply(client.rebuild_graph(batch=call.params["batch"], prune=call.params["prune"]))


def outbox_list(client: MemoryClient, call: Call) -> Reply:
    return Reply(client.set_aside(limit=call.params["limit"]))


def _rows(call: Call) -> list[int] | None:
    """The rows named, or None for ``--all`` (one or the other: the declaration's one_of)."""
    return None if call.params["all"] else list(call.params["rows"])


def outbox_retry(client: MemoryClient, call: Call) -> Reply:
    n = client.retry_set_aside(_rows(call))
    return Reply(
        R.Retried(retried=n),
        warnings=["the next write, `memoryctl sync` or the service's delivery takes them"] if n else [],
    )


def outbox_drop(client: MemoryClient, call: Call) -> Reply:
    return Reply(R.Dropped(dropped=client.drop_set_aside(_rows(call))))


def demo(client: MemoryClient, call: Call) -> Reply:
    from memoryctl.operations.demo import run_demo

    return Reply(run_demo(client))


def token_issue(client: MemoryClient, call: Call) -> Reply:
    from memoryctl.operations.tokens import AgentTokens

    tokens, p = AgentTokens.of(client.settings), call.params
    issued = tokens.issue_operator(name=p["name"]) if p["operator"] else tokens.issue(p["agent"], name=p["name"])
    return Reply(issued, warnings=["the token is shown once: keep it (only its hash is stored)"])


def token_list(client: MemoryClient, call: Call) -> Reply:
    from memoryctl.operations.tokens import AgentTokens

    return Reply(AgentTokens.of(client.settings).issued())


def token_revoke(client: MemoryClient, call: Call) -> Reply:
    from memoryctl.operations.tokens import AgentTokens

    return Reply(R.Revoked(revoked=AgentTokens.of(client.settings).revoke(call.params["ids"])))
