"""The service under concurrent clients: every acknowledged write is in PostgreSQL, no errors.

The short, CI-sized version of ``benchmarks/serve.py load`` (which prints the percentiles): 8
clients for 8 s, queries and writes mixed, against ``memoryctl serve`` running as its own process
on the embedded profile (hash embedder: this checks the service, not the model). ~30 s.
"""

from __future__ import annotations

import importlib.util
import random
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "serve.py"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_serve", BENCH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_concurrent_clients_lose_no_write_and_get_no_error() -> None:
    b = bench()
    ws = b.workspace("hash")
    try:
        b.seed(ws, 100, random.Random(1))
        ws.start()
        result = b.load(ws.socket, clients=8, seconds=8, max_requests=2000, write_share=0.4, seed=1)
        ws.stop()
        assert result.errors == []
        assert len(result.latencies["query"]) > 20 and len(result.acknowledged) > 20
        assert b.lost_writes(ws.config, result.acknowledged) == 0
        # the check can fail: an id that was never written is reported lost
        assert b.lost_writes(ws.config, [*result.acknowledged[:3], "5b0c2a9e-2f4e-4c59-9a53-3b0f7d1affff"]) == 1
    finally:
        ws.stop()
        shutil.rmtree(ws.root, ignore_errors=True)
