"""Backup and restore of the derived stores at N memories: Qdrant snapshot sets, and Neo4j rebuilt
from PostgreSQL (``memoryctl rebuild graph``) next to Neo4j's own offline ``neo4j-admin database
dump`` / ``load`` (Community has no online backup).

    scripts/services up && eval "$(scripts/services env)"
    python benchmarks/backup.py --n 20000 --neo4j-home .services/neo4j/home

Needs the real servers: PostgreSQL ($MEMORYCTL_TEST_PG_DSN), Neo4j ($MEMORYCTL_TEST_NEO4J_URI /
_PASSWORD; emptied!), the Qdrant server ($MEMORYCTL_TEST_QDRANT_URL / _API_KEY). With
``--neo4j-home`` the Neo4j of scripts/neo4j-server is stopped for the dump and the load
(scripts/neo4j-server stop/start; $NEO4J_PORT, $NEO4J_STATE from the environment) and neo4j-admin
runs from the same Maven Central jars. Embedder: ``hash`` (re-embedding is not what is measured
here; with a real model rebuilding Qdrant is far slower, which is why it is snapshotted). Prints
one JSON object; the figures measured here are in docs/backup.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from memoryctl.backup.rebuild import rebuild_graph  # noqa: E402
from memoryctl.backup.snapshots import backup_qdrant, restore_qdrant  # noqa: E402
from memoryctl.client import MemoryClient  # noqa: E402
from memoryctl.config import load_settings  # noqa: E402
from memoryctl.maintenance.reconcile import reconcile  # noqa: E402
from memoryctl.model import EntityRef, Memory, Relation  # noqa: E402
from tests.conftest import fresh_database, wipe_neo4j  # noqa: E402

BATCH = 1000


def memories(n: int) -> list[Memory]:
    return [
        Memory(
            text=f"memory {i} about project p{i % 97} and topic t{i % 13} with note n{i % 1009}",
            agent_id=f"agent{i % 5}",
            id=uuid.UUID(int=i + 1),
            kind="note",
            entities=[EntityRef("Project", f"p{i % 97}"), EntityRef("Topic", f"t{i % 13}")],
            relations=[Relation(EntityRef("Project", f"p{i % 97}"), "RELATES_TO", EntityRef("Topic", f"t{i % 13}"))],
            metadata={"i": i},
        )
        for i in range(n)
    ]


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - started


def neo4j_admin(home: Path, *args: str) -> float:
    """Neo4j's own admin command from the jars scripts/neo4j-server runs (Neo4jAdminCommand)."""
    lib = REPO / ".cache" / "neo4j" / "lib"
    conf = home / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "neo4j.conf").touch()
    env = {**os.environ, "NEO4J_HOME": str(home), "NEO4J_CONF": str(conf)}
    command = ["java", "-Xmx512m", "-cp", f"{lib}/*", "org.neo4j.server.startup.Neo4jAdminCommand", *args]
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - started


def neo4j_server(action: str) -> float:
    started = time.perf_counter()
    subprocess.run([str(REPO / "scripts" / "neo4j-server"), action], check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--qdrant-url", default=os.environ.get("MEMORYCTL_TEST_QDRANT_URL"))
    parser.add_argument("--qdrant-api-key", default=os.environ.get("MEMORYCTL_TEST_QDRANT_API_KEY"))
    parser.add_argument("--neo4j-home", type=Path, help="home of scripts/neo4j-server's Neo4j: measure dump/load")
    args = parser.parse_args()
    if not args.qdrant_url:
        parser.error("--qdrant-url (or $MEMORYCTL_TEST_QDRANT_URL) is needed: snapshots are a Qdrant server API")
    neo4j = {
        "uri": os.environ["MEMORYCTL_TEST_NEO4J_URI"],
        "password": os.environ.get("MEMORYCTL_TEST_NEO4J_PASSWORD", ""),
    }
    wipe_neo4j(neo4j)
    out: dict[str, Any] = {"n": args.n}
    with fresh_database(os.environ["MEMORYCTL_TEST_PG_DSN"]) as dsn, tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(
            Path(os.devnull),
            profile="cluster",
            data_dir=tmp,
            postgres={"dsn": dsn},
            neo4j={"uri": neo4j["uri"], "password": neo4j["password"] or None, "timeout_s": 60.0},
            qdrant={
                "url": args.qdrant_url,
                "api_key": args.qdrant_api_key,
                "collection_prefix": "bench",
                "alias": "bench",
            },
            embedder={"kind": "hash"},
            backup={"snapshot_target": f"{tmp}/sets"},
        )
        client = MemoryClient(settings)
        client.init()
        items = memories(args.n)
        started = time.perf_counter()
        for i in range(0, len(items), BATCH):
            client.add(items[i : i + BATCH])
        out["import_s"] = round(time.perf_counter() - started, 1)
        stack = client.stack

        snap, out["qdrant_backup_s"] = timed(backup_qdrant, stack)
        out["qdrant_snapshot_bytes"] = snap["bytes"]
        collection = stack.require_vectors().collections()[0].name
        import httpx

        headers = {"api-key": args.qdrant_api_key} if args.qdrant_api_key else {}
        httpx.delete(f"{args.qdrant_url}/collections/{collection}", headers=headers).raise_for_status()
        _, out["qdrant_restore_s"] = timed(restore_qdrant, stack)

        wipe_neo4j(neo4j)
        rebuilt, out["rebuild_graph_s"] = timed(rebuild_graph, stack)
        out["rebuild_graph_memories_per_s"] = rebuilt["memories_per_s"]
        out["drift_after"] = reconcile(stack).drift

        if args.neo4j_home:
            client.close()
            dumps = Path(tmp) / "dumps"
            dumps.mkdir()
            out["neo4j_stop_s"] = round(neo4j_server("stop"), 1)
            out["neo4j_dump_s"] = round(
                neo4j_admin(args.neo4j_home, "database", "dump", "neo4j", f"--to-path={dumps}"), 1
            )
            out["neo4j_dump_bytes"] = sum(p.stat().st_size for p in dumps.iterdir())
            load = ("database", "load", "neo4j", f"--from-path={dumps}", "--overwrite-destination=true")
            out["neo4j_load_s"] = round(neo4j_admin(args.neo4j_home, *load), 1)
            out["neo4j_start_s"] = round(neo4j_server("start"), 1)
            client = MemoryClient(settings)
            out["drift_after_load"] = reconcile(client.stack).drift
        for key, value in list(out.items()):
            if key.endswith("_s") and key not in ("import_s",) and isinstance(value, float):
                out[key] = round(value, 2)
        scale = 500_000 / args.n
        out["extrapolated_500k"] = {
            "qdrant_snapshot_gb": round(out["qdrant_snapshot_bytes"] * scale / 1e9, 2),
            "qdrant_backup_s": round(out["qdrant_backup_s"] * scale),
            "qdrant_restore_s": round(out["qdrant_restore_s"] * scale),
            "rebuild_graph_s": round(out["rebuild_graph_s"] * scale),
            **(
                {
                    "neo4j_dump_plus_load_s": round((out["neo4j_dump_s"] + out["neo4j_load_s"]) * scale),
                    "neo4j_dump_gb": round(out["neo4j_dump_bytes"] * scale / 1e9, 2),
                }
                if args.neo4j_home
                else {}
            ),
        }
        out["load_average"] = os.getloadavg()
        client.close()
        shutil.rmtree(Path(tmp) / "sets", ignore_errors=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
