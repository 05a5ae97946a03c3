"""Both ``VectorStore`` implementations against the real engines, with one set of tests.

- ``server``: ``QdrantVectorStore`` on the real Qdrant server of scripts/services (the cluster
  profile's engine); every test uses its own collection prefix and alias and removes them afterwards;
- ``edge``: ``EdgeVectorStore`` on Qdrant Edge in a tmp directory (the embedded profile's engine,
  Qdrant's Rust engine in-process).

Both always run: a missing server fails the suite (tests/conftest.py names the command to start it).

Filters are checked against a brute-force evaluation of the same predicate over the same data, so
each case states its semantics once, in Python.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memoryctl.errors import InputError, StoreError, StoreUnavailable
from memoryctl.stores.protocols import (
    EmbeddingModelInfo,
    MetaCondition,
    VectorFilter,
    VectorPoint,
    VectorStore,
)
from memoryctl.stores.vector_edge import EdgeVectorStore
from memoryctl.stores.vector_qdrant import QdrantVectorStore
from tests.conftest import drop_qdrant_scope, qdrant_scope

pytestmark = pytest.mark.integration

DIM = 8
MODEL_A = EmbeddingModelInfo("test/model-a:v1", DIM)
MODEL_B = EmbeddingModelInfo("test/model-b:v2", DIM)  # same dimension on purpose
T0 = datetime(2025, 1, 1, tzinfo=UTC)
HOSTILE = [
    "x'; DROP TABLE memories; --",
    '") OR 1=1 --',
    '{"$ne": null}',
    "meta.label == 'a' || true",
    "line\nbreak\ttab \\ backslash",
    "🙂 ünïcödé ﹩",
    "MATCH (n) DETACH DELETE n",
]

BACKENDS = ["server", "edge"]


def make_store(kind: str, tmp: Path, **kw: Any) -> VectorStore:
    if kind == "edge":
        return EdgeVectorStore(tmp / "edge", **kw)
    scope = qdrant_scope(tmp / f"server-{uuid.uuid4().hex[:8]}")
    return QdrantVectorStore(
        url=scope["url"],
        api_key=scope["api_key"],
        alias=scope["alias"],
        collection_prefix=scope["collection_prefix"],
        **kw,
    )


def cleanup(store: VectorStore) -> None:
    if isinstance(store, QdrantVectorStore):
        drop_qdrant_scope(store.client, store.prefix, store.alias)
    store.close()


@pytest.fixture(params=BACKENDS)
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., VectorStore]]:
    """Builds stores of the parametrised backend; all of them are cleaned up after the test."""
    made: list[VectorStore] = []

    def build(**kw: Any) -> VectorStore:
        s = make_store(request.param, tmp_path, **kw)
        made.append(s)
        return s

    yield build
    for s in reversed(made):
        cleanup(s)


@pytest.fixture
def store(factory: Callable[..., VectorStore]) -> VectorStore:
    return factory()


def unit(v: np.ndarray) -> list[float]:
    return (v / np.linalg.norm(v)).tolist()


def dataset(n: int = 60, seed: int = 7) -> list[VectorPoint]:
    """Deterministic points spread over two agents, three kinds, ~two months and some metadata."""
    rng = np.random.default_rng(seed)
    kinds = ["note", "task", "event"]
    pts = []
    for i in range(n):
        meta: dict[str, Any] = {
            "priority": i % 5,
            "score": round(i * 0.25, 2),
            "label": f"l{i % 4}",
            "due": (T0 + timedelta(hours=7 * i)).isoformat(),
            "nested": {"not": "replicated"},
        }
        if i % 3:
            meta["flag"] = i % 2 == 0
        pts.append(
            VectorPoint(
                id=uuid.UUID(int=int(rng.integers(1, 2**62)) << 64 | i),
                vector=unit(rng.standard_normal(DIM)),
                agent_id="alice" if i % 2 else "bob",
                kind=kinds[i % 3],
                created_at=T0 + timedelta(days=i),
                content_hash=f"h{i}",
                entity_keys=[f"alice/User:u{i % 6}", f"alice/Project:p{i % 4}"],
                meta=meta,
            )
        )
    return pts


def ids_of(hits: list[Any]) -> set[uuid.UUID]:
    return {h.id for h in hits}


def query_vec(seed: int = 99) -> list[float]:
    return unit(np.random.default_rng(seed).standard_normal(DIM))


def all_records(store: VectorStore, **kw: Any) -> list[Any]:
    return [r for page in store.scroll(**kw) for r in page]


# ------------------------------------------------------------------------------------------------


def test_ensure_collection_is_idempotent_and_indexed(store: VectorStore) -> None:
    name = store.ensure_collection(MODEL_A)
    assert store.ensure_collection(MODEL_A) == name
    assert name.endswith(name[-8:]) and "model-a" in name
    cols = store.collections()
    assert [(c.name, c.model, c.points, c.active) for c in cols] == [(name, MODEL_A, 0, True)]
    assert store.active_model() == MODEL_A
    expected = {
        "agent_id": "keyword",
        "kind": "keyword",
        "created_at": "datetime",
        "entity_keys": "keyword",
        "deleted": "bool",
        "content_hash": "keyword",
    }
    if isinstance(store, EdgeVectorStore):
        assert store.payload_schema() == expected
    else:
        assert isinstance(store, QdrantVectorStore)
        schema = store.client.get_collection(name).payload_schema
        assert {k: str(v.data_type.value) for k, v in schema.items()} == expected
        agent = schema["agent_id"].params
        assert getattr(agent, "is_tenant", None) is True


def test_same_model_id_with_another_shape_is_refused(store: VectorStore) -> None:
    store.ensure_collection(MODEL_A)
    with pytest.raises(StoreError, match="exists for"):
        store.ensure_collection(EmbeddingModelInfo(MODEL_A.model_id, DIM + 1))


def test_nothing_active_until_ensured(store: VectorStore) -> None:
    assert store.active_model() is None
    assert store.ensure_collection(MODEL_A, activate_if_none=False)
    assert store.active_model() is None
    with pytest.raises(StoreError, match="no collection is active"):
        store.upsert(dataset(1))
    store.upsert(dataset(3), model_id=MODEL_A.model_id)  # explicit model: fine without an alias
    assert store.count(model_id=MODEL_A.model_id) == 3
    with pytest.raises(StoreError):
        store.search(query_vec(), VectorFilter(), 5, model_id=MODEL_A.model_id)


def test_activate_swaps_and_mismatched_model_is_refused(store: VectorStore) -> None:
    store.ensure_collection(MODEL_A)
    store.ensure_collection(MODEL_B)  # an alias already exists: B is created but not activated
    assert store.active_model() == MODEL_A
    pts = dataset(10)
    store.upsert(pts)  # active = A
    store.upsert(pts[:4], model_id=MODEL_B.model_id)
    assert store.count() == 10 and store.count(model_id=MODEL_B.model_id) == 4

    q = query_vec()
    assert len(store.search(q, VectorFilter(), 3, model_id=MODEL_A.model_id)) == 3
    with pytest.raises(StoreError, match="model-b") as err:
        store.search(q, VectorFilter(), 3, model_id=MODEL_B.model_id)  # same dims, other model
    assert err.value.hint and "not comparable" in err.value.hint

    store.activate(MODEL_B.model_id)
    assert store.active_model() == MODEL_B
    assert {c.model.model_id: c.active for c in store.collections()} == {
        MODEL_A.model_id: False,
        MODEL_B.model_id: True,
    }
    assert ids_of(store.search(q, VectorFilter(), 10, model_id=MODEL_B.model_id)) == {p.id for p in pts[:4]}
    with pytest.raises(StoreError):
        store.search(q, VectorFilter(), 3, model_id=MODEL_A.model_id)
    with pytest.raises(StoreError, match="active"):
        store.drop_collection(MODEL_B.model_id)
    with pytest.raises(StoreError):
        store.activate("never/ensured")

    store.drop_collection(MODEL_A.model_id)
    store.drop_collection(MODEL_A.model_id)  # idempotent
    assert [c.model for c in store.collections()] == [MODEL_B]


def test_upsert_is_idempotent_by_id(store: VectorStore) -> None:
    store.ensure_collection(MODEL_A)
    p = dataset(1)[0]
    store.upsert([p])
    store.upsert([replace(p, kind="task", content_hash="h-new")])
    assert store.count() == 1
    [rec] = all_records(store)
    assert (rec.id, rec.content_hash, rec.model_id) == (p.id, "h-new", MODEL_A.model_id)
    [hit] = store.search(p.vector, VectorFilter(), 5, model_id=MODEL_A.model_id)
    assert (hit.id, hit.kind, hit.agent_id, hit.created_at) == (p.id, "task", p.agent_id, p.created_at)
    assert hit.score == pytest.approx(1.0, abs=1e-5)


def test_wrong_dimension_is_a_store_error(store: VectorStore) -> None:
    store.ensure_collection(MODEL_A)
    with pytest.raises(StoreError, match="dimensions"):
        store.upsert([replace(dataset(1)[0], vector=[0.1] * (DIM + 2))])
    with pytest.raises(StoreError, match="dimensions"):
        store.search([0.1] * 3, VectorFilter(), 3, model_id=MODEL_A.model_id)


FILTER_CASES: list[tuple[str, VectorFilter, Callable[[VectorPoint], bool]]] = [
    ("all", VectorFilter(), lambda p: True),
    ("agent", VectorFilter(agent_id="alice"), lambda p: p.agent_id == "alice"),
    ("kinds", VectorFilter(kinds=["task", "event"]), lambda p: p.kind in ("task", "event")),
    ("exclude_kinds", VectorFilter(exclude_kinds=["note"]), lambda p: p.kind != "note"),
    (
        "time range [from, to)",
        VectorFilter(created_from=T0 + timedelta(days=10), created_to=T0 + timedelta(days=20)),
        lambda p: T0 + timedelta(days=10) <= p.created_at < T0 + timedelta(days=20),
    ),
    (
        "time from, other tz",
        VectorFilter(created_from=(T0 + timedelta(days=50)).astimezone(__import__("zoneinfo").ZoneInfo("Asia/Tokyo"))),
        lambda p: p.created_at >= T0 + timedelta(days=50),
    ),
    (
        "entity keys any",
        VectorFilter(entity_keys_any=["alice/User:u1", "alice/Project:p2"]),
        lambda p: "alice/User:u1" in p.entity_keys or "alice/Project:p2" in p.entity_keys,
    ),
    ("meta = int", VectorFilter(meta=[MetaCondition("priority", "=", 3)]), lambda p: p.meta["priority"] == 3),
    ("meta = str", VectorFilter(meta=[MetaCondition("label", "=", "l1")]), lambda p: p.meta["label"] == "l1"),
    ("meta = float", VectorFilter(meta=[MetaCondition("score", "=", 2.5)]), lambda p: p.meta["score"] == 2.5),
    ("meta = bool", VectorFilter(meta=[MetaCondition("flag", "=", True)]), lambda p: p.meta.get("flag") is True),
    (
        "meta != (missing key does not match)",
        VectorFilter(meta=[MetaCondition("flag", "!=", True)]),
        lambda p: "flag" in p.meta and p.meta["flag"] is not True,
    ),
    ("meta <", VectorFilter(meta=[MetaCondition("priority", "<", 2)]), lambda p: p.meta["priority"] < 2),
    ("meta <=", VectorFilter(meta=[MetaCondition("score", "<=", 3.0)]), lambda p: p.meta["score"] <= 3.0),
    ("meta >", VectorFilter(meta=[MetaCondition("score", ">", 10.5)]), lambda p: p.meta["score"] > 10.5),
    ("meta >=", VectorFilter(meta=[MetaCondition("priority", ">=", 4)]), lambda p: p.meta["priority"] >= 4),
    (
        "meta in str",
        VectorFilter(meta=[MetaCondition("label", "in", ["l0", "l3"])]),
        lambda p: p.meta["label"] in ("l0", "l3"),
    ),
    (
        "meta in int",
        VectorFilter(meta=[MetaCondition("priority", "in", [0, 4])]),
        lambda p: p.meta["priority"] in (0, 4),
    ),
    (
        "meta in mixed",
        VectorFilter(meta=[MetaCondition("score", "in", [0.5, 1])]),
        lambda p: p.meta["score"] in (0.5, 1.0),
    ),
    ("meta = int finds float", VectorFilter(meta=[MetaCondition("score", "=", 2)]), lambda p: p.meta["score"] == 2.0),
    (
        "everything AND-ed",
        VectorFilter(
            agent_id="alice",
            kinds=["note", "task"],
            created_to=T0 + timedelta(days=45),
            entity_keys_any=["alice/Project:p1", "alice/Project:p3"],
            meta=[MetaCondition("priority", ">", 0), MetaCondition("label", "!=", "l3")],
        ),
        lambda p: (
            p.agent_id == "alice"
            and p.kind in ("note", "task")
            and p.created_at < T0 + timedelta(days=45)
            and bool({"alice/Project:p1", "alice/Project:p3"} & set(p.entity_keys))
            and p.meta["priority"] > 0
            and p.meta["label"] != "l3"
        ),
    ),
    ("empty kinds select nothing", VectorFilter(kinds=[]), lambda p: False),
    ("empty ids select nothing", VectorFilter(ids=[]), lambda p: False),
]


def assert_filter_cases(store: VectorStore) -> None:
    """Every FILTER_CASES filter returns exactly the points its predicate accepts."""
    pts = dataset()
    store.upsert(pts)
    q = query_vec()
    for label, flt, pred in FILTER_CASES:
        got = ids_of(store.search(q, flt, 100, model_id=MODEL_A.model_id))
        assert got == {p.id for p in pts if pred(p)}, label


def test_filters_match_a_brute_force_evaluation(store: VectorStore) -> None:
    store.ensure_collection(MODEL_A)
    assert_filter_cases(store)


def test_metadata_indexes_change_speed_not_answers(factory: Callable[..., VectorStore]) -> None:
    """``[qdrant] indexed_metadata``: the same brute-force answers with the keys indexed."""
    indexes = {"priority": "number", "score": "number", "label": "keyword", "flag": "bool"}
    store = factory(meta_indexes=indexes)
    store.ensure_collection(MODEL_A)
    if isinstance(store, EdgeVectorStore):
        schema = store.payload_schema()
        assert {k: schema[k] for k in schema if k.startswith("meta.")} == {
            "meta.priority": "float",
            "meta.score": "float",
            "meta.label": "keyword",
            "meta.flag": "bool",
        }
    assert_filter_cases(store)
    with pytest.raises(InputError):
        factory(meta_indexes={"bad key": "number"})
    with pytest.raises(InputError):
        factory(meta_indexes={"fine": "vector"})


def test_unsafe_meta_filters_are_input_errors(store: VectorStore) -> None:
    store.ensure_collection(MODEL_A)
    store.upsert(dataset(3))
    for cond in (
        MetaCondition("a.b", "=", 1),
        MetaCondition("x') or ('1", "=", 1),
        MetaCondition("label", "<", "l2"),
        MetaCondition("label", "in", []),
        MetaCondition("label", "=", {"$gt": ""}),
    ):
        with pytest.raises(InputError):
            store.search(query_vec(), VectorFilter(meta=[cond]), 5, model_id=MODEL_A.model_id)


def test_id_lists_are_chunked_and_merged_exactly(factory: Callable[..., VectorStore]) -> None:
    chunked = factory(id_chunk_size=7)
    chunked.ensure_collection(MODEL_A)
    pts = dataset()
    chunked.upsert(pts)
    rng = np.random.default_rng(3)
    cand = [pts[int(i)] for i in rng.choice(len(pts), size=31, replace=False)]
    unknown = [uuid.uuid4() for _ in range(5)]
    q = np.array(query_vec())
    flt = VectorFilter(ids=[p.id for p in cand] + unknown + [cand[0].id], agent_id="alice")
    # every alice candidate, across 6 chunks
    got = chunked.search(q.tolist(), flt, 100, model_id=MODEL_A.model_id)
    assert ids_of(got) == {p.id for p in cand if p.agent_id == "alice"}
    assert len(got) == len(ids_of(got))
    # top-5 over the chunks equals the brute-force top-5 by cosine
    top = chunked.search(q.tolist(), flt, 5, model_id=MODEL_A.model_id)
    ranked = sorted((p for p in cand if p.agent_id == "alice"), key=lambda p: -float(np.dot(q, p.vector)))
    assert [h.id for h in top] == [p.id for p in ranked[:5]]
    assert [h.score for h in top] == sorted((h.score for h in top), reverse=True)


def test_score_threshold(store: VectorStore) -> None:
    store.ensure_collection(MODEL_A)
    pts = dataset()
    store.upsert(pts)
    q = np.array(query_vec())
    hits = store.search(q.tolist(), VectorFilter(), 100, model_id=MODEL_A.model_id, score_threshold=0.3)
    assert ids_of(hits) == {p.id for p in pts if float(np.dot(q, p.vector)) >= 0.3}


def test_soft_delete_hides_until_restored(store: VectorStore) -> None:
    store.ensure_collection(MODEL_A)
    pts = dataset(20)
    store.upsert(pts)
    gone = [p.id for p in pts[:5]]
    store.set_deleted([*gone, uuid.uuid4()])  # an id Qdrant never saw is not an error
    q = query_vec()
    visible = ids_of(store.search(q, VectorFilter(), 100, model_id=MODEL_A.model_id))
    assert visible == {p.id for p in pts[5:]}
    assert not ids_of(store.search(q, VectorFilter(ids=gone), 100, model_id=MODEL_A.model_id))
    with_deleted = store.search(q, VectorFilter(include_deleted=True), 100, model_id=MODEL_A.model_id)
    assert ids_of(with_deleted) == {p.id for p in pts}
    assert store.count() == 20
    assert {r.id for r in all_records(store) if r.deleted} == set(gone)
    store.set_deleted(gone[:2], False)
    assert len(store.search(q, VectorFilter(), 100, model_id=MODEL_A.model_id)) == 17


def test_delete_purges(store: VectorStore) -> None:
    store.ensure_collection(MODEL_A)
    pts = dataset(12)
    store.upsert(pts)
    store.delete([p.id for p in pts[:4]] + [uuid.uuid4()])
    assert store.count() == 8
    assert {r.id for r in all_records(store)} == {p.id for p in pts[4:]}
    hits = store.search(query_vec(), VectorFilter(include_deleted=True), 100, model_id=MODEL_A.model_id)
    assert ids_of(hits) == {p.id for p in pts[4:]}
    store.delete([])


def test_scroll_pages_cover_everything_once_and_count(store: VectorStore) -> None:
    store.ensure_collection(MODEL_A)
    pts = dataset(45)
    store.upsert(pts)
    store.set_deleted([pts[0].id])
    pages = list(store.scroll(batch=7))
    assert all(0 < len(page) <= 7 for page in pages) and len(pages) == 7
    seen = [r.id for page in pages for r in page]
    assert len(seen) == len(set(seen)) == 45 and set(seen) == {p.id for p in pts}
    by_id = {r.id: r for page in pages for r in page}
    assert all(by_id[p.id].content_hash == p.content_hash and by_id[p.id].agent_id == p.agent_id for p in pts)
    alice = all_records(store, agent_id="alice", batch=4)
    assert {r.id for r in alice} == {p.id for p in pts if p.agent_id == "alice"}
    assert store.count(agent_id="alice") == len(alice) == 22
    assert store.count(agent_id="nobody") == 0
    assert list(store.scroll(agent_id="nobody")) == []


def test_ping(store: VectorStore) -> None:
    info = store.ping()
    assert info["model_id"] is None
    store.ensure_collection(MODEL_A)
    info = store.ping()
    assert info["model_id"] == MODEL_A.model_id and info["dim"] == DIM and info["engine"]
    assert store.name == "qdrant"


def test_hostile_strings_are_stored_as_data(store: VectorStore) -> None:
    store.ensure_collection(MODEL_A)
    base = dataset(len(HOSTILE))
    pts = [
        replace(p, kind=s[:60], content_hash=s, entity_keys=[s], meta={"label": s, "n": i})
        for i, (p, s) in enumerate(zip(base, HOSTILE, strict=True))
    ]
    store.upsert(pts)
    q = query_vec()
    for p, s in zip(pts, HOSTILE, strict=True):
        for flt in (
            VectorFilter(meta=[MetaCondition("label", "=", s)]),
            VectorFilter(entity_keys_any=[s]),
            VectorFilter(kinds=[s[:60]]),
        ):
            assert ids_of(store.search(q, flt, 10, model_id=MODEL_A.model_id)) == {p.id}
    assert {r.content_hash for r in all_records(store)} == set(HOSTILE)
    assert store.count() == len(HOSTILE)
    store.ensure_collection(EmbeddingModelInfo("../../etc/passwd'; rm -rf /", DIM))  # a hostile model id
    assert any("etc-passwd" in c.name and "/" not in c.name for c in store.collections())


# ------------------------------------------------------------------------------------------------
# Engine-specific behaviour


def test_edge_is_single_process_and_persists(tmp_path: Path) -> None:
    s = EdgeVectorStore(tmp_path / "v")
    s.ensure_collection(MODEL_A)
    pts = dataset(10)
    s.upsert(pts)
    with pytest.raises(StoreUnavailable, match="in use"):
        EdgeVectorStore(tmp_path / "v")
    s.close()
    s.close()
    with pytest.raises(StoreUnavailable):
        s.count()
    s2 = EdgeVectorStore(tmp_path / "v")
    try:
        assert s2.active_model() == MODEL_A and s2.count() == 10
        assert not any(p.name.startswith(".creating") for p in (tmp_path / "v").iterdir())
        assert (tmp_path / "v" / "active").read_text().strip() == MODEL_A.model_id
    finally:
        s2.close()


def test_edge_threads_and_optimize(tmp_path: Path) -> None:
    s = EdgeVectorStore(tmp_path / "v", exact_below=0, hnsw_ef=256)  # force the HNSW params path
    try:
        s.ensure_collection(MODEL_A)
        pts = dataset(300, seed=11)
        s.upsert(pts[:150])
        errors: list[BaseException] = []

        def reader() -> None:
            try:
                for i in range(40):
                    s.search(query_vec(i), VectorFilter(agent_id="alice"), 5, model_id=MODEL_A.model_id)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        s.upsert(pts[150:])
        s.optimize()
        for t in threads:
            t.join()
        assert not errors
        assert s.count() == 300
        assert len(s.search(query_vec(), VectorFilter(), 10, model_id=MODEL_A.model_id)) == 10
    finally:
        s.close()


def test_server_keeps_metadata_and_alias_for_a_second_client(tmp_path: Path) -> None:
    """A collection describes itself: a second process finds the model and the alias on the server."""
    scope = qdrant_scope(tmp_path)
    kw = {"url": scope["url"], "api_key": scope["api_key"], "alias": scope["alias"]}
    s = QdrantVectorStore(collection_prefix=scope["collection_prefix"], **kw)
    try:
        s.ensure_collection(MODEL_A)
        s.upsert(dataset(4))
        s2 = QdrantVectorStore(collection_prefix=scope["collection_prefix"], **kw)
        try:
            assert s2.active_model() == MODEL_A and s2.count() == 4
            info = s2.ping()
            assert (info["engine"], info["version"], info["model_id"]) == ("qdrant", "1.19.0", MODEL_A.model_id)
        finally:
            s2.close()
    finally:
        s.close()


def test_unreachable_server_is_store_unavailable() -> None:
    s = QdrantVectorStore(url="http://127.0.0.1:9", timeout_s=1)
    try:
        with pytest.raises(StoreUnavailable) as err:
            s.ping()
        assert err.value.store == "qdrant" and err.value.hint
    finally:
        s.close()
