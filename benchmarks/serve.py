"""``memoryctl serve`` under load, and query latency in-process / through the service / cold CLI.

Two runs on the embedded profile (a fresh data directory, the service as a separate process):

- ``load``: N concurrent clients for D seconds (each bounded to --max-requests), a mix of text
  queries and writes (``add`` with client-chosen ids), over the Unix socket. Prints requests,
  throughput, errors, latency percentiles per operation; then stops the service and checks that
  every write the service acknowledged is in PostgreSQL (lost writes must be 0).
- ``latency``: query p50/p95 in-process (``MemoryClient.query``), through the service
  (``ServiceClient``), and as a shell ``memoryctl query`` round trip (a new process each time,
  answered by the service): the console script (its fast path, ``memoryctl.cli.fast``) and the
  full typer command line; cold ``memoryctl --help`` and ``get`` without the service. Each CLI
  row also gives the CPU time of the process (user+sys p50), which a busy host distorts far less
  than the wall clock; the service rows end with the median of each query step (``explain``).

Usage::

    python benchmarks/serve.py load --clients 16 --seconds 60               # the default model (onnx)
    python benchmarks/serve.py load --clients 8 --seconds 10 --embedder hash
    python benchmarks/serve.py latency --n 2000 --queries 200
    python benchmarks/serve.py latency --n 100000 --queries 300 --data-dir /var/tmp/serve-100k  # kept
    python benchmarks/serve.py latency --n 100000 --retrieval dense --data-dir /var/tmp/serve-100k
    python benchmarks/serve.py latency --n 100000 --vocabulary zipf --data-dir /var/tmp/serve-100k-zipf

Every figure is printed with the load average: on a shared 2-core host it explains most of the
spread. Traffic goes to a Unix socket on this machine only; every loop is bounded. Figures, at
2,000 and 100,000 memories: the table in docs/serve.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memoryctl.serve.client import ServiceClient

WORDS = (
    "rollback deploy canary pipeline latency postgres backup incident review payments gateway "
    "migration nightly alert disk tunnel wireguard qdrant neo4j embedding outage hotfix release"
).split()
USERS = ("Alice", "Bob", "Carol", "Dan", "Erin")


@dataclass(frozen=True)
class Vocabulary:
    """The words memories and questions are made of: uniform over ``words``, or Zipf's law."""

    words: tuple[str, ...]
    zipf: bool = False

    def _draw(self, rng: random.Random, k: int) -> list[str]:
        if not self.zipf:
            return [rng.choice(self.words) for _ in range(k)]
        return rng.choices(self.words, cum_weights=_zipf_cumulative(len(self.words)), k=k)

    def sentence(self, rng: random.Random) -> str:
        return f"{rng.choice(USERS)}: " + " ".join(self._draw(rng, rng.randint(6, 14)))

    def question(self, rng: random.Random) -> str:
        if not self.zipf:
            return " ".join(rng.sample(self.words, 3))
        words: list[str] = []
        while len(words) < 3:  # three different words, each drawn as a memory's words are
            words += [w for w in self._draw(rng, 1) if w not in words]
        return " ".join(words)


@functools.cache
def _zipf_cumulative(n: int) -> list[float]:
    total, out = 0.0, []
    for rank in range(1, n + 1):
        total += 1.0 / rank
        out.append(total)
    return out


def pseudo_words(n: int) -> tuple[str, ...]:
    """``n`` different pronounceable words (fixed seed), two to four syllables: distinct prefixes."""
    rng, found = random.Random(0), dict[str, None]()
    while len(found) < n:
        found.setdefault("".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(2, 4))))
    return tuple(found)


# The default: 23 words, each in about a third of the memories, so that nearly every memory shares
# a word with every question: the lexical leg's worst case. ``zipf``: 20,000 words by Zipf's law, as
# in natural text, questions drawn the same way: a few words in most memories (the first in ~60 %,
# as "the" would be), most in a handful.
PATHOLOGICAL = Vocabulary(tuple(WORDS))
VOCABULARIES = {"pathological": PATHOLOGICAL, "zipf": Vocabulary(pseudo_words(20_000), zipf=True)}


@dataclass
class Workspace:
    root: Path
    config: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.root / "data" / "serve.sock"

    def env(self) -> dict[str, str]:
        return {**os.environ, "MEMORYCTL_CONFIG": str(self.config), "HF_HUB_OFFLINE": "1"}

    def start(self, timeout_s: float = 300.0) -> None:
        log = (self.root / "serve.log").open("wb")
        cmd = [sys.executable, "-m", "memoryctl", "serve"]
        self.process = subprocess.Popen(cmd, env=self.env(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        client = ServiceClient(socket_path=self.socket, timeout=10)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"memoryctl serve exited: {(self.root / 'serve.log').read_text()[-2000:]}")
            if self.socket.exists() and client.call("health", {}) is not None:
                return
            time.sleep(0.2)
        raise SystemExit("memoryctl serve did not start in time")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=120)
            self.process = None


def workspace(embedder: str, keep: Path | None = None) -> Workspace:
    """A fresh directory, or ``keep`` (made once, seeded data reused by the next run)."""
    root = keep or Path(tempfile.mkdtemp(prefix="serve-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # as root, the embedded PostgreSQL runs as its own user and must enter it
    config = root / "memoryctl.toml"
    config.write_text(
        f'profile = "embedded"\ndata_dir = "{root / "data"}"\ndefault_agent = "bench"\n'
        f'[embedder]\nkind = "{embedder}"\n[serve]\nqueue = 256\n'
    )
    return Workspace(root, config)


def seed(ws: Workspace, n: int, rng: random.Random, vocabulary: Vocabulary = PATHOLOGICAL) -> None:
    """n memories through `memoryctl import` (in-process: the service is not running yet)."""
    path = ws.root / "seed.jsonl"
    with path.open("w") as f:
        for _ in range(n):
            f.write(
                json.dumps(
                    {"text": vocabulary.sentence(rng), "entities": [{"type": "User", "name": rng.choice(USERS)}]}
                )
                + "\n"
            )
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "memoryctl", "import", str(path), "--json"],
        env=ws.env(),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    dt = time.perf_counter() - t0
    print(f"seeded {n} memories in {dt:.1f} s ({n / dt:.0f} memories/s incl. start-up)")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summary(name: str, ms: list[float]) -> str:
    if not ms:
        return f"{name:<10} n=0"
    return (
        f"{name:<10} n={len(ms):<6} p50={statistics.median(ms):7.1f} ms  p95={pct(ms, 0.95):7.1f} ms  "
        f"p99={pct(ms, 0.99):7.1f} ms  max={max(ms):7.1f} ms"
    )


@dataclass
class LoadResult:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: list[str] = field(default_factory=list)
    acknowledged: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def requests(self) -> int:
        return sum(len(v) for v in self.latencies.values()) + len(self.errors)


def load(
    socket: Path,
    *,
    clients: int,
    seconds: float,
    max_requests: int,
    write_share: float,
    seed: int,
    vocabulary: Vocabulary = PATHOLOGICAL,
) -> LoadResult:
    """``clients`` threads, each a loop bounded by time and count, mixing queries and writes."""
    result = LoadResult()
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client_loop(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        client = ServiceClient(socket_path=socket, timeout=120)
        for _ in range(max_requests):
            if time.monotonic() >= stop_at:
                return
            write = rng.random() < write_share
            op = "add" if write else "query"
            mid = str(uuid.uuid4())
            params = (
                {"id": mid, "text": vocabulary.sentence(rng), "entities": [f"User:{rng.choice(USERS)}"]}
                if write
                else {"text": vocabulary.question(rng), "limit": 10}
            )
            t0 = time.perf_counter()
            try:
                reply = client.call(op, params)
                ok = reply is not None and reply.exit_code == 0
                why = "no service" if reply is None else f"exit {reply.exit_code}: {reply.warnings}"
            except Exception as exc:  # every failure is counted and reported, none ends the run
                ok, why = False, f"{type(exc).__name__}: {exc}"
            ms = (time.perf_counter() - t0) * 1000
            with lock:
                if ok:
                    result.latencies[op].append(ms)
                    if write:
                        result.acknowledged.append(mid)
                else:
                    result.errors.append(f"{op}: {why}")

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.perf_counter() - t0
    return result


def lost_writes(config: Path, ids: list[str]) -> int:
    """Acknowledged ids missing from PostgreSQL (the service must be stopped: embedded stores)."""
    from memoryctl.client import MemoryClient
    from memoryctl.config import load_settings

    with MemoryClient(load_settings(config)) as client:
        found = client.stack.records.get_many([uuid.UUID(i) for i in ids])
    return len(set(ids) - {str(k) for k in found})


def run_load(args: argparse.Namespace) -> None:
    ws = workspace(args.embedder)
    try:
        seed(ws, args.n, random.Random(args.seed), VOCABULARIES[args.vocabulary])
        ws.start()
        res = load(
            ws.socket,
            clients=args.clients,
            seconds=args.seconds,
            max_requests=args.max_requests,
            write_share=args.write_share,
            seed=args.seed,
            vocabulary=VOCABULARIES[args.vocabulary],
        )
        load1 = os.getloadavg()[0]
        ws.stop()
        lost = lost_writes(ws.config, res.acknowledged)
        print(
            f"load: {args.clients} clients, {res.seconds:.1f} s, embedder={args.embedder}, seeded={args.n}, "
            f"write share {args.write_share:.0%}, loadavg(1m) {load1:.1f}"
        )
        print(
            f"requests {res.requests}  ({res.requests / res.seconds:.1f}/s)  errors {len(res.errors)}  "
            f"writes acknowledged {len(res.acknowledged)}  lost writes {lost}"
        )
        for op in ("query", "add"):
            print("  " + summary(op, res.latencies[op]))
        for e in res.errors[:10]:
            print(f"  error: {e}")
    finally:
        ws.stop()
        shutil.rmtree(ws.root, ignore_errors=True)


FULL_CLI = "import sys; from memoryctl.cli.main import _invoke; sys.exit(_invoke(sys.argv[1:]))"


def timed_cli(ws: Workspace, argv: list[str], runs: int, *, full: bool = False) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds of ``runs`` new processes: the console script, or (``full``) the
    typer command line without the fast path."""
    # The console script next to this interpreter: a version manager's shim on PATH (pyenv) would
    # add its own start-up (~0.15 s of bash) to every figure.
    script = Path(sys.executable).with_name("memoryctl")
    if full:
        cmd = [sys.executable, "-c", FULL_CLI, *argv]
    else:
        cmd = [str(script), *argv] if script.exists() else [sys.executable, "-m", "memoryctl", *argv]
    wall, cpu = [], []
    for _ in range(runs):
        before = os.times()
        t0 = time.perf_counter()
        subprocess.run(cmd, env=ws.env(), check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall.append((time.perf_counter() - t0) * 1000)
        after = os.times()
        cpu.append((after.children_user + after.children_system - before.children_user - before.children_system) * 1000)
    return wall, cpu


def cli_summary(name: str, timed: tuple[list[float], list[float]]) -> str:
    wall, cpu = timed
    return f"{summary(name, wall)}  cpu p50={statistics.median(cpu):5.0f} ms"


def step_medians(replies: list[dict[str, object]]) -> str:
    """The median time of each query step over the service's replies: what dominates."""
    steps: dict[str, list[float]] = defaultdict(list)
    for reply in replies:
        explain = reply.get("explain")
        for step in explain.get("steps", []) if isinstance(explain, dict) else []:
            steps[f"{step['name']}[{step['store']}]"].append(float(step["ms"]))
    return "  ".join(f"{name} {statistics.median(ms):.1f}" for name, ms in steps.items())


def run_latency(args: argparse.Namespace) -> None:
    from memoryctl.client import MemoryClient
    from memoryctl.config import load_settings
    from memoryctl.query.spec import MemoryQuery

    rng = random.Random(args.seed)
    vocabulary = VOCABULARIES[args.vocabulary]
    queries = [vocabulary.question(rng) for _ in range(args.queries)]
    ws = workspace(args.embedder, args.data_dir)
    rows: list[str] = []
    try:
        if not (ws.root / "data").exists():
            seed(ws, args.n, rng, vocabulary)
        any_id = json.loads(
            subprocess.run(
                [sys.executable, "-m", "memoryctl", "query", "--limit", "1", "--json", "--since", "3650d"],
                env=ws.env(),
                capture_output=True,
                check=True,
            ).stdout
        )["hits"][0]["id"]
        rows.append(cli_summary("cold --help", timed_cli(ws, ["--help"], args.cli_runs)))
        rows.append(cli_summary("cold get", timed_cli(ws, ["get", any_id, "--json"], args.cli_runs)))
        with MemoryClient(load_settings(ws.config)) as client:
            count = client.stack.records.count()
            client.query(MemoryQuery(text="warm up", agent_id="bench", retrieval=args.retrieval))
            ms = []
            for q in queries:
                t0 = time.perf_counter()
                client.query(MemoryQuery(text=q, agent_id="bench", retrieval=args.retrieval))
                ms.append((time.perf_counter() - t0) * 1000)
        rows.append(summary("in-process", ms))
        ws.start()
        svc = ServiceClient(socket_path=ws.socket, timeout=60)
        svc.call("query", {"text": "warm up", "agent": "bench", "retrieval": args.retrieval})
        ms, replies = [], []
        for q in queries:
            t0 = time.perf_counter()
            reply = svc.call("query", {"text": q, "agent": "bench", "retrieval": args.retrieval})
            ms.append((time.perf_counter() - t0) * 1000)
            if reply is not None and isinstance(reply.data, dict):
                replies.append(reply.data)
        rows.append(summary("service", ms))
        rows.append("  steps (median ms): " + step_medians(replies))
        query_argv = ["query", queries[0], "--json", "--retrieval", args.retrieval]
        rows.append(cli_summary("cli→service", timed_cli(ws, query_argv, args.cli_runs)))
        rows.append(cli_summary("full cli→svc", timed_cli(ws, query_argv, args.cli_runs, full=True)))
        rows.append(cli_summary("table→svc", timed_cli(ws, [*query_argv[:2], *query_argv[3:]], args.cli_runs)))
        rows.append(cli_summary("cli get→svc", timed_cli(ws, ["get", any_id, "--json"], args.cli_runs)))
        ws.stop()
    finally:
        ws.stop()
        if args.data_dir is None:
            shutil.rmtree(ws.root, ignore_errors=True)
    print(
        f"latency: {count} memories, embedder={args.embedder}, {args.queries} queries, "
        f"{args.cli_runs} CLI runs, retrieval={args.retrieval}, vocabulary={args.vocabulary}, "
        f"loadavg(1m) {os.getloadavg()[0]:.1f}"
    )
    for row in rows:
        print("  " + row)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    lo = sub.add_parser("load")
    lo.add_argument("--clients", type=int, default=16)
    lo.add_argument("--seconds", type=float, default=60.0)
    lo.add_argument("--max-requests", type=int, default=100_000, help="per client (the loop's bound)")
    lo.add_argument("--write-share", type=float, default=0.3)
    lo.add_argument("--n", type=int, default=500, help="memories seeded before the run")
    la = sub.add_parser("latency")
    la.add_argument("--n", type=int, default=2000)
    la.add_argument("--queries", type=int, default=200)
    la.add_argument("--cli-runs", type=int, default=20)
    la.add_argument("--data-dir", type=Path, help="keep the workspace here; reuse its data when it exists")
    la.add_argument("--retrieval", choices=["hybrid", "dense", "lexical"], default="hybrid")
    for p in (lo, la):
        p.add_argument("--embedder", choices=["onnx", "local", "hash"], default="onnx")
        p.add_argument("--seed", type=int, default=7)
        p.add_argument("--vocabulary", choices=sorted(VOCABULARIES), default="pathological")
    args = ap.parse_args()
    run_load(args) if args.mode == "load" else run_latency(args)


if __name__ == "__main__":
    main()
