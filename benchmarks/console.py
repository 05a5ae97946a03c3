"""The operator console's pages: render time of each on the embedded default profile (issue 44's
target: every page under 300 ms with 100,000 memories). A benchmark that prints numbers, not a
timed test.

A fresh data directory (or ``--data-dir``, seeded once and kept) is filled with N memories the way
benchmarks/serve.py fills it (``memoryctl import``, five users as entities, a small vocabulary
shared by most memories: the lexical leg's worst case), plus a memory set aside in the outbox.
Then ``memoryctl serve --http 127.0.0.1:PORT`` runs as its own process, the benchmark signs in to
the console with the operator's token (the form, as a browser does) and GETs each page
``--repeat`` times, one after the other, printing p50 / p95 / max wall time per page (the request
as the browser sees it: the operations it runs, the template, the transfer over loopback).

Usage::

    python benchmarks/console.py --n 10000
    python benchmarks/console.py --n 100000 --data-dir /var/tmp/console-100k   # seeded once, kept

Every figure is printed with the load average: on a shared 2-core host it explains most of the
spread. Traffic goes to loopback only; every loop is bounded.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from http.cookies import SimpleCookie
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serve import PATHOLOGICAL, Workspace, pct, seed, workspace

TARGET_MS = 300.0


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


OPENER = urllib.request.build_opener(_NoRedirect)


def get(url: str, cookies: dict[str, str] | None = None, form: dict[str, str] | None = None) -> tuple[int, object, str]:
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    req = urllib.request.Request(url, data=data)
    if cookies:
        req.add_header("Cookie", "; ".join(f"{k}={v}" for k, v in cookies.items()))
    try:
        with OPENER.open(req, timeout=120) as resp:
            return resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


def sign_in(base: str, token: str) -> dict[str, str]:
    _, headers, html = get(base + "/console/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', html)
    nonce = SimpleCookie(headers["Set-Cookie"])["memoryctl_console_login"].value  # type: ignore[index]
    status, headers, _ = get(
        base + "/console/login",
        {"memoryctl_console_login": nonce},
        {"csrf": csrf.group(1) if csrf else "", "token": token},
    )
    if status != 303:
        raise SystemExit(f"sign-in answered {status}")
    return {"memoryctl_console": SimpleCookie(headers["Set-Cookie"])["memoryctl_console"].value}  # type: ignore[index]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start(ws: Workspace, port: int, timeout_s: float = 600.0) -> subprocess.Popen[bytes]:
    log = (ws.root / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "memoryctl", "serve", "--http", f"127.0.0.1:{port}"],
        env=ws.env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"memoryctl serve exited: {(ws.root / 'serve.log').read_text()[-2000:]}")
        try:
            if get(f"http://127.0.0.1:{port}/console/login")[0] == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.5)  # polling for the service, with a deadline
    proc.terminate()
    raise SystemExit("memoryctl serve did not start in time")


def set_aside(ws: Workspace) -> None:
    """One poison row (tests/e2e/serving.py's), set aside by a sync: the Outbox page lists it."""
    from memoryctl.client import MemoryClient
    from memoryctl.config import load_settings
    from tests.e2e.serving import poison

    with MemoryClient(load_settings(ws.config)) as client:
        poison(client)
        client.sync()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000, help="memories")
    ap.add_argument("--repeat", type=int, default=15, help="GETs per page")
    ap.add_argument("--data-dir", type=Path, help="seed once into this directory and keep it")
    ap.add_argument("--embedder", default="hash", help="hash (default, as serve's latency runs) or onnx")
    args = ap.parse_args()

    ws = workspace(args.embedder, args.data_dir)
    marker = ws.root / f"seeded-{args.n}"
    if not marker.exists():
        seed(ws, args.n, random.Random(7), PATHOLOGICAL)
        set_aside(ws)
        marker.touch()
    port = free_port()
    proc = start(ws, port)
    base = f"http://127.0.0.1:{port}"
    try:
        token = (ws.root / "data" / "serve.token").read_text().strip()
        cookies = sign_in(base, token)
        _, _, html = get(base + "/console/memories?text=rollback+deploy&limit=10", cookies)
        found = re.search(r"/console/memories/([0-9a-f-]{36})", html)
        if found is None:
            raise SystemExit("the search found no memory")
        pages = {
            "overview": "/console/overview",
            "runs": "/console/runs",
            "outbox": "/console/outbox",
            "memories (form)": "/console/memories",
            "memories (search)": "/console/memories?text=rollback+deploy+canary&limit=10",
            "memories (entity)": "/console/memories?entity=User%3AAlice&limit=10",
            "memory (graph)": f"/console/memories/{found.group(1)}",
            "memory (+neighbours)": f"/console/memories/{found.group(1)}?neighbours=1",
            "stats": "/console/stats",
            "stats (2 agents)": "/console/stats?agents=bench,other&bucket=1h&since=2d",
        }
        print(f"{args.n} memories, embedder {args.embedder}, {args.repeat} GETs per page, load {os.getloadavg()}")
        print(f"{'page':<20} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}  status  bytes")
        for name, path in pages.items():
            times, status, size = [], 0, 0
            get(base + path, cookies)  # the first: caches warmed as a returning operator finds them
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                status, _, body = get(base + path, cookies)
                times.append((time.perf_counter() - t0) * 1000)
                size = len(body)
            p50 = statistics.median(times)
            flag = "" if p50 < TARGET_MS else f"  over {TARGET_MS:.0f} ms"
            print(f"{name:<20} {p50:8.1f} {pct(times, 0.95):8.1f} {max(times):8.1f}  {status:<6}  {size}{flag}")
        print(f"load after: {os.getloadavg()}")
    finally:
        proc.terminate()
        proc.wait(timeout=120)


if __name__ == "__main__":
    main()
