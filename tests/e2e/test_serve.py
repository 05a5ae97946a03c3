"""``memoryctl serve`` against the CLI working in-process: the same output and exit codes.

The embedded profile (the one where the service is the stores' single owner), with the ``hash``
embedder so that the comparison runs in seconds. The same command list runs twice in-process
(the first run sets the data up, the second is the reference) and then once through a running
service on the same data directory; stdout, stderr and exit codes must match after removing what
differs between any two runs (query ids, timings). Then the HTTP side: token, errors, OpenAPI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from memoryctl.cli.main import _invoke
from memoryctl.config import load_settings
from memoryctl.declaration.table import OPERATIONS
from memoryctl.serve.openapi import reply_schema
from memoryctl.serve.server import Service

pytestmark = pytest.mark.integration

U1 = "5b0c2a9e-2f4e-4c59-9a53-3b0f7d1a0001"
U2 = "5b0c2a9e-2f4e-4c59-9a53-3b0f7d1a0002"
MISSING = "5b0c2a9e-2f4e-4c59-9a53-3b0f7d1a00ff"
VOLATILE = re.compile(r'("(query_id|checked_at|seconds|total_ms|ms|latency_ms)": )("[^"]*"|[0-9.]+)|\(\d+ ms\)')


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """Outside pytest's 0700 tree: as root, the embedded PostgreSQL runs as its own user, and its
    pg_ctl then sometimes could not enter the directory to stop the server."""
    root = Path(tempfile.mkdtemp(prefix="memoryctl-serve-test-"))
    root.chmod(0o755)
    yield root / "d"
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def config(tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "memoryctl.toml"
    path.write_text(
        f'profile = "embedded"\ndata_dir = "{data_dir}"\ndefault_agent = "support"\n'
        '[embedder]\nkind = "hash"\n[extractor]\nkind = "none"\n'
    )
    monkeypatch.setenv("MEMORYCTL_CONFIG", str(path))
    for name in ("good.jsonl", "bad.jsonl"):
        rows = [
            {"id": f"5b0c2a9e-2f4e-4c59-9a53-3b0f7d1a01{i:02d}", "text": f"deploy note {i} by Bob"} for i in range(5)
        ]
        lines = [json.dumps(r) for r in rows] + (["{not json", '{"text": ""}'] if name == "bad.jsonl" else [])
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    return path


def commands(tmp: Path) -> list[list[str]]:
    at = "2026-11-01T10:00:00+00:00"
    return [
        ["add", "Alice: the rollback finished", "--id", U1, "--at", at, "--entity", "User:Alice", "--json"],
        ["add", "Bob: canary stage missing", "--id", U2, "--at", at, "--meta", "sentiment=-0.4"],
        ["get", U1, "--json"],
        ["get", U1],
        ["get", MISSING],
        ["get", "not-a-uuid"],
        # without time decay: a decayed score depends on the second it is computed in
        ["query", "rollback", "--half-life", "off", "--json"],
        ["query", "rollback", "--entity", "User:Alice", "--via", "AUTHORED", "--half-life", "off"],
        ["query", "x", "--via", "AUTHORED"],
        ["query", "--where", "sentiment < 0", "--since", "2026-10-01T00:00:00Z", "--json"],
        ["stats", "--since", "2026-10-30T00:00:00Z", "--until", "2026-11-03T00:00:00Z", "--metric", "sentiment"],
        ["stats", "--since", "2026-10-30T00:00:00Z", "--until", "2026-11-03T00:00:00Z", "--json"],
        ["import", str(tmp / "good.jsonl"), "--json"],
        ["import", str(tmp / "bad.jsonl")],
        ["import", str(tmp / "bad.jsonl"), "--strict", "--json"],
        ["forget", U2, "--json"],
        ["sync", "--json"],
        ["init", "--json"],
    ]


def declared(argv: list[str], printed: str) -> None:
    """A ``--json`` document is what the operation's declared reply type says (its OpenAPI schema)."""
    if "--json" not in argv or not printed.strip():
        return
    name = " ".join(argv[:2]) if " ".join(argv[:2]) in OPERATIONS else argv[0]
    jsonschema.validate(json.loads(printed), reply_schema(OPERATIONS[name]))


def run_all(capsys: pytest.CaptureFixture[str], tmp: Path) -> list[tuple[list[str], int, str, str]]:
    results = []
    for argv in commands(tmp):
        code = _invoke(argv)
        captured = capsys.readouterr()
        assert "Traceback" not in captured.out + captured.err, argv
        declared(argv, captured.out)
        results.append((argv, code, _stable(captured.out), _stable(captured.err)))
    return results


def _stable(text: str) -> str:
    """Output without what differs between any two runs: ids and timings (and the centring of a
    title whose timing has another number of digits)."""
    return re.sub(r" {2,}", " ", VOLATILE.sub(r"\1_", text))


@pytest.fixture
def service(config: Path) -> Iterator[Service]:
    svc = Service(load_settings(config), http="127.0.0.1:0")
    svc.warm_up()
    svc.start()
    yield svc
    svc.shutdown(grace_s=10)


@pytest.mark.slow  # ~35 s: 54 CLI calls, two thirds of them starting the embedded PostgreSQL
def test_same_output_and_exit_codes_with_and_without_the_service(
    config: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, data_dir: Path
) -> None:
    run_all(capsys, tmp_path)  # sets the data up; first-time results (inserted vs unchanged) differ
    in_process = run_all(capsys, tmp_path)
    assert not (data_dir / "serve.sock").exists()
    settings = load_settings(config)
    svc = Service(settings)
    svc.warm_up()
    svc.start()
    try:
        through_service = run_all(capsys, tmp_path)
        assert svc.status()["requests"] == len(commands(tmp_path))  # bad input too: validated where it runs
    finally:
        svc.shutdown(grace_s=10)
    assert not (data_dir / "serve.sock").exists()
    codes = {tuple(argv): code for argv, code, _, _ in in_process}
    assert codes[("get", MISSING)] == 1 and codes[("query", "x", "--via", "AUTHORED")] == 2
    assert codes[("import", str(tmp_path / "bad.jsonl"))] == 2  # bad lines and nothing else: bad input
    assert codes[("import", str(tmp_path / "bad.jsonl"), "--strict", "--json")] == 2
    for local, served in zip(in_process, through_service, strict=True):
        assert local == served


def test_a_second_process_shares_the_embedded_stores_through_the_service(service: Service, config: Path) -> None:
    """Cron and a user at once: a separate CLI process reaches the stores the service owns."""
    env = {**os.environ, "MEMORYCTL_CONFIG": str(config)}
    add = [sys.executable, "-m", "memoryctl", "add", "cron was here", "--id", U1, "--json"]
    proc = subprocess.run(add, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    get = [sys.executable, "-m", "memoryctl", "get", U1, "--json"]
    proc = subprocess.run(get, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["text"] == "cron was here"
    assert service.status()["requests"] == 2


def _http(svc: Service, path: str, body: bytes | None, token: str | None, method: str = "POST") -> tuple[int, Any]:
    assert svc.address_http is not None
    req = urllib.request.Request(f"http://{svc.address_http}{path}", data=body, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_http_token_errors_and_openapi(service: Service) -> None:
    token = service.token
    assert token and len(token) >= 32
    assert service.settings.serve_token_file.stat().st_mode & 0o777 == 0o600
    assert (service.socket_path.stat().st_mode & 0o777) == 0o600
    status, data = _http(service, "/v1/add", b'{"text": "over http", "agent": "agents"}', None)
    assert status == 401 and "token" in data["error"]
    status, data = _http(service, "/v1/add", b'{"text": "over http", "agent": "agents"}', "wrong")
    assert status == 401
    status, data = _http(service, "/v1/add", b'{"text": "over http", "agent": "agents"}', token)
    assert status == 200 and set(data) == {"id", "pending"}
    status, data = _http(service, "/v1/get", json.dumps({"id": data["id"]}).encode(), token)
    assert status == 200 and data["text"] == "over http" and data["agent_id"] == "agents"
    for path, body, expected in (
        ("/v1/query", b"{not json", 400),
        ("/v1/query", b"[1, 2]", 400),
        ("/v1/query", b'{"limit": "ten"}', 400),
        ("/v1/query", b'{"txt": "typo"}', 400),
        ("/v1/query", b'{"limit": 5000}', 400),
        ("/v1/get", json.dumps({"id": MISSING}).encode(), 404),
        ("/v1/nope", b"{}", 404),
        ("/elsewhere", b"{}", 404),
    ):
        status, data = _http(service, path, body, token)
        assert status == expected, (path, body, data)
        assert data["error"] and "Traceback" not in json.dumps(data)
    status, _ = _http(service, "/v1/query", None, token, method="GET")
    assert status == 405
    status, doc = _http(service, "/v1/openapi.json", None, token, method="GET")
    assert status == 200 and doc["openapi"].startswith("3.")
    assert {"/v1/query", "/v1/add", "/v1/import", "/v1/get", "/v1/forget", "/v1/health"} <= set(doc["paths"])
    schema = doc["paths"]["/v1/get"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/GetParams"}  # named, for the generated clients
    assert doc["components"]["schemas"]["GetParams"]["required"] == ["id"]


def test_body_limit_and_binding_rules(config: Path, tmp_path: Path) -> None:
    from memoryctl.errors import ConfigError
    from memoryctl.serve.client import ServiceClient, ServiceError

    settings = load_settings(config, serve={"max_body_mb": 0.001})
    for bind in ("0.0.0.0:8765", "[::]:8765", "example.org:80", "127.0.0.1"):
        with pytest.raises(ConfigError):
            Service(settings, http=bind)
    svc = Service(settings, http="127.0.0.1:0")
    svc.start()
    try:
        status, data = _http(svc, "/v1/import", b"x" * 5000, svc.token)
        assert status == 413 and "limit" in data["error"]
        # Refused before the body is read, while the client is still sending megabytes of it: the
        # error must still reach the client (not a reset connection or a broken pipe).
        big = tmp_path / "big.jsonl"
        big.write_bytes(b'{"text": "x"}\n' * 600_000)
        status, data = _http(svc, "/v1/import", big.read_bytes(), svc.token)
        assert status == 413 and "limit" in data["error"]
        status, data = _http(svc, "/v1/import", big.read_bytes(), "wrong")
        assert status == 401 and "token" in data["error"]
        with pytest.raises(ServiceError) as refused:
            ServiceClient(socket_path=svc.socket_path, timeout=30).call("import", {"agent": "a"}, upload=big)
        assert "limit" in refused.value.message and refused.value.exit_code == 2
    finally:
        svc.shutdown(grace_s=5)


def test_docs_examples_run_against_a_live_service(service: Service, capsys: pytest.CaptureFixture[str]) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "serve.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert len(blocks) >= 3
    namespace: dict[str, Any] = {"URL": f"http://{service.address_http}", "TOKEN": service.token}
    for block in blocks:
        exec(compile(block, "docs/serve.md", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].endswith(" 0")  # id and exit code of the add
    assert "Alice: the rollback finished at 14:05" in printed[1]
    assert "'name': 'Alice'" in printed[2]
    assert printed[3].startswith("400 ") and "limt" in printed[3]


# ---- the console script's fast path (memoryctl.cli.fast) ----------------------------------------


def fast_commands() -> list[list[str]]:
    """The common operations the fast path answers, and input it must leave to the full CLI."""
    at = "2026-11-01T10:00:00+00:00"
    return [
        ["add", "Alice: the rollback finished", "--id", U1, "--at", at, "--entity", "User:Alice", "--json"],
        [
            "add",
            "Bob: canary missing",
            f"--id={U2}",
            "--at",
            at,
            "--meta",
            "sentiment=-0.4",
            "--rel",
            "this -X-> User:Bob",
        ],
        ["--config", os.environ["MEMORYCTL_CONFIG"], "get", U1],
        ["get", U1, "--json", "--agent", "support"],
        ["get", MISSING],
        ["query", "rollback", "--half-life", "off", "--json"],
        ["query", "rollback", "--entity", "User:Alice", "--via", "AUTHORED", "--hops=2", "--half-life", "off"],
        ["query", "--where", "sentiment < 0", "--since", "2026-10-01T00:00:00Z", "--limit", "3", "--json"],
        ["query", "x", "--via", "AUTHORED"],  # the service's error: exit 2, no traceback
        ["query", "x", "--direction", "sideways"],
        ["forget", U2, MISSING, "--json"],
        ["forget", U2],
        ["get", "not-a-uuid"],  # bad input: the service validates it, as in-process (exit 2)
        # left to the full CLI: what the fast path does not fully understand
        ["get"],
        ["get", U1, U2],
        ["query", "x", "--hops", "7"],
        ["query", "x", "--limit", "ten"],
        ["query", "x", "--agent", "not an agent!"],
        ["query", "x", "--bogus"],
        ["query", "x", "--json=yes"],
        ["add", "x", "--meta", "no-equals-sign"],
        ["add", "x", "--id", "nope"],
        ["forget"],
        ["query", "--help"],
        ["--profile", "cluster", "get", U1],
        ["--version"],
    ]


# what the fast path answers (True) or leaves to the full command line (False), in the order above
FAST_ANSWERS = [True] * 13 + [False, False, True, False, True, False, False, False, True, False, False, False, False]


def _fast_or_full(argv: list[str]) -> tuple[int, bool]:
    """What the console script does (``main.run`` without the exit): (exit code, fast path answered)."""
    from memoryctl.cli import fast
    from memoryctl.cli.main import guarded

    answered = guarded(lambda: fast.run(argv))
    return (_invoke(argv), False) if answered is None else (answered, True)


def test_fast_path_prints_what_the_full_cli_prints(
    service: Service, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def outputs(run: Any) -> list[tuple[int, str, str]]:
        results = []
        for argv in fast_commands():
            code = run(argv)
            captured = capsys.readouterr()
            assert "Traceback" not in captured.out + captured.err, argv
            results.append((code, _stable(captured.out), _stable(captured.err)))
        return results

    outputs(_invoke)  # sets the data up (the second add and forget differ the first time)
    full = outputs(_invoke)
    answered: list[bool] = []
    fast = outputs(lambda argv: _record(answered, _fast_or_full(argv)))
    assert answered == FAST_ANSWERS
    for argv, expected, got in zip(fast_commands(), full, fast, strict=True):
        assert got == expected, argv
    codes = [code for code, _, _ in fast]
    assert codes[4] == 1 and codes[8] == 2 and codes[12:16] == [2, 2, 2, 2]
    # other configuration layers than the service's: it runs nothing (412), the full CLI does the work
    monkeypatch.setenv("MEMORYCTL_DELETE_GRACE", "7d")  # the default, but not in the service's layers
    requests = service.status()["requests"]
    assert _fast_or_full(["get", U1, "--json"]) == (0, False)
    assert json.loads(capsys.readouterr().out)["id"] == U1
    assert service.status()["requests"] == requests + 2  # refused with 412, then the full CLI's


def _record(answered: list[bool], result: tuple[int, bool]) -> int:
    answered.append(result[1])
    return result[0]


def test_fast_path_is_the_console_script_and_loads_no_typer_or_pydantic(service: Service, config: Path) -> None:
    probe = (
        "import json, sys\n"
        "from memoryctl.cli.main import run\n"
        "try:\n    run()\nexcept SystemExit as exc:\n    code = exc.code\n"
        "heavy = {'typer', 'click', 'pydantic', 'psycopg', 'numpy', 'rich'}\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & heavy)\n"
        "print(json.dumps({'code': code, 'heavy': heavy}))\n"
    )
    env = {**os.environ, "MEMORYCTL_CONFIG": str(config)}
    add = ["add", "from the console script", "--id", U1, "--json"]
    proc = subprocess.run([sys.executable, "-c", probe, *add], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    *printed, last = proc.stdout.splitlines()
    assert json.loads("\n".join(printed))["id"] == U1
    assert json.loads(last) == {"code": 0, "heavy": []}
    assert service.status()["requests"] == 1


def test_service_client_over_http_and_over_the_socket(service: Service, tmp_path: Path) -> None:
    """The CLI's client (httpx): over the Unix socket, and over HTTP with a token for ``serve.url``."""
    from memoryctl.serve.client import ServiceClient, ServiceError

    over_http = ServiceClient(url=f"http://{service.address_http}", token=service.token, timeout=30)
    added = over_http.call("add", {"text": "over http from the CLI", "id": U1, "agent": "support"})
    assert added is not None and added.data["id"] == U1 and added.exit_code == 0
    over_socket = ServiceClient(socket_path=service.socket_path, timeout=30)
    got = over_socket.call("get", {"id": U1})
    assert got is not None and got.data["text"] == "over http from the CLI"
    upload = tmp_path / "two.jsonl"
    upload.write_text('{"text": "first line"}\n{"text": "second line"}\n')
    imported = over_socket.call("import", {"agent": "support", "strict": False}, upload=upload)
    assert imported is not None and imported.data["inserted"] == 2
    with pytest.raises(ServiceError) as missing:
        over_socket.call("get", {"id": MISSING})
    assert missing.value.exit_code == 1 and MISSING in missing.value.message
    with pytest.raises(ServiceError) as unauthorised:
        ServiceClient(url=f"http://{service.address_http}", token="wrong", timeout=30).call("get", {"id": U1})
    assert "token" in unauthorised.value.message
    assert ServiceClient(socket_path=tmp_path / "nobody.sock", timeout=5).call("get", {"id": U1}) is None
