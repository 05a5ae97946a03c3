"""Issued tokens: bearer tokens bound to one agent (``memoryctl token issue AGENT``) or operator
tokens (``memoryctl token issue --operator``), kept hashed.

The operator's token (``serve.token`` or the token file) opens every agent, and so does an issued
operator token -- one per person or tool, each with its name (the console records actions with
it) and revocable on its own, instead of one shared secret. An agent token opens one agent: over
HTTP, MCP and the console its requests are bound to that agent (``memoryctl.operations.access``).
Only the SHA-256 of each token is stored (``<data_dir>/agent-tokens.json``, mode 0600): the
tokens are 256 random bits, so a fast hash is enough -- nothing to guess -- and a lookup is one
dictionary access. The file is read again when it changes, so a token issued or revoked by
another process counts from the next request on.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memoryctl.errors import InputError, NotFoundError
from memoryctl.model import validate_agent_id

if TYPE_CHECKING:
    from memoryctl.config import Settings

FILE = "agent-tokens.json"
PREFIX = "mca_"  # tells an agent token from the operator's at a glance (and to secret scanners)
OPERATOR_PREFIX = "mco_"  # an issued operator token


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AgentTokens:
    """The issued tokens of one data directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None
        self._by_hash: dict[str, dict[str, Any]] = {}

    @classmethod
    def of(cls, settings: Settings) -> AgentTokens:
        return cls(settings.data_dir / FILE)

    def _read(self) -> list[dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        tokens: list[dict[str, Any]] = data.get("tokens", [])
        return tokens

    def _write(self, tokens: list[dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{FILE}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"tokens": tokens}, f, indent=1)
        os.replace(tmp, self.path)

    def issue(self, agent: str, *, name: str | None = None) -> dict[str, Any]:
        """A new token for ``agent``: its id and the token itself (shown once, stored hashed)."""
        agent, name = validate_agent_id(agent), check_name(name)
        token = PREFIX + secrets.token_urlsafe(32)
        entry = self._add(token, {"agent": agent, "name": name or agent})
        return {"id": entry["id"], "agent": agent, "name": entry["name"], "token": token}

    def issue_operator(self, *, name: str | None = None) -> dict[str, Any]:
        """A new operator token (every agent, every operation): its id, its name and the token."""
        token = OPERATOR_PREFIX + secrets.token_urlsafe(32)
        entry = self._add(token, {"operator": True, "name": check_name(name) or "operator"})
        return {"id": entry["id"], "operator": True, "name": entry["name"], "token": token}

    def _add(self, token: str, fields: dict[str, Any]) -> dict[str, Any]:
        entry = {
            "id": secrets.token_hex(4),
            **fields,
            "sha256": digest(token),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        with self._lock:
            self._write([*self._read(), entry])
        return entry

    def issued(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in t.items() if k != "sha256"} for t in self._read()]

    def revoke(self, ids: list[str]) -> list[str]:
        with self._lock:
            tokens = self._read()
            missing = sorted(set(ids) - {t["id"] for t in tokens})
            if missing:
                raise NotFoundError(f"no agent token {', '.join(missing)}", hint="see `memoryctl token list`")
            self._write([t for t in tokens if t["id"] not in ids])
        return ids

    def agent_of(self, token: str) -> str | None:
        """The agent ``token`` is bound to, or None when it is not an agent token."""
        entry = self.lookup(token) if token.startswith(PREFIX) else None
        return None if entry is None else str(entry["agent"])

    def lookup(self, token: str) -> dict[str, Any] | None:
        """The issued token's entry (``agent`` or ``operator``, ``name``), or None: not issued here."""
        if not token.startswith((PREFIX, OPERATOR_PREFIX)):
            return None
        return self.by_digest(digest(token))

    def by_digest(self, sha256: str) -> dict[str, Any] | None:
        """The entry of the token with this SHA-256 (the console's session keeps the digest only,
        so that a revoked token ends its sessions from the next request on)."""
        with self._lock:
            try:
                st = self.path.stat()
                seen: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
            except FileNotFoundError:
                seen = None
            if seen != self._seen:
                self._by_hash = {t["sha256"]: t for t in self._read()} if seen else {}
                self._seen = seen
            return self._by_hash.get(sha256)


def check_name(name: str | None) -> str | None:
    if name is not None and (not name.strip() or len(name) > 100 or not name.isprintable()):
        raise InputError("a token's name is 1-100 printable characters")
    return name
