"""benchmarks/query.py stays runnable and compares like with like.

A benchmark whose methods return different answers measures nothing: on a small generated set
(n = 2,000) against the real stores, every AND shape must give the unified engine, the naive
three-client pattern and the unchunked id filter the same top hits. No timing is asserted.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "query.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_query", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def loaded(bench: ModuleType, pg_dsn: str, neo4j_clean: dict[str, str], tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    ds = bench.generate(2000, seed=11)
    env = bench.open_env(pg_dsn, neo4j_clean["uri"], neo4j_clean["password"], tmp_path / "vectors")
    try:
        bench.load(env, ds, graph_batch=1000, log=lambda _msg: None)
        yield env, ds
    finally:
        env.close()


def test_every_method_answers_the_same(bench: ModuleType, loaded: tuple[Any, Any]) -> None:
    env, ds = loaded
    counts = {
        "postgres": env.records.count(agent_id=ds.agent),
        "qdrant": env.vectors.count(agent_id=ds.agent),
        "neo4j": env.graph.count(agent_id=ds.agent),
    }
    assert len(set(counts.values())) == 1 and counts["postgres"] > 1500, counts

    methods = bench.Methods(env, naive_k=50)  # small K: the naive path must deepen to stay correct
    queries = bench.make_queries(ds, 2, seed=11)
    assert set(queries) == set(bench.SHAPES)
    for shape, qs in queries.items():
        for q in qs:
            unified, _steps = methods.unified(q)
            naive = methods.naive(q)
            assert unified, f"{shape}: the unified engine found nothing for {q.as_dict()}"
            if shape in bench.AND_SHAPES or shape in ("graph only", "time only"):
                assert bench.same_ranking(unified, naive), (shape, unified, naive)
                one = methods.one_filter(q)
                if one is not None:
                    assert bench.same_ranking(unified, one), (shape, unified, one)
            else:  # OR: both fuse the same legs with RRF; the fused top should overlap
                assert {i for i, _ in unified} & {i for i, _ in naive}, shape
            floor = methods.floor(q, unified, methods.last_plan)
            assert floor.parts and floor.ms > 0

    # The vector-first plan (its fan-out threshold lowered to this small graph) must give the same
    # answers, and the benchmark's floors must follow it.
    saved = env.engine.options
    env.engine.options = replace(saved, vector_first_min_fanout=10)
    try:
        for q in queries[bench.SHAPES[0]]:
            unified, steps = methods.unified(q)
            assert "graph.verify" in steps, methods.last_plan.plan
            assert bench.same_ranking(unified, methods.naive(q)), (unified, methods.naive(q))
            floor = methods.floor(q, unified, methods.last_plan)
            assert "neo4j.verify" in floor.parts and floor.fanout_ms is not None and floor.fanout_ms > 0
    finally:
        env.engine.options = saved
