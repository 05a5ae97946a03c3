"""The console's pieces that need no service (issue 44): sessions and CSRF tokens, the data
directory's secret, where sign-in may send a browser, the CSP, escaping of memories' text in the
real templates, the drawings' geometry, and operator tokens. The console against a real
``memoryctl serve`` and a real browser: tests/e2e/test_console_browser.py."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from memoryctl.console import draw
from memoryctl.console.session import SECRET_FILE, Sessions, load_secret
from memoryctl.console.web import CSP, HEADERS, age, environment, safe_next
from memoryctl.errors import InputError, NotFoundError
from memoryctl.operations.access import OPERATOR, issued_caller
from memoryctl.operations.tokens import AgentTokens

SECRET = b"k" * 32
HOSTILE = "<script>alert('x')</script> & <img src=x onerror=alert(1)>"


def test_a_session_reads_back_until_it_expires_or_ends() -> None:
    sessions = Sessions(SECRET, max_age_s=60)
    session, cookie = sessions.start("the token", now=1000.0)
    assert sessions.read(cookie, now=1001.0) == session
    assert "the token" not in cookie and session.token_sha256 != "the token"  # the digest only
    assert sessions.read(cookie, now=1060.0) is None  # the server's expiry, whatever the browser keeps
    sessions.end(session)
    assert sessions.read(cookie, now=1001.0) is None  # logged out: refused on the server too


@pytest.mark.parametrize(
    "cookie",
    [None, "", "garbage", "a.b.c", "eyJzaWQiOiAieCJ9.AAAA", "e30.{sig}"],
)
def test_a_forged_or_broken_cookie_is_no_session(cookie: str | None) -> None:
    sessions = Sessions(SECRET)
    if cookie and "{sig}" in cookie:  # signed, but not a session
        cookie = cookie.replace("{sig}", sessions._sign("e30"))
    assert sessions.read(cookie) is None


def test_a_cookie_changed_by_a_byte_or_signed_by_another_secret_is_refused() -> None:
    _, cookie = Sessions(SECRET).start("t")
    body, sig = cookie.split(".")
    tampered = body[:-1] + ("A" if body[-1] != "A" else "B") + "." + sig
    assert Sessions(SECRET).read(tampered) is None
    assert Sessions(b"other secret" * 3).read(cookie) is None


def test_csrf_tokens_are_bound_to_their_session() -> None:
    sessions = Sessions(SECRET)
    token = sessions.csrf("sid-1")
    assert sessions.csrf_ok("sid-1", token)
    assert not sessions.csrf_ok("sid-2", token)
    assert not sessions.csrf_ok("sid-1", None) and not sessions.csrf_ok(None, token)
    assert not sessions.csrf_ok("sid-1", token[:-1] + ("A" if token[-1] != "A" else "B"))


def test_the_secret_is_made_once_private_and_kept(tmp_path: Path) -> None:
    first = load_secret(tmp_path)
    path = tmp_path / SECRET_FILE
    assert len(first) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)
    assert load_secret(tmp_path) == first and stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_bytes(b"short")
    with pytest.raises(ValueError, match="remove it"):
        load_secret(tmp_path)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("/console/memories?text=a", "/console/memories?text=a"),
        (None, "/console/overview"),
        ("https://evil.example/console/", "/console/overview"),
        ("//evil.example/console/", "/console/overview"),
        ("/console//evil.example", "/console/overview"),
        ("/console/\\evil", "/console/overview"),
        ("/v1/query", "/console/overview"),
    ],
)
def test_sign_in_sends_a_browser_to_console_pages_only(given: str | None, expected: str) -> None:
    assert safe_next(given) == expected


def test_the_csp_forbids_inline_script_and_style_and_framing() -> None:
    directives = dict(d.strip().split(" ", 1) for d in CSP.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert "unsafe-inline" not in CSP and "unsafe-eval" not in CSP
    assert directives["frame-ancestors"] == "'none'" and directives["form-action"] == "'self'"
    names = {k for k, _ in HEADERS}
    assert {b"content-security-policy", b"x-content-type-options", b"referrer-policy"} <= names


def test_templates_hold_no_inline_script_style_or_handler() -> None:
    templates = Path(environment().loader.searchpath[0])  # type: ignore[union-attr]
    for page in templates.glob("*.html"):
        text = page.read_text()
        assert "<style" not in text and " style=" not in text, page.name
        assert " on" + "click=" not in text and "javascript:" not in text, page.name
        assert text.count("<script") == text.count('<script src="{{ prefix }}/static/'), page.name


def _memory(text: str) -> dict[str, object]:
    return {
        "id": "00000000-0000-0000-0000-000000000001",
        "agent_id": "a",
        "text": text,
        "kind": "note",
        "created_at": "2026-01-01",
        "updated_at": "2026-01-01",
        "content_hash": "h",
        "metadata": {"k<b>": "<i>v</i>"},
        "entities": [{"type": "User", "name": "<svg onload=alert(1)>"}],
        "relations": [],
        "deleted_at": None,
    }


def test_a_memorys_text_renders_as_text_in_the_page_and_the_graph() -> None:
    memory = _memory(HOSTILE)
    graph = draw.graph(
        {"id": memory["id"], "kind": "memory", "label": HOSTILE, "href": None},
        [{"id": "User:<svg onload=alert(1)>", "kind": "entity", "label": "User:<svg onload=alert(1)>", "href": None}],
        [],
        [(str(memory["id"]), "MENTIONS", "User:<svg onload=alert(1)>")],
    )
    html = environment().get_template("memory.html").render(ctx=None, memory=memory, graph=graph, state={}, aside=[])
    assert "<script>" not in html.replace('<script src="/console/static/console.js" defer></script>', "")
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &lt;img src=x onerror=alert(1)&gt;" in html
    assert "<svg onload" not in html and "&lt;svg onload=alert(1)&gt;" in html
    assert "<i>v</i>" not in html and "k&lt;b&gt;" in html


def test_a_chart_scales_its_values_into_the_box_and_skips_gaps() -> None:
    c = draw.chart("t", [("a", 1.0), ("b", None), ("c", 3.0)], width=240, height=140)
    assert [p["label"] for p in c.points] == ["a", "c"]
    (x1, y1), (x2, y2) = ((p["x"], p["y"]) for p in c.points)
    assert x1 == draw.PAD and x2 == 240 - draw.PAD  # first and last at the box's edges
    assert y1 == 140 - draw.PAD and y2 == draw.PAD  # the lowest at the bottom, the highest at the top
    assert draw.chart("t", [("a", None)]).empty and not draw.chart("t", [("a", 2.0)]).empty


def test_the_graph_puts_the_memory_in_the_middle_and_draws_known_edges_only() -> None:
    g = draw.graph(
        {"id": "m", "kind": "memory", "label": "m", "href": None},
        [{"id": f"E:{i}", "kind": "entity", "label": f"E:{i}", "href": None} for i in range(4)],
        [{"id": "n", "kind": "neighbour", "label": "n", "href": "/console/memories/n"}],
        [("m", "MENTIONS", "E:0"), ("n", "MENTIONS", "E:1"), ("m", "X", "nowhere")],
    )
    assert (g.nodes[0]["x"], g.nodes[0]["y"]) == (g.width / 2, g.height / 2)
    assert len({(n["x"], n["y"]) for n in g.nodes}) == len(g.nodes) == 6  # no two on one spot
    assert [e["label"] for e in g.edges] == ["MENTIONS", "MENTIONS"]


def test_age_reads_as_a_person_reads_it() -> None:
    assert [age(v) for v in (None, 5, 65, 3 * 3600 + 720, 2 * 86400 + 3600)] == [
        "-",
        "5 s",
        "1 min 5 s",
        "3 h 12 min",
        "2 d 1 h",
    ]


def test_an_operator_token_is_issued_hashed_named_and_revocable(tmp_path: Path) -> None:
    tokens = AgentTokens(tmp_path / "agent-tokens.json")
    issued = tokens.issue_operator(name="alice")
    assert issued["token"].startswith("mco_") and issued["operator"] is True and issued["name"] == "alice"
    assert issued["token"] not in (tmp_path / "agent-tokens.json").read_text()  # only its hash is kept
    entry = tokens.lookup(issued["token"])
    assert entry is not None
    caller = issued_caller(entry)
    assert caller == OPERATOR and caller.operator and caller.name == "operator (alice)"
    assert tokens.agent_of(issued["token"]) is None  # never taken for an agent's
    agent = tokens.issue("support")
    assert issued_caller(tokens.lookup(agent["token"]) or {}).agent == "support"
    assert [r.get("operator", False) for r in tokens.issued()] == [True, False]
    tokens.revoke([issued["id"]])
    assert tokens.lookup(issued["token"]) is None
    with pytest.raises(NotFoundError):
        tokens.revoke([issued["id"]])
    with pytest.raises(InputError):
        tokens.issue_operator(name=" ")


def test_token_issue_takes_an_agent_or_operator_not_both() -> None:
    from memoryctl.declaration.table import OPERATIONS

    op = OPERATIONS["token issue"]
    assert op.validate({"operator": True})["operator"] is True
    assert op.validate({"agent": "support"})["agent"] == "support"
    for params in ({}, {"agent": "support", "operator": True}):
        with pytest.raises(InputError, match="--operator"):
            op.validate(params)


def _night(day: int, recall: float, loss: float) -> dict[str, object]:
    from datetime import UTC, datetime

    from memoryctl.maintenance.nightly import NightlyReport, StepOutcome

    report = NightlyReport(
        steps=[
            StepOutcome("embedding", "ok", {"gate_metrics": {"candidate_recall_at_k": recall}, "version": "v1"}, 36.8),
            StepOutcome("generation", "rejected", {"gate_metrics": {"candidate_heldout_loss": loss}, "reason": "<b>"}),
        ]
    )
    started = datetime(2026, 12, day, 3, tzinfo=UTC)
    return {"id": day, "command": "nightly", "status": "ok", "started_at": started, "details": report.as_dict()}


def test_nights_chart_each_gate_figure_oldest_first_and_render_escaped() -> None:
    from memoryctl.console.runs import gate_charts, nights

    rows = [_night(3, 0.9, 1.5), {"id": 9, "command": "sync", "details": {}}, _night(2, 0.7, 2.0)]  # newest first
    found = nights(rows)
    assert [n["run"]["id"] for n in found] == [3, 2]
    assert found[0]["steps"][0]["figures"]["version"] == "v1"  # read as `memoryctl health` reads a night
    charts = {c.title: c for c in gate_charts(found)}
    assert set(charts) == {"embedding candidate_recall_at_k", "generation candidate_heldout_loss"}
    recall = charts["embedding candidate_recall_at_k"]
    assert [p["label"] for p in recall.points] == ["2026-12-02 03:00", "2026-12-03 03:00"]
    assert recall.points[0]["y"] > recall.points[1]["y"]  # 0.7 then 0.9: the line goes up
    html = (
        environment()
        .get_template("runs.html")
        .render(ctx=None, rows=rows, nights=found, charts=list(charts.values()), command="")
    )
    assert "<polyline" in html and "&lt;b&gt;" in html and "<b>" not in html


def test_the_overview_draws_a_clusters_members_peers_replicas_and_alerts() -> None:
    from memoryctl.console.overview import scalars
    from memoryctl.health.postgres import cluster_status
    from memoryctl.health.probes import qdrant_cluster_status

    server = {"in_recovery": False, "connected_to": "10.77.0.2:5432", "timeline": 4}
    standby = {"name": "pg-b", "address": "10.77.0.3", "state": "streaming", "sync_state": "sync", "lag_bytes": 128}
    postgres = cluster_status(server, [standby], members=["10.77.0.2:5432", "10.77.0.3:5432"], max_lag_bytes=1 << 20)
    peers = {"peers": {"1": {}, "2": {}}, "peer_id": 1, "raft_info": {"leader": 1, "role": "Leader", "term": 3}}
    shards = {"peer_id": 1, "shard_count": 1, "local_shards": [{"shard_id": 0, "state": "Active"}]}
    shards["remote_shards"] = [{"shard_id": 0, "peer_id": 2, "state": "Dead"}]
    qdrant = qdrant_cluster_status(peers, shards, 0.0)
    components = {
        "postgres": {"status": "ok", "latency_ms": 3.0, "cluster": postgres, "profile": "cluster"},
        "qdrant": {"status": "degraded", "latency_ms": 4.0, "cluster": qdrant, "error": "a replica <Dead>"},
        "alerting": {"status": "ok", "firing": ["PostgresReplicationLag"]},
    }
    health = {"status": "degraded", "version": "x", "checked_at": "now", "seconds": 0.1, "components": components}
    html = (
        environment()
        .get_template("overview.html")
        .render(
            ctx=None,
            health=health,
            components=components,
            scalars=scalars,
            clusters={k: c["cluster"] for k, c in components.items() if "cluster" in c},
            alerting=components["alerting"],
            last=[],
            runs_note="for an operator token",
            backups=None,
            backups_note="for an operator token",
        )
    )
    assert "Not in this profile" not in html
    assert "<td>pg-b</td>" in html and "<td>sync</td>" in html and "10.77.0.2:5432" in html  # leader, standby
    assert "<td>Dead</td>" in html and "shard 0 replica on peer 2 is Dead" in html  # Qdrant's replicas
    assert "PostgresReplicationLag" in html and "a replica &lt;Dead&gt;" in html


@pytest.mark.parametrize(("scheme", "secure"), [("http", False), ("https", True)])
def test_the_session_cookie_is_secure_when_the_request_came_over_tls(scheme: str, secure: bool) -> None:
    from starlette.requests import Request

    from memoryctl.console.web import cookie_flags

    request = Request({"type": "http", "scheme": scheme, "method": "GET", "path": "/", "headers": [], "server": None})
    assert cookie_flags(request) == {"httponly": True, "samesite": "strict", "secure": secure}
