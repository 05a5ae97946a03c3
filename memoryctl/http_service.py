"""The HTTP servers memoryctl talks to (vLLM's OpenAI-compatible API; Qdrant's REST API for health
and snapshots): one retrying transport, and one place that turns what went wrong into errors.

Retry policy (``Retry``), bounded so that a dead endpoint costs at most ``(retries + 1) * timeout``
plus the backoff: connection errors, timeouts and the statuses that mean "try again" (408, 429,
500, 502, 503, 504) are retried with exponential backoff. A request with a side effect that must
not be repeated blindly passes ``retry=False``. Retrying lives in ``RetryingTransport``, an
``httpx`` transport, so every client built on ``HttpService`` retries the same way and a test
hands in ``httpx.MockTransport`` (``transport=``) to script a server without one.

After the last attempt an exception or a retryable status is ``StoreUnavailable`` ("could not get
an answer": the write path leaves the outbox entry, health reports the component down), naming
the attempts and the last failure. Any other status is the caller's to judge (``error_text``
reads the server's own message from the OpenAI / vLLM / FastAPI error shapes).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from memoryctl.errors import StoreUnavailable

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_RETRY_KEY = "memoryctl.retry"  # a request extension: False = one attempt only


@dataclass(frozen=True, slots=True)
class Retry:
    """How often and how patiently a request is tried again."""

    retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    statuses: frozenset[int] = RETRY_STATUS

    def delay(self, attempt: int) -> float:
        """The wait before attempt number ``attempt`` (1 = the first retry)."""
        return min(self.max_backoff_s, self.backoff_s * 2.0 ** (attempt - 1))


class RetryingTransport(httpx.BaseTransport):
    """An ``httpx`` transport that retries ``inner`` by ``retry``. A request whose extensions say
    ``memoryctl.retry: False`` gets one attempt. After the last attempt the last response is
    returned (a retryable status included) or the last exception raised."""

    def __init__(
        self,
        retry: Retry,
        inner: httpx.BaseTransport | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.retry = retry
        self.inner = inner if inner is not None else httpx.HTTPTransport()
        self._sleep = sleep

    def attempts(self, request: httpx.Request) -> int:
        return 1 + (max(0, self.retry.retries) if request.extensions.get(_RETRY_KEY, True) else 0)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        attempts = self.attempts(request)
        for attempt in range(attempts):
            if attempt:
                self._sleep(self.retry.delay(attempt))
            last = attempt + 1 == attempts
            try:
                response = self.inner.handle_request(request)
            except httpx.TransportError:  # connection errors and timeouts
                if last:
                    raise
                continue
            if response.status_code in self.retry.statuses and not last:
                response.close()
                continue
            return response
        raise AssertionError("unreachable: the last attempt returns or raises")

    def close(self) -> None:
        self.inner.close()


class HttpService:
    """One server: its base URL, headers and timeout, over a ``RetryingTransport``. ``store`` names
    it in errors; ``hint`` is what an operator should check when it cannot be reached."""

    def __init__(
        self,
        base_url: str,
        *,
        store: str,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        retry: Retry | None = None,
        transport: httpx.BaseTransport | None = None,
        hint: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.store = store
        self.timeout_s = timeout_s
        self.hint = hint
        self.transport = RetryingTransport(retry or Retry(), transport, sleep=sleep)
        self._client = httpx.Client(
            base_url=self.base_url,
            headers=dict(headers or {}),
            timeout=httpx.Timeout(timeout_s),
            transport=self.transport,
        )

    def request(
        self, method: str, path: str, *, json: Any = None, retry: bool = True, timeout_s: float | None = None
    ) -> httpx.Response:
        """The server's answer to ``method path``, or ``StoreUnavailable`` once the attempts are
        spent on exceptions or retryable statuses. Any other status is returned as it came."""
        request = self._client.build_request(
            method,
            path,
            json=json,
            extensions={} if retry else {_RETRY_KEY: False},
            timeout=httpx.Timeout(timeout_s) if timeout_s is not None else httpx.USE_CLIENT_DEFAULT,
        )
        attempts = self.transport.attempts(request)
        try:
            response = self._client.send(request)
        except httpx.TimeoutException as exc:
            timeout = timeout_s if timeout_s is not None else self.timeout_s
            raise self._unavailable(path, attempts, f"timed out after {timeout:g}s ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise self._unavailable(path, attempts, f"could not connect: {exc}") from exc
        if response.status_code in self.transport.retry.statuses:
            raise self._unavailable(path, attempts, f"HTTP {response.status_code}: {error_text(response)}")
        return response

    def _unavailable(self, path: str, attempts: int, last: str) -> StoreUnavailable:
        tries = f"after {attempts} attempts" if attempts > 1 else "(1 attempt)"
        return StoreUnavailable(self.store, f"{self.base_url}{path} unavailable {tries}: {last}", hint=self.hint)

    def close(self) -> None:
        self._client.close()


def error_text(resp: httpx.Response) -> str:
    """The server's own error message when it sent one (``{"error": {"message"}}``, ``{"error": "…"}``,
    ``{"message"}``, FastAPI's ``{"detail"}``), else the start of the body."""
    try:
        payload = resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        payload = None
    if isinstance(payload, dict):
        err = payload.get("error", payload.get("message", payload.get("detail")))
        if isinstance(err, dict):
            err = err.get("message")
        if isinstance(err, str):
            return err[:300]
    return resp.text.strip()[:300] or resp.reason_phrase


def root_url(url: str) -> str:
    """``http://host:8000``, ``…/`` and ``…/v1`` all mean the same OpenAI-compatible server."""
    base = url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base
