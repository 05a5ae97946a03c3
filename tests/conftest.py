"""Shared fixtures: the real servers started by scripts/services (via scripts/test or .ci/run).

PostgreSQL (with TimescaleDB preloaded), Neo4j and a Qdrant server. Integration tests never skip
because a server is missing: they fail and say which command starts it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings

from memoryctl.client import MemoryClient
from memoryctl.config import Settings, load_settings

# Property tests check results, never durations (speed lives in benchmarks/): on two busy cores
# Hypothesis' own timing checks (a slow example, slow input generation) fail tests that are right.
# derandomize: every property test draws the same cases on every machine and run (its seed comes from
# the test's own source), so a local run reproduces CI's and no example database carries state between
# them (issue 42). The hostile-client harness sets its own fresh, printed seed.
settings.register_profile(
    "memoryctl", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True, database=None
)
settings.load_profile("memoryctl")

HINT = 'start the test servers with `scripts/services up` and `eval "$(scripts/services env)"` (scripts/test does both)'


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: {HINT}", pytrace=False)
    return value


@pytest.fixture(scope="session")
def pg_admin_dsn() -> str:
    dsn = _env("MEMORYCTL_TEST_PG_DSN")
    try:
        psycopg.connect(dsn, connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at {dsn} is unreachable ({exc}): {HINT}", pytrace=False)
    return dsn


@contextlib.contextmanager
def fresh_database(admin_dsn: str) -> Iterator[str]:
    """A new, empty database (the name is generated here, never user text), dropped afterwards."""
    name = f"mctl_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = admin_dsn.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A fresh, empty database per test."""
    with fresh_database(pg_admin_dsn) as dsn:
        yield dsn


@pytest.fixture(scope="session")
def neo4j_env() -> dict[str, str]:
    return {"uri": _env("MEMORYCTL_TEST_NEO4J_URI"), "password": os.environ.get("MEMORYCTL_TEST_NEO4J_PASSWORD", "")}


def wipe_neo4j(neo4j_env: dict[str, str]) -> dict[str, str]:
    """Neo4j Community has one user database: empty it."""
    from neo4j import GraphDatabase

    auth = ("neo4j", neo4j_env["password"]) if neo4j_env["password"] else None
    try:
        with GraphDatabase.driver(neo4j_env["uri"], auth=auth, connection_timeout=5) as driver:
            with driver.session() as session:  # an auto-commit transaction, as IN TRANSACTIONS needs
                session.run("MATCH (n) CALL (n) { DETACH DELETE n } IN TRANSACTIONS OF 5000 ROWS").consume()
    except Exception as exc:  # any failure here means the server is not usable
        pytest.fail(f"Neo4j at {neo4j_env['uri']} is unusable ({exc}): {HINT}", pytrace=False)
    return neo4j_env


@pytest.fixture
def neo4j_clean(neo4j_env: dict[str, str]) -> dict[str, str]:
    return wipe_neo4j(neo4j_env)


# ---------------------------------------------------------------------------------------- Qdrant
# One Qdrant server for the whole session (scripts/qdrant-server). Each test gets its own
# collection prefix and alias, derived from its data directory so that two clients a test opens on
# the same directory share the collections; what a test created is dropped when it ends.

_qdrant_checked: dict[str, Any] = {}
_qdrant_scopes: list[tuple[str, str]] = []  # (collection prefix, alias) created during the session


def qdrant_env() -> dict[str, Any]:
    """URL and API key of the test server, checked once per session (fails, never skips)."""
    if not _qdrant_checked:
        import httpx

        url = _env("MEMORYCTL_TEST_QDRANT_URL")
        key = os.environ.get("MEMORYCTL_TEST_QDRANT_API_KEY") or None
        try:
            answer = httpx.get(f"{url}/collections", headers={"api-key": key or ""}, timeout=5)
        except httpx.HTTPError as exc:
            pytest.fail(f"Qdrant at {url} is unreachable ({exc}): {HINT}", pytrace=False)
        if answer.status_code != 200:
            pytest.fail(f"Qdrant at {url} answered {answer.status_code} (API key?): {HINT}", pytrace=False)
        _qdrant_checked.update(url=url, api_key=key)
    return dict(_qdrant_checked)


def qdrant_scope(anchor: Path | str) -> dict[str, Any]:
    """Server settings with a collection prefix and alias private to ``anchor`` (dropped after the test)."""
    tag = "t" + hashlib.sha256(str(anchor).encode()).hexdigest()[:12]
    scope = (tag, f"{tag}_memories")
    if scope not in _qdrant_scopes:
        _qdrant_scopes.append(scope)
    return {**qdrant_env(), "collection_prefix": scope[0], "alias": scope[1]}


def drop_qdrant_scope(client: Any, prefix: str, alias: str) -> None:
    """Delete the alias and every collection named ``<prefix>__…`` on the server."""
    from qdrant_client import models as qm

    if any(a.alias_name == alias for a in client.get_aliases().aliases):
        client.update_collection_aliases(
            change_aliases_operations=[qm.DeleteAliasOperation(delete_alias=qm.DeleteAlias(alias_name=alias))]
        )
    for c in client.get_collections().collections:
        if c.name.startswith(prefix + "__"):
            client.delete_collection(c.name)


def _drop_scopes(scopes: list[tuple[str, str]]) -> None:
    if not scopes:
        return
    from qdrant_client import QdrantClient

    env = qdrant_env()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Api key is used with an insecure connection")  # loopback
        client = QdrantClient(url=env["url"], api_key=env["api_key"], timeout=30)
    try:
        for prefix, alias in scopes:
            drop_qdrant_scope(client, prefix, alias)
    finally:
        client.close()


@pytest.fixture(autouse=True)
def _qdrant_cleanup() -> Iterator[None]:
    """Drop the Qdrant collections a test created (module-scoped fixtures' ones at session end)."""
    start = len(_qdrant_scopes)
    yield
    created = _qdrant_scopes[start:]
    del _qdrant_scopes[start:]
    _drop_scopes(created)


# ------------------------------------------------------------------- skips, backends, figures
# In CI (CI=true, set by .ci/run) a skipped test fails the run unless it is on this reviewed
# allow-list (node id prefix -> why it may skip there); the list is printed at the end of every run.
SKIP_ALLOWLIST: dict[str, str] = {}
# Parametrised suites whose parameters are backends: each backend is run or reported, never silently absent.
BACKEND_FIXTURES = {"factory": "vector-store backends", "ctx": "graph-store backends"}

_report: list[str] = []
_skips: list[tuple[str, str]] = []
_backends: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))


def report_line(line: str) -> None:
    """A figure a test wants in the run's summary (CI keeps the log; figures are not assertions)."""
    _report.append(line)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Backends per parametrised suite among the tests that will run (after -m/-k deselection)."""
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        for name, label in BACKEND_FIXTURES.items():
            if name in params:
                _backends[label][str(params[name])]["collected"] += 1


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    return report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A module skipped while it is collected (``pytest.importorskip`` at its top, ``pytest.skip(...,
    allow_module_level=True)``) drops every test in it without a single test report: it counts as a
    skip like any other, so CI fails on it unless it is allowed (issue 25, item 3)."""
    if report.skipped:
        _skips.append((report.nodeid, _skip_reason(report)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skips.append((report.nodeid, _skip_reason(report)))
    if report.when == "call" or (report.when == "setup" and not report.passed):
        params = getattr(report, "_backend_params", None)
        if params:
            for label, value in params:
                _backends[label][value][report.outcome] += 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    params = getattr(getattr(item, "callspec", None), "params", {})
    outcome.get_result()._backend_params = [  # type: ignore[attr-defined]
        (label, str(params[name])) for name, label in BACKEND_FIXTURES.items() if name in params
    ]


def _disallowed_skips() -> list[tuple[str, str]]:
    return [(n, r) for n, r in _skips if not any(n.startswith(prefix) for prefix in SKIP_ALLOWLIST)]


def _backends_not_run() -> list[str]:
    """Backends of a parametrised suite that were collected and never ran (each must run in CI)."""
    return [
        f"{label}: {value}"
        for label, per in sorted(_backends.items())
        for value, c in sorted(per.items())
        if not any(n for k, n in c.items() if k != "collected")
    ]


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _qdrant_checked:
        _drop_scopes(_qdrant_scopes)
    if in_ci() and (_disallowed_skips() or _backends_not_run()) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    tr = terminalreporter
    if _report:
        tr.write_sep("-", "figures reported by tests")
        for line in _report:
            tr.write_line(line)
    if _backends:
        tr.write_sep("-", "backends of parametrised suites")
        for label, per in sorted(_backends.items()):
            parts = []
            for value, c in sorted(per.items()):
                ran = {k: v for k, v in c.items() if k != "collected"}
                parts.append(f"{value}: " + (", ".join(f"{v} {k}" for k, v in sorted(ran.items())) or "NOT RUN"))
            tr.write_line(f"{label}: " + "; ".join(parts))
    tr.write_sep("-", f"skip policy ({'CI=true: skips fail the run' if in_ci() else 'not CI: skips reported'})")
    tr.write_line(
        "allow-list: " + ("; ".join(f"{k} ({v})" for k, v in SKIP_ALLOWLIST.items()) if SKIP_ALLOWLIST else "empty")
    )
    tr.write_line(f"skipped: {len(_skips)}")
    for nodeid, reason in _disallowed_skips():
        tr.write_line(f"{'FAILS CI' if in_ci() else 'would fail CI'}: {nodeid}: {reason}")
    for backend in _backends_not_run():
        tr.write_line(f"{'FAILS CI' if in_ci() else 'would fail CI'}: backend NOT RUN: {backend}")


def cluster_data(pg_dsn: str, neo4j: dict[str, str], qdrant_path: Path, **extra: object) -> dict[str, Any]:
    """The cluster profile against the test servers, as configuration data; ``qdrant_path`` names
    the test's Qdrant scope (collections private to it on the real server), its parent is the data
    directory."""
    data: dict[str, Any] = {
        "profile": "cluster",
        "data_dir": qdrant_path.parent,
        "postgres": {"dsn": pg_dsn, "connect_timeout_s": 3},
        # Generous: a JVM on 2 busy cores; the tests that need a short timeout set their own.
        "neo4j": {"uri": neo4j["uri"], "password": neo4j["password"] or None, "timeout_s": 15.0},
        "qdrant": {**qdrant_scope(qdrant_path), "timeout_s": 5.0},
        "embedder": {"kind": "hash"},
    }
    data.update(extra)
    return data


def cluster_settings(pg_dsn: str, neo4j: dict[str, str], qdrant_path: Path, **extra: object) -> Settings:
    return load_settings(Path(os.devnull), **cluster_data(pg_dsn, neo4j, qdrant_path, **extra))


def write_cluster_config(path: Path, pg_dsn: str, neo4j: dict[str, str], qdrant_path: Path, **extra: object) -> Path:
    """The same configuration as a TOML file, for tests that run the ``memoryctl`` command."""
    path.write_text(_toml(cluster_data(pg_dsn, neo4j, qdrant_path, **extra)))
    return path


def _toml(data: dict[str, Any], table: str = "") -> str:
    """Enough TOML for configuration data: scalars, paths, lists and nested tables (None is left out)."""
    scalars = [f"{k} = {_toml_value(v)}" for k, v in data.items() if v is not None and not isinstance(v, dict)]
    out = ([f"[{table}]"] if table and scalars else []) + scalars
    text = "\n".join(out) + ("\n" if out else "")
    for k, v in data.items():
        if isinstance(v, dict):
            text += _toml(v, f"{table}.{k}" if table else k)
    return text


def _toml_value(v: object) -> str:
    import json

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table (a table inside a list: [nightly] embedding_slots)
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    return json.dumps(str(v))  # a JSON string is a valid TOML basic string


@pytest.fixture
def cluster(pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path) -> Iterator[MemoryClient]:
    """A client on real PostgreSQL (+ TimescaleDB) + real Neo4j + the real Qdrant server."""
    client = MemoryClient(cluster_settings(pg_dsn, neo4j_clean, tmp_path / "qdrant"))
    client.init()
    yield client
    client.close()
