"""A kept-alive connection that Qdrant closed is retried once, for idempotent calls only.

The real Qdrant server of scripts/services sits behind a loopback TCP relay that can break the
next request: it reads the request and closes the connection without answering, which is exactly
what the client sees when the server closed an idle kept-alive connection as it was reused
("Server disconnected without sending a response": one of them failed a nightly re-embed step on
the cluster). Without the retry the reads below raise ``StoreUnavailable``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from memoryctl.errors import StoreUnavailable
from memoryctl.stores.vector_qdrant import QdrantBackend
from tests.conftest import drop_qdrant_scope, qdrant_scope

pytestmark = pytest.mark.integration


class BreakingRelay:
    """Relays loopback TCP to Qdrant; ``break_next()`` makes the next request go unanswered."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._break = threading.Event()
        self.broken = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def break_next(self) -> None:
        self._break.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while data := src.recv(65536):
                if requests and self._break.is_set():
                    self._break.clear()
                    self.broken += 1
                    break  # the request is read and dropped: no answer, the connection closes
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def relayed(tmp_path: Any) -> Iterator[tuple[QdrantBackend, BreakingRelay, dict[str, Any]]]:
    import httpx

    scope = qdrant_scope(tmp_path)
    url = httpx.URL(scope["url"])
    relay = BreakingRelay((url.host, url.port or 6333))
    backend = QdrantBackend(
        url=f"http://127.0.0.1:{relay.port}",
        path=None,
        api_key=scope["api_key"],
        timeout_s=5,
        alias=scope["alias"],
        alias_cache_s=0,
    )
    yield backend, relay, scope
    drop_qdrant_scope(backend.client, scope["collection_prefix"], scope["alias"])
    backend.close()
    relay.close()


def test_a_read_on_a_connection_qdrant_closed_is_retried(relayed: Any) -> None:
    backend, relay, _ = relayed
    before = backend.names()  # opens the kept-alive connection the relay then breaks
    relay.break_next()
    with backend.errors("collections"):
        assert backend.names() == before
    assert relay.broken == 1
    relay.break_next()
    with backend.errors("active_model"):
        assert backend.active(fresh=True) is None
    assert relay.broken == 2


def test_a_call_that_is_not_idempotent_is_not_repeated(relayed: Any) -> None:
    """Creating a collection is not marked idempotent: a broken connection fails it, plainly."""
    from memoryctl.stores.protocols import EmbeddingModelInfo

    backend, relay, scope = relayed
    backend.names()
    relay.break_next()
    with pytest.raises(StoreUnavailable, match="cannot reach"), backend.errors("ensure_collection"):
        backend.create(f"{scope['collection_prefix']}__a", EmbeddingModelInfo("test/model:v1", 4), [])
    assert relay.broken == 1
