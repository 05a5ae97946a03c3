"""The console's sessions and CSRF tokens: signed with a secret of the data directory (HMAC-SHA256).

Why a signed cookie and not a table: ``memoryctl serve`` keeps no session state that must survive
it, and a signed cookie needs none -- what the server must still decide is in the checks below:
- the cookie holds the session's id, its expiry and the SHA-256 of the token signed in with, never
  the token; every request looks the digest up again, so a revoked token (``memoryctl token
  revoke``) or a changed ``serve.token`` ends its sessions at once;
- the expiry is the server's (``MAX_AGE_S`` after sign-in), whatever the browser keeps;
- logout ends the session on the server too (its id is remembered until it would have expired).
The secret is ``<data_dir>/console.secret``, 32 random bytes made on first use, mode 0600: a
session signed by one data directory's service is refused by another's.

CSRF: every POST form carries ``csrf``, the HMAC of the session's id (the sign-in form: of a
random value in a short-lived cookie of its own), compared in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SECRET_FILE = "console.secret"
COOKIE = "memoryctl_console"
LOGIN_COOKIE = "memoryctl_console_login"
MAX_AGE_S = 8 * 3600


def load_secret(data_dir: Path) -> bytes:
    """The data directory's signing secret, made on first use (0600, never rewritten)."""
    path = data_dir / SECRET_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        secret = path.read_bytes()
        if len(secret) < 32:
            raise ValueError(f"{path} holds {len(secret)} bytes, not a 32-byte secret: remove it") from None
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        return secret
    secret = secrets.token_bytes(32)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
    return secret


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class Session:
    sid: str
    token_sha256: str
    expires: float


class Sessions:
    """Signs, reads and ends sessions; makes and checks CSRF tokens."""

    def __init__(self, secret: bytes, *, max_age_s: float = MAX_AGE_S) -> None:
        self.secret, self.max_age_s = secret, max_age_s
        self._ended: dict[str, float] = {}  # logged-out session ids, until they would have expired
        self._lock = threading.Lock()

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self.secret, payload.encode(), hashlib.sha256).digest())

    def start(self, token: str, *, now: float | None = None) -> tuple[Session, str]:
        """A new session for ``token`` and its cookie value."""
        now = time.time() if now is None else now
        session = Session(secrets.token_urlsafe(16), hashlib.sha256(token.encode()).hexdigest(), now + self.max_age_s)
        body = _b64(json.dumps({"sid": session.sid, "tok": session.token_sha256, "exp": session.expires}).encode())
        return session, f"{body}.{self._sign(body)}"

    def read(self, cookie: str | None, *, now: float | None = None) -> Session | None:
        """The session a cookie holds, or None: unsigned, tampered with, expired or ended."""
        if not cookie or cookie.count(".") != 1:
            return None
        body, signature = cookie.split(".")
        if not hmac.compare_digest(signature, self._sign(body)):
            return None
        try:
            data = json.loads(_unb64(body))
            session = Session(str(data["sid"]), str(data["tok"]), float(data["exp"]))
        except (ValueError, KeyError, TypeError):
            return None
        now = time.time() if now is None else now
        with self._lock:
            ended = session.sid in self._ended
        return None if ended or session.expires <= now else session

    def end(self, session: Session) -> None:
        now = time.time()
        with self._lock:
            self._ended = {sid: exp for sid, exp in self._ended.items() if exp > now}
            self._ended[session.sid] = session.expires

    def csrf(self, bound_to: str) -> str:
        """The CSRF token of a session id (or of the sign-in form's nonce)."""
        return self._sign(f"csrf:{bound_to}")

    def csrf_ok(self, bound_to: str | None, given: str | None) -> bool:
        return bool(bound_to and given) and hmac.compare_digest(str(given), self.csrf(str(bound_to)))
