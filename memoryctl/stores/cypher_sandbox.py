"""Caller-written Cypher (``memoryctl cypher``), read-only: the one place raw graph queries run.

Not part of the graph adapter: the adapter runs memoryctl's own Cypher, this module guards the
caller's. Three fences, because Neo4j Community Edition has no roles:

1. the query runs in a READ transaction, so the server refuses every write (CREATE, MERGE,
   DELETE, SET, REMOVE, schema commands, write procedures); that refusal becomes a ``UsageError``
   saying so;
2. before it runs, its plan (``EXPLAIN``) is inspected: ``LOAD CSV`` (it reads files and URLs
   from the server) and procedures other than the READ-mode ones the server declares (``SHOW
   PROCEDURES``) plus ``dbms.components`` are refused, because DBMS-mode procedures
   (``dbms.killConnections``, ``dbms.listConfig``, ``db.clearQueryCaches`` ...) run even in a
   READ transaction;
3. scoped to an agent, the query gets ``$agent_id`` bound and must use it (scoping is the
   caller's Cypher, so at least forgetting it is an error).

``CypherReader`` (``stores.protocols``) is what the client asks for; the embedded profile's SQL
graph offers none.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import islice
from typing import Any

import neo4j

from memoryctl.errors import StoreError, UsageError
from memoryctl.model import validate_agent_id
from memoryctl.stores.graph_neo4j import Neo4jBackend

_LOAD_CSV = re.compile(r"\bLOAD\s+CSV\b", re.IGNORECASE)
_EXTRA_PROCEDURES = frozenset({"dbms.components"})  # a version probe, declared DBMS-mode
_READ_ONLY = (
    "run_read runs in a read-only transaction, and this query writes "
    "(CREATE, MERGE, DELETE, SET, REMOVE, schema or write procedures are refused)"
)
_WRITE_HINT = "use memoryctl's write commands to change the graph"
_PROCEDURE_MODES = "SHOW PROCEDURES YIELD name, mode RETURN collect([name, mode]) AS modes"


class ReadOnlyCypher:
    """``CypherReader`` on Neo4j: caller-written Cypher through the three fences above."""

    def __init__(self, backend: Neo4jBackend) -> None:
        self.backend = backend
        self._modes: dict[str, str] | None = None

    def run_read(
        self,
        cypher: str,
        params: dict[str, Any] | None = None,
        agent_id: str | None = None,
        *,
        limit: int = 1000,
    ) -> list[dict[str, Any]]:
        """Run caller-written Cypher in a READ transaction and return at most ``limit`` rows."""
        bound = _checked(cypher, params, agent_id, limit)

        def work(tx: neo4j.ManagedTransaction) -> list[dict[str, Any]]:
            self._check_plan(tx.run("EXPLAIN " + cypher, bound).consume().plan)
            result = tx.run(cypher, bound)
            return [{k: _native(rec[k]) for k in rec.keys()} for rec in islice(result, limit)]

        try:
            return self.backend.read("run_read", work)
        except StoreError as exc:
            cause = exc.__cause__
            code = getattr(cause, "code", "") or ""
            if code == "Neo.ClientError.Statement.AccessMode":
                raise UsageError(
                    f"write refused: {_READ_ONLY}: {getattr(cause, 'message', '')}", hint=_WRITE_HINT
                ) from cause
            if code.startswith(("Neo.ClientError.Statement.", "Neo.ClientError.Procedure.", "Neo.ClientError.Schema.")):
                raise UsageError(f"Cypher rejected: {code}: {getattr(cause, 'message', '')}") from cause
            raise

    def _check_plan(self, plan: Any) -> None:
        """Refuse ``LOAD CSV`` and every procedure that is not declared READ-mode."""
        for op, details in plan_operators(plan):
            if "LoadCSV" in op:
                raise UsageError("LOAD CSV is not allowed in read-only queries")
            if "ProcedureCall" not in op:
                continue
            name = details.split("(")[0].strip().replace("`", "")
            mode = "READ" if name in _EXTRA_PROCEDURES else self._procedure_modes().get(name)
            if mode in ("WRITE", "SCHEMA"):
                raise UsageError(f"write refused: {_READ_ONLY} ({name} is a {mode} procedure)", hint=_WRITE_HINT)
            if mode != "READ":
                raise UsageError(
                    f"procedure call {name!r} is not allowed in read-only queries",
                    hint="READ-mode procedures (SHOW PROCEDURES) and dbms.components are allowed",
                )

    def _procedure_modes(self) -> dict[str, str]:
        """Every procedure's mode as the server declares it, asked once (it changes with the server only)."""
        if self._modes is None:
            rec = self.backend.read("procedures", lambda tx: tx.run(_PROCEDURE_MODES).single())
            self._modes = {str(name): str(mode) for name, mode in (rec["modes"] if rec is not None else [])}
        return self._modes


def _checked(cypher: str, params: dict[str, Any] | None, agent_id: str | None, limit: int) -> dict[str, Any]:
    """The parameters the query runs with, after everything that can be refused without the server."""
    if not isinstance(cypher, str) or not cypher.strip():
        raise UsageError("empty Cypher query")
    bound: dict[str, Any] = dict(params or {})
    if not all(isinstance(k, str) for k in bound):
        raise UsageError("Cypher parameter names must be strings")
    if agent_id is not None:
        agent = validate_agent_id(agent_id)
        if bound.get("agent_id", agent) != agent:
            raise UsageError("params['agent_id'] differs from the agent the query is scoped to")
        if "$agent_id" not in cypher:
            raise UsageError(
                "this query is scoped to an agent but does not use $agent_id",
                hint="filter with e.g. WHERE m.agent_id = $agent_id",
            )
        bound["agent_id"] = agent
    if type(limit) is not int or limit < 1:
        raise UsageError(f"limit must be a positive integer, not {limit!r}")
    if _LOAD_CSV.search(cypher):
        raise UsageError("LOAD CSV is not allowed in read-only queries")
    return bound


def plan_operators(plan: Any) -> Iterator[tuple[str, str]]:
    """(operatorType, details) for every operator of an EXPLAIN plan (a dict tree from the driver)."""
    if not isinstance(plan, dict):
        return
    args = plan.get("args") or {}
    yield str(plan.get("operatorType", "")), str(args.get("Details", ""))
    for child in plan.get("children") or ():
        yield from plan_operators(child)


def _native(value: Any) -> Any:
    """Driver values -> plain Python (neo4j.time -> datetime, graph objects -> dicts)."""
    if isinstance(value, neo4j.graph.Node):
        return {"labels": sorted(value.labels), **{k: _native(v) for k, v in value.items()}}
    if isinstance(value, neo4j.graph.Relationship):
        return {"type": value.type, **{k: _native(v) for k, v in value.items()}}
    if isinstance(value, neo4j.graph.Path):
        return {"nodes": [_native(n) for n in value.nodes], "relationships": [_native(r) for r in value.relationships]}
    if isinstance(value, list):
        return [_native(v) for v in value]
    if isinstance(value, dict):
        return {k: _native(v) for k, v in value.items()}
    to_native = getattr(value, "to_native", None)
    return to_native() if callable(to_native) else value
