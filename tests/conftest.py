"""Shared fixtures: the real servers started by scripts/services (via scripts/test or .ci/run).

Integration tests never skip silently because a server is missing: they fail and say which
command starts it.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from memoryctl.client import MemoryClient
from memoryctl.config import Settings, load_settings

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


def cluster_settings(pg_dsn: str, neo4j: dict[str, str], qdrant_path: Path, **extra: object) -> Settings:
    """The cluster profile against the test servers; Qdrant via its local mode unless QDRANT_URL is set."""
    qdrant: dict[str, object] = {"timeout_s": 3.0}
    if os.environ.get("QDRANT_URL"):
        qdrant.update(
            url=os.environ["QDRANT_URL"],
            api_key=os.environ.get("QDRANT_API_KEY"),
            collection_prefix=f"t{uuid.uuid4().hex[:8]}",
            alias=f"t{uuid.uuid4().hex[:8]}",
        )
    else:
        qdrant["path"] = str(qdrant_path)
    data: dict[str, object] = {
        "profile": "cluster",
        "data_dir": qdrant_path.parent,
        "postgres": {"dsn": pg_dsn, "connect_timeout_s": 3},
        # Generous: a JVM on 2 busy cores; the tests that need a short timeout set their own.
        "neo4j": {"uri": neo4j["uri"], "password": neo4j["password"] or None, "timeout_s": 15.0},
        "qdrant": qdrant,
        "embedder": {"kind": "hash"},
    }
    data.update(extra)
    return load_settings(Path(os.devnull), **data)


@pytest.fixture
def cluster(pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path) -> Iterator[MemoryClient]:
    """A client on real PostgreSQL + real Neo4j + Qdrant (local mode, or QDRANT_URL)."""
    client = MemoryClient(cluster_settings(pg_dsn, neo4j_clean, tmp_path / "qdrant"))
    client.init()
    yield client
    client.close()
