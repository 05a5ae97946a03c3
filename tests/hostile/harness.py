"""Runs the cases of ``tests.hostile.cases`` against memoryctl and checks what must always hold.

Per case: no traceback anywhere; exit codes as documented (0 ok, 1 only for an unknown memory, 2
bad input with ``error:``, never 3 while every store is up) and HTTP statuses likewise (no 5xx);
a valid case succeeds; an id of another agent is refused, never moved; a query answers with the
asked agent's memories only, their text as written.

Per batch (``check``): every memory the run wrote reads back exactly as it was written (text byte
for byte, agent, kind, metadata, the instant of ``created_at``, forgotten or not), through
PostgreSQL in bulk and a sample through ``get``; ``sync`` leaves nothing pending and nothing set
aside; ``reconcile`` finds no drift in any store.

Defects are collected, not raised at once, so one run reports all it found (``Harness.defects``).
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import socket
import time
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from memoryctl.client import MemoryClient
from tests.e2e.serving import Served
from tests.hostile.cases import Case, Known

DEFAULT_AGENT = "support"
ALLOWED_HTTP = {200, 400, 401, 404, 405, 409, 411, 413}
SAMPLE_GETS = 20


@dataclass(slots=True)
class Expected:
    """A memory as the run wrote it."""

    agent: str
    text: str
    kind: str
    metadata: dict[str, Any]
    created_at: datetime | None  # None: "now" when written, not checked
    deleted: bool = False


@dataclass(slots=True)
class Outcome:
    code: int  # the CLI's exit code, or the one an HTTP reply carries
    status: int | None  # HTTP status (None for the CLI)
    data: Any  # the --json document / the reply body
    text: str  # everything printed or sent back, for the traceback check


@dataclass
class Harness:
    reader: MemoryClient  # PostgreSQL only, in this process: what a success wrote, read back
    served: Served | None  # HTTP cases need it; CLI cases go through it when it runs (its socket)
    tmp: Path
    reconcile_stores: tuple[str, ...] = ("vector", "graph")  # what `check` can compare in-process
    known: dict[uuid.UUID, Expected] = field(default_factory=dict)
    by_agent: dict[str, list[uuid.UUID]] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    defects: list[str] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    # ---- one case ---------------------------------------------------------------------------------
    def run(self, case: Case) -> None:
        self.counts["cases"] += 1
        self.counts[f"{case.channel}:{case.op}"] += 1
        try:
            if case.op == "argv":
                self._argv(case)
            elif case.op == "http-garbage":
                self._http_garbage(case)
            elif case.op == "raw":
                self._raw(case)
            else:
                self._operation(case)
        except Exception:
            self.defect(case, "the harness caught an exception:\n" + traceback.format_exc())

    def defect(self, case: Case | None, what: str) -> None:
        self.counts["defects"] += 1
        self.defects.append(f"{what}\n  case: {case!r}" if case else what)

    def _operation(self, case: Case) -> None:
        params = self._resolve(case)
        outcome = self._cli(case, params) if case.channel == "cli" else self._http_op(case, params)
        if outcome is None:
            return
        self.counts[f"exit {outcome.code}"] += 1
        if "Traceback" in outcome.text or "internal error" in outcome.text:
            self.defect(case, f"a traceback or internal error:\n{outcome.text[-4000:]}")
            return
        expected = self._expected_code(case, params)
        if outcome.code not in expected:
            self.defect(
                case,
                f"exit {outcome.code} (HTTP {outcome.status}), expected {sorted(expected)}:\n{outcome.text[-1500:]}",
            )
            return
        if outcome.code == 2 and case.channel == "cli" and "error:" not in outcome.text.lower():
            self.defect(case, f"exit 2 without an error: line:\n{outcome.text[-800:]}")
        if outcome.code == 1 and "no memory" not in outcome.text:
            self.defect(case, f"exit 1 that is not an unknown memory:\n{outcome.text[-800:]}")
        if outcome.code == 3 and case.op == "add" and not _stored_pending(outcome.data):
            self.defect(case, f"exit 3 that is not 'stored, delivery pending':\n{outcome.text[-800:]}")
            return
        self._record(case, params, outcome)

    def _expected_code(self, case: Case, params: dict[str, Any]) -> set[int]:
        """The exit codes the documentation allows here; a valid case has exactly one answer."""
        if case.op == "health":
            return {0, 3} if case.valid else {0, 2, 3}  # 3: a component degraded (e.g. no WireGuard here)
        if not case.valid:
            return {0, 1, 2} if case.op in ("get", "forget") else {0, 2}
        if case.op in ("get", "forget"):
            ids = [params["id"]] if case.op == "get" else params["ids"]
            return {0} if all(_uuid(i) in self.known for i in ids) else {1}
        if case.op == "add" and "id" in params:
            owner = self.known.get(_uuid(params["id"]))
            if owner is not None and owner.agent != params.get("agent", DEFAULT_AGENT):
                return {2}  # an id of another agent: a conflict
        if case.op == "import":
            return {0, 2}  # lines of another agent's ids are bad lines: 2
        if case.op == "add":
            # 3: stored in PostgreSQL, a store did not take it within the write's wait (a cold
            # Neo4j on a busy machine); documented, nothing lost: the batch's `sync` must deliver it
            # and the read-back must find it (both checked after every batch).
            return {0, 3}
        return {0}

    def _resolve(self, case: Case) -> dict[str, Any]:
        """``Known`` references replaced by ids the run has written (or fresh ones)."""
        agent = case.params.get("agent", DEFAULT_AGENT)

        def resolve(value: Any) -> Any:
            if not isinstance(value, Known):
                return value
            pool = (
                [i for a, ids in self.by_agent.items() if a != agent for i in ids]
                if value.foreign
                else self.by_agent.get(agent, [])
            )
            return str(pool[value.n % len(pool)]) if pool else str(uuid.uuid4())

        params = {
            k: ([resolve(v) for v in val] if isinstance(val, list) else resolve(val)) for k, val in case.params.items()
        }
        if case.lines is not None:
            case.lines = [
                {k: resolve(v) for k, v in line.items()} if isinstance(line, dict) else line for line in case.lines
            ]
        return params

    # ---- channels -------------------------------------------------------------------------------------
    def _cli(self, case: Case, params: dict[str, Any]) -> Outcome | None:
        argv = cli_argv(case, params, self.tmp)
        code, out, err = run_cli(argv)
        data = None
        if out.strip():
            with contextlib.suppress(ValueError):
                data = json.loads(out)
        return Outcome(code, None, data, out + err)

    def _http_op(self, case: Case, params: dict[str, Any]) -> Outcome | None:
        assert self.served is not None
        if case.op == "import":
            # A lone surrogate has no UTF-8 spelling: a client sends the bytes it would have
            # (surrogatepass), which the service must refuse as bad input, not stumble over.
            query = urlencode(
                {k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()},
                errors="surrogatepass",
            )
            status, head, data = self.served.request(f"/v1/import?{query}", jsonl(case.lines or []))
        else:
            status, head, data = self.served.request(f"/v1/{case.op}", _jsonable(params))
        text = json.dumps(data, default=str) if not isinstance(data, bytes) else data.decode("utf-8", "replace")
        if not self._status_ok(case, status, head, data, text):
            return None
        code = int(head.get("Memoryctl-Exit-Code", 0)) if status == 200 else int((data or {}).get("exit_code", 2))
        return Outcome(code, status, data, text)

    def _status_ok(self, case: Case, status: int, head: dict[str, str], data: Any, text: str) -> bool:
        self.counts[f"http {status}"] += 1
        if "Traceback" in text:
            self.defect(case, f"HTTP {status} with a traceback: {text[:1500]}")
            return False
        if status not in ALLOWED_HTTP:
            self.defect(case, f"HTTP {status}: {text[:1500]}")
            return False
        if status != 200 and not (isinstance(data, dict) and data.get("error")):
            self.defect(case, f"HTTP {status} without a JSON error: {text[:500]}")
            return False
        return True

    def _argv(self, case: Case) -> None:
        code, out, err = run_cli(case.argv or [])
        self.counts[f"exit {code}"] += 1
        if "Traceback" in out + err or code not in (0, 1, 2, 3):
            self.defect(case, f"argv {case.argv!r}: exit {code}\n{(out + err)[-1500:]}")
        elif code == 1 and "no memory" not in err:
            self.defect(case, f"argv {case.argv!r}: exit 1 that is not an unknown memory:\n{err[-800:]}")

    def _http_garbage(self, case: Case) -> None:
        assert self.served is not None
        p = case.params
        status, head, data = self.served.request(p["path"], p["body"], method=p["method"])
        text = json.dumps(data, default=str) if not isinstance(data, bytes) else data.decode("utf-8", "replace")
        if self._status_ok(case, status, head, data, text) and status == 200 and p["path"].endswith("/add"):
            if isinstance(data, dict) and "id" in data:  # garbage that is a valid add: then it is a memory
                self._as_stored(case, [data["id"]])

    def _raw(self, case: Case) -> None:
        assert self.served is not None and case.raw is not None
        split = urlsplit(self.served.url)
        request = case.raw.replace(b"{token}", self.served.token.encode())
        with socket.create_connection((split.hostname, split.port), timeout=30) as conn:
            try:
                if case.pace == "slow":  # a whole request in four pieces, then wait for the answer
                    for i in range(0, len(request), max(1, len(request) // 4)):
                        conn.sendall(request[i : i + max(1, len(request) // 4)])
                        time.sleep(0.05)
                else:  # garbage or a request cut short: the client is done (half-close)
                    conn.sendall(request)
                    conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the server may answer and close before it has read everything: that is fine
            reply = b""
            with contextlib.suppress(OSError):
                while chunk := conn.recv(65536):
                    reply += chunk
        line = reply.split(b"\r\n", 1)[0].decode("latin-1")
        status = int(line.split()[1]) if line.startswith("HTTP/") and len(line.split()) > 1 else None
        self.counts[f"raw {status}"] += 1
        if b"Traceback" in reply or (status is not None and status >= 500 and status != 503):
            self.defect(case, f"raw request answered {line!r}: {reply[-800:]!r}")
        if case.pace == "slow" and status != 200:
            self.defect(case, f"a valid request sent slowly got {line!r}")

    # ---- what a success wrote ----------------------------------------------------------------------
    def _record(self, case: Case, params: dict[str, Any], outcome: Outcome) -> None:
        if case.op == "add" and outcome.code in (0, 3):
            mid = outcome.data["id"] if isinstance(outcome.data, dict) else None
            if mid is None:
                self.defect(case, f"add succeeded without an id: {outcome.text[:300]}")
                return
            if case.valid:
                self._remember(mid, params.get("agent") or DEFAULT_AGENT, params)
            else:
                self._as_stored(case, [mid])
        elif case.op == "import" and isinstance(outcome.data, dict) and "invalid" in outcome.data:
            self._imported(case, params, outcome.data)
        elif case.op == "forget" and outcome.code == 0 and isinstance(outcome.data, dict):
            for mid in outcome.data.get("forgotten", []):
                memory = self.known.get(uuid.UUID(mid))
                if memory is None:
                    self.defect(case, f"forget reported {mid}, which the run never wrote")
                else:
                    memory.deleted = True
        elif case.op == "query" and outcome.code == 0 and isinstance(outcome.data, dict):
            agent = params.get("agent", DEFAULT_AGENT)
            for hit in outcome.data.get("hits", []):
                if hit["agent_id"] != agent:
                    self.defect(case, f"a query for {agent!r} answered a memory of {hit['agent_id']!r}")
                memory = self.known.get(uuid.UUID(hit["id"]))
                if memory is not None and (memory.text != hit["text"] or memory.deleted):
                    self.defect(case, f"query hit {hit['id']} is not the memory as written: {hit['text']!r}")

    def _imported(self, case: Case, params: dict[str, Any], reply: dict[str, Any]) -> None:
        bad = {b["line"]: b["error"] for b in reply["invalid"]}
        if params.get("strict") and bad:
            return
        forced = params.get("agent") or DEFAULT_AGENT
        hostile: list[str] = []
        for n, line in enumerate(case.lines or [], start=1):
            if n in bad and case.valid and "another agent" not in bad[n]:
                self.defect(case, f"a valid line {n} was refused: {bad[n]}")
            if n in bad or not isinstance(line, dict) or _uuid(line.get("id")) is None:
                continue
            if case.valid:
                self._remember(line["id"], forced, {**line, "at": line.get("created_at")})
            else:
                hostile.append(line["id"])
        self._as_stored(case, hostile)

    def _as_stored(self, case: Case, mids: list[str]) -> None:
        """What a hostile case managed to write, as PostgreSQL holds it now: later reads must
        give exactly that back (the harness cannot say what a hostile value should become)."""
        stored = self.reader.stack.records.get_many([u for u in map(_uuid, mids) if u is not None])
        for mid, m in stored.items():
            old = self.known.get(mid)
            if old is not None and old.agent != m.agent_id:
                self.defect(case, f"memory {mid} of {old.agent!r} now belongs to {m.agent_id!r}: a move")
                continue
            self.known[mid] = Expected(m.agent_id, m.text, m.kind, m.metadata, m.created_at, m.deleted_at is not None)
            if old is None:
                self.by_agent.setdefault(m.agent_id, []).append(mid)

    def _remember(self, mid: str, agent: str, fields: dict[str, Any]) -> None:
        key = _uuid(mid)
        assert key is not None
        old = self.known.get(key)
        if old is not None and old.agent != agent:
            self.defect(None, f"memory {key} of {old.agent!r} was written as {agent!r}: a move")
            return
        if old is not None and old.deleted:
            return  # a forgotten memory stays forgotten
        metadata = fields.get("metadata") or {}
        expected = Expected(
            agent=agent,
            text=fields["text"],
            kind=fields.get("kind") or "note",
            metadata=metadata,
            created_at=datetime.fromisoformat(fields["at"].replace("Z", "+00:00")) if fields.get("at") else None,
        )
        if old is not None:
            expected.created_at = old.created_at  # created_at is immutable
        self.known[key] = expected
        if old is None:
            self.by_agent.setdefault(agent, []).append(key)

    # ---- after each batch --------------------------------------------------------------------------
    def check(self, *, stores: tuple[str, ...] | None = None) -> None:
        """Read back, drain, reconcile: the invariants that hold between batches."""
        client = self.reader
        self.counts["checks"] += 1
        self._drained(client)
        self._read_back(client)
        # Its own client, closed at once: an in-process CLI call then opens Qdrant Edge again.
        with MemoryClient(client.settings) as own:
            report = own.reconcile(stores=stores if stores is not None else self.reconcile_stores)
        drift = {name: s.as_dict() for name, s in report.stores.items() if s.drift}
        if drift or report.skipped or report.errors or report.drift:
            self.defect(None, f"reconcile: drift {drift}, skipped {report.skipped}, errors {report.errors}")

    def _drained(self, client: MemoryClient) -> None:
        if self.served is not None:
            status, head, data = self.served.request("/v1/sync", {})
            code = int(head.get("Memoryctl-Exit-Code", 1)) if status == 200 else status
        else:
            code, out, _ = run_cli(["sync", "--json"])
            data = json.loads(out) if code in (0, 3) else None
        if code != 0 or any((data or {}).get("pending", {"?": 1}).values()):
            self.defect(None, f"sync left work pending: {data}")
        aside = client.set_aside()
        if aside:
            self.defect(None, f"delivery set {len(aside)} rows aside: {[r['last_error'] for r in aside[:5]]}")

    def _read_back(self, client: MemoryClient) -> None:
        stored = client.stack.records.get_many(list(self.known))
        for mid, want in self.known.items():
            got = stored.get(mid)
            if got is None:
                self.defect(None, f"memory {mid} ({want.agent!r}) is gone")
                continue
            problems = [
                name
                for name, same in (
                    ("agent", got.agent_id == want.agent),
                    ("text", got.text == want.text),
                    ("kind", got.kind == want.kind),
                    ("metadata", json_equal(got.metadata, want.metadata)),
                    ("created_at", want.created_at is None or got.created_at == want.created_at),
                    ("deleted", (got.deleted_at is not None) == want.deleted),
                )
                if not same
            ]
            if problems:
                self.defect(None, f"memory {mid} reads back changed ({problems}): {got.to_json()} vs {want}")
        for mid in self.rng.sample(sorted(self.known), min(SAMPLE_GETS, len(self.known))):
            code, out, err = run_cli(["get", str(mid), "--json"])
            if code != 0 or json.loads(out)["text"] != self.known[mid].text:
                self.defect(None, f"`get {mid}` does not give the memory back: exit {code} {err[-300:]}")
        self.counts["memories"] = len(self.known)


# ---- helpers -----------------------------------------------------------------------------------------
def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """The console script in this process, as ``memoryctl.cli.main.run`` runs it: the fast path to
    a running service first, the full command line otherwise; (exit code, stdout, stderr)."""
    from memoryctl.cli import fast
    from memoryctl.cli.main import _invoke, guarded

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            answered = guarded(lambda: fast.run(argv))
            code = _invoke(argv) if answered is None else answered
        except Exception:
            err.write(traceback.format_exc())
            code = -1
    return code, out.getvalue(), err.getvalue()


def cli_argv(case: Case, params: dict[str, Any], tmp: Path) -> list[str]:
    """The command line that asks what ``params`` asks (flags after the command, text after ``--``)."""
    p = dict(params)
    argv = [case.op]
    if case.op == "import":
        path = tmp / f"import-{uuid.uuid4().hex}.jsonl"
        path.write_bytes(jsonl(case.lines or []))
        argv.append(str(path))
        if p.get("strict"):
            argv.append("--strict")
    elif case.op == "health":
        argv += ["--deadline", str(p.pop("deadline"))]
    flags = {"agent": "--agent", "kind": "--kind", "at": "--at", "entity": "--entity"}
    flags |= {"id": "--id"} if case.op == "add" else {}
    flags |= {"since": "--since", "until": "--until", "combine": "--combine", "limit": "--limit"}
    flags |= {"threshold": "--threshold", "retrieval": "--retrieval", "half_life": "--half-life"}
    flags |= {"hops": "--hops", "direction": "--direction", "bucket": "--bucket", "metric": "--metric"}
    repeated = {"entities": "--entity", "relations": "--rel", "via": "--via", "where": "--where"}
    for name, value in p.items():
        if name in flags and case.op != "import":
            argv += [flags[name], str(value)]
        elif name in repeated:
            for v in value:
                argv += [repeated[name], str(v)]
        elif name == "metadata":
            for k, v in value.items():
                argv += ["--meta", f"{k}={cli_meta(v)}"]
        elif name == "agent" and case.op == "import":
            argv += ["--agent", str(value)]
    argv.append("--json")
    positional = [str(p["text"])] if case.op in ("add", "query") and "text" in p else []
    positional += [str(i) for i in p["ids"]] if case.op == "forget" else []
    positional += [str(p["id"])] if case.op == "get" else []
    # A value that starts with "-" would be read as an option: "--" ends the options (typer's
    # path); otherwise plain, which the console script's fast path answers.
    return argv + (["--"] if any(v.startswith("-") for v in positional) else []) + positional


def cli_meta(value: Any) -> str:
    """``--meta key=value``: JSON for anything but a string that is not itself JSON."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value
    return json.dumps(value)


def jsonl(lines: list[Any]) -> bytes:
    return b"".join((line if isinstance(line, bytes) else _dumps(line).encode()) + b"\n" for line in lines)


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value)  # NaN and Infinity as JSON's extensions: a hostile line
    except (TypeError, ValueError):
        return json.dumps(str(value))


def _jsonable(params: dict[str, Any]) -> bytes:
    return _dumps(params).encode()


def json_equal(a: Any, b: Any) -> bool:
    """Equal as JSON values: a number is its value, whatever its spelling (jsonb keeps numbers as
    decimals and gives ``3.4e+38`` back as ``340000000000000000000000000000000000000``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return Decimal(repr(a)) == Decimal(repr(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def _stored_pending(reply: Any) -> bool:
    """An add's exit-3 reply that says the memory is stored and a store's delivery is pending."""
    pending = reply.get("pending") if isinstance(reply, dict) else None
    return isinstance(reply, dict) and "id" in reply and isinstance(pending, dict) and any(pending.values())
