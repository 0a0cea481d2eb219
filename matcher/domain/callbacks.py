"""A callback URL per wait: the token's form, its digest, and the URL built from it.

The token is issued by the database (``matcher.issue_callback_v1``): 32 random bytes as
base64url without padding. It is the whole credential for one wait, so the database keeps
only its SHA-256, and whoever presents it is asked for it by that digest.
"""

from __future__ import annotations

import hashlib
import re

# The producer callback events are stored under (``matcher.callback_producer()``); no
# producer of the producers file may take the name.
CALLBACK_PRODUCER = "callback"
# Where the ingress serves callbacks: ``POST {base}/v1/callbacks/{token}``.
CALLBACK_PATH = "/v1/callbacks/"
TOKEN_LENGTH = 43  # 256 bits in base64url, without padding
_TOKEN = re.compile(rf"[A-Za-z0-9_-]{{{TOKEN_LENGTH}}}")


def is_token(text: str) -> bool:
    """Whether ``text`` has a token's form (43 base64url characters). Anything else cannot
    be a token, so it is refused without a lookup."""
    return _TOKEN.fullmatch(text) is not None


def token_sha256(token: str) -> bytes:
    """The digest the database keeps and is asked by."""
    return hashlib.sha256(token.encode("ascii")).digest()


def token_label(token: str) -> str:
    """What logs may say of a token: the first 8 hex digits of its digest (32 bits: enough
    to tell requests apart, far too few to find the token or its wait by)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def callback_url(base: str, token: str) -> str:
    """The URL for ``token`` on the ingress at ``base`` (``https://hooks.example.com``, or
    with a path prefix a proxy adds)."""
    if not is_token(token):
        raise ValueError("not a callback token (43 base64url characters)")
    return base.rstrip("/") + CALLBACK_PATH + token
