"""A kept-alive connection that Qdrant closed is retried once, for idempotent calls only.

The real Qdrant server of scripts/services sits behind a loopback TCP relay (tests/relay.py) that
can break the next request: it reads the request and closes the connection without answering, which is exactly
what the client sees when the server closed an idle kept-alive connection as it was reused
("Server disconnected without sending a response": one of them failed a nightly re-embed step on
the cluster). Without the retry the reads below raise ``StoreUnavailable``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from memoryctl.errors import StoreUnavailable
from memoryctl.stores.vector_qdrant import QdrantBackend
from tests.conftest import drop_qdrant_scope, qdrant_scope
from tests.relay import BreakingRelay

pytestmark = pytest.mark.integration


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
