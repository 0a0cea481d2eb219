"""Console sessions: an expiring HMAC-signed cookie, and the CSRF token derived from it.

The signing key is derived from the admin token, so rotating the token signs everyone
out. A signed-in session is also kept server-side (``matcher.store.console_sessions``,
by ``session_id``), so that signing out ends it wherever the cookie was copied. Without
an admin token the console is open, like /v1: a visitor gets a session anyway (signed
with a key of this process, not stored), so that forms still carry a CSRF token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import SecretStr

COOKIE = "matcher_console"
SESSION_S = 8 * 3600


def _mac(key: bytes, message: str) -> str:
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def session_id(session: str) -> bytes:
    """What the server keeps of a session: a digest of its signed body (never the cookie)."""
    return hashlib.sha256(session.rpartition(".")[0].encode()).digest()


def expires_at(session: str) -> datetime:
    """When a session (checked ``valid``) expires."""
    return datetime.fromtimestamp(int(session.partition(".")[0]), UTC)


def csrf_token(session: str) -> str:
    """HMAC(session, "csrf"): what every console form carries."""
    return _mac(session.encode(), "csrf")


@dataclass(frozen=True)
class Sessions:
    key: bytes
    token: SecretStr | None  # None: the console is open

    @classmethod
    def for_token(cls, token: SecretStr | None) -> Sessions:
        if token is None:
            return cls(secrets.token_bytes(32), None)
        derived = hmac.new(
            token.get_secret_value().encode(), b"matcher console session v1", hashlib.sha256
        ).digest()
        return cls(derived, token)

    @property
    def open(self) -> bool:
        return self.token is None

    def token_matches(self, given: str) -> bool:
        """The admin token, compared in constant time."""
        if self.token is None:
            return True
        return hmac.compare_digest(given.encode(), self.token.get_secret_value().encode())

    def issue(self, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + SESSION_S)
        body = f"{expires}.{secrets.token_urlsafe(16)}"
        return f"{body}.{_mac(self.key, body)}"

    def valid(self, value: str | None, now: float | None = None) -> bool:
        if not value or len(value) > 200:
            return False
        body, _, mac = value.rpartition(".")
        expires, _, _nonce = body.partition(".")
        if not hmac.compare_digest(mac.encode(), _mac(self.key, body).encode()):
            return False
        try:
            return int(expires) > (time.time() if now is None else now)
        except ValueError:
            return False

    @staticmethod
    def csrf_ok(session: str, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(
            given.encode(), csrf_token(session).encode()
        )
