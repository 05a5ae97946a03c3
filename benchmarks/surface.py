"""The command line's and the service's surfaces, another checkout against this one, side by side.

Two workspaces with the same seeded memories (embedded profile), one ``memoryctl serve`` each: one
runs the code of ``--baseline`` (a checkout or ``git archive`` of an earlier commit, put first on
``PYTHONPATH``), the other this checkout. Every measurement alternates between the two, sample by
sample, so that the shared host's load falls on both alike:

- cold ``memoryctl --help`` (a new process each time; wall and CPU);
- ``memoryctl query "<three words>" --json`` answered by the running service (the console script);
- ``POST /v1/query`` over HTTP with the bearer token (one client: httpx keeps its connection where
  the server allows it), p50/p99;
- the MCP ``query`` tool over streamable HTTP (this checkout only: the baseline has no MCP), p50/p99.

    git archive <commit> | tar -x -C /tmp/base
    python benchmarks/surface.py --baseline /tmp/base --n 2000 --queries 200 --cli-runs 20
    # --current DIR: measure another checkout than this one (e.g. a `git archive` of HEAD, so that
    # editing this checkout during the run changes nothing)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve as bench  # benchmarks/serve.py: workspaces, seeding, vocabularies


@dataclass
class Side:
    name: str
    ws: bench.Workspace
    pythonpath: str | None
    port: int
    process: subprocess.Popen[bytes] | None = None
    timings: dict[str, list[float]] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        env = self.ws.env()
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        return env

    def start(self) -> None:
        log = (self.ws.root / "serve.log").open("wb")
        cmd = [sys.executable, "-m", "memoryctl", "serve", "--http", f"127.0.0.1:{self.port}"]
        self.process = subprocess.Popen(cmd, env=self.env(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"{self.name}: serve exited: {(self.ws.root / 'serve.log').read_text()[-2000:]}")
            if self.ws.socket.exists() and self._answers():
                return
            time.sleep(0.2)
        raise SystemExit(f"{self.name}: serve did not start")

    def _answers(self) -> bool:
        try:
            return self.http("health", {}).status_code == 200
        except httpx.HTTPError:
            return False

    @property
    def token(self) -> str:
        return (self.ws.root / "data" / "serve.token").read_text().strip()

    def http(self, operation: str, params: dict[str, Any], client: httpx.Client | None = None) -> httpx.Response:
        post = (client or httpx).post
        headers = {"Authorization": f"Bearer {self.token}"}
        response: httpx.Response = post(
            f"http://127.0.0.1:{self.port}/v1/{operation}", json=params, headers=headers, timeout=60
        )
        return response

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=120)
            self.process = None

    def record(self, what: str, value: float) -> None:
        self.timings.setdefault(what, []).append(value)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cold(side: Side, argv: list[str]) -> tuple[float, float]:
    """Wall and CPU ms of one new ``memoryctl`` process (the console script next to this Python)."""
    script = Path(sys.executable).with_name("memoryctl")
    before = os.times()
    t0 = time.perf_counter()
    subprocess.run([str(script), *argv], env=side.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = (time.perf_counter() - t0) * 1000
    after = os.times()
    cpu = (after.children_user + after.children_system - before.children_user - before.children_system) * 1000
    return wall, cpu


async def mcp_queries(side: Side, queries: list[str]) -> list[float]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    ms = []
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {side.token}"}, timeout=60) as http:
        url = f"http://127.0.0.1:{side.port}/mcp"
        async with Client(streamable_http_client(url, http_client=http)) as client:
            await client.call_tool("query", {"text": "warm up"})
            for q in queries:
                t0 = time.perf_counter()
                result = await client.call_tool("query", {"text": q})
                ms.append((time.perf_counter() - t0) * 1000)
                assert not result.is_error, result.content
    return ms


def line(name: str, values: list[float]) -> str:
    if not values:
        return f"{name}: -"
    return f"{name}: p50 {statistics.median(values):7.1f}  p99 {bench.pct(values, 0.99):7.1f}  (n={len(values)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="a checkout of the code to compare with")
    ap.add_argument("--current", type=Path, help="a checkout to measure instead of this one (default: as installed)")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--cli-runs", type=int, default=20)
    ap.add_argument("--embedder", choices=["onnx", "hash"], default="onnx")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    queries = [bench.PATHOLOGICAL.question(rng) for _ in range(args.queries)]
    sides = [
        Side("before", bench.workspace(args.embedder), str(args.baseline.resolve()), free_port()),
        Side(
            "after", bench.workspace(args.embedder), str(args.current.resolve()) if args.current else None, free_port()
        ),
    ]
    try:
        for side in sides:
            bench.seed(side.ws, args.n, random.Random(args.seed))
            side.start()
            side.http("query", {"text": "warm up"})
        for _ in range(args.cli_runs):
            for side in sides:
                wall, cpu = cold(side, ["--help"])
                side.record("cold --help wall", wall)
                side.record("cold --help cpu", cpu)
                wall, cpu = cold(side, ["query", queries[0], "--json"])
                side.record("query --json → service wall", wall)
                side.record("query --json → service cpu", cpu)
        clients = {side.name: httpx.Client() for side in sides}
        for q in queries:
            for side in sides:
                t0 = time.perf_counter()
                reply = side.http("query", {"text": q}, clients[side.name])
                side.record("HTTP query", (time.perf_counter() - t0) * 1000)
                assert reply.status_code == 200, reply.text
        import anyio

        sides[1].timings["MCP query (streamable HTTP)"] = anyio.run(mcp_queries, sides[1], queries)
    finally:
        for side in sides:
            side.stop()
            shutil.rmtree(side.ws.root, ignore_errors=True)
    print(
        f"surface: {args.n} memories, embedder={args.embedder}, {args.queries} queries, {args.cli_runs} CLI runs,"
        f" loadavg(1m) {os.getloadavg()[0]:.1f}; ms"
    )
    names = list(dict.fromkeys(k for side in sides for k in side.timings))
    for what in names:
        print(f"  {what}")
        for side in sides:
            print(f"    {side.name:<7} {line('', side.timings.get(what, []))}")


if __name__ == "__main__":
    main()
