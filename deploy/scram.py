"""PostgreSQL's stored form of a password, computed on the controller (no server involved).

Below the operation modules: :mod:`deploy.postgres` creates memoryctl's role with it and
:mod:`deploy.patroni` the replication and rewind roles, neither importing the other for it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os


def scram_verifier(password: str, salt: bytes | None = None, iterations: int = 4096) -> str:
    """PostgreSQL's stored form of a SCRAM-SHA-256 password (RFC 5802/7677; what
    ``password_encryption = scram-sha-256`` stores): the server never sees the password itself."""
    salt = salt if salt is not None else os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"
