"""A callback request (``POST /v1/callbacks/{token}``) as the database call it makes, and
the database's answer as the HTTP answer.

Pure: the token from the URL, the query string, headers and body in; a
``CallbackRequest`` (or a refusal with its status) out. The token is the whole credential
(no producer key), so it is only ever hashed, compared by the database through its digest,
and logged as a short prefix of that digest. A request has one reading or is refused: the
body is read by the gate's strict JSON reader (the same number rule, the same refusals of
duplicate keys and of what jsonb cannot hold), the content type must be JSON, and the
event type is given once, by ``?type=``, or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from matcher.auth.record import CONTENT_TYPE, is_json_media_type, media_type
from matcher.auth.strict_json import JsonRefused, loads
from matcher.domain import trace_context
from matcher.domain.callbacks import is_token, token_label, token_sha256
from matcher.domain.events import Rejection
from matcher.ingress.requests import Refusal

# Event types are identifiers of at most 512 bytes (``matcher.checked_ident``).
MAX_TYPE_BYTES = 512
_TRACEPARENT = b"traceparent"


@dataclass(frozen=True)
class CallbackRequest:
    """What ``matcher.complete_callback_v1`` is asked: by the token's digest, an event of
    ``event_type`` (None: the wait's first type) carrying ``data``."""

    token_sha256: bytes
    label: str  # for logs: a prefix of the digest, never the token
    event_type: str | None
    data: Any
    trace_parent: str | None


def checked_token(token: str) -> Refusal | None:
    """A refusal for what cannot be a token (answered 404 without a lookup: its form is
    public, so refusing it early tells nothing)."""
    if is_token(token):
        return None
    return Refusal("unknown_callback", "not a token's form")


def to_callback(
    token: str, query: bytes, headers: list[tuple[bytes, bytes]], body: bytes
) -> CallbackRequest | Refusal:
    """The call for a request whose token has a token's form (``checked_token``); header
    names lowercase, as ASGI gives them."""
    refused = checked_token(token)
    if refused is not None:
        return refused
    kind = _content_type(headers)
    if kind is not None:
        return kind
    event_type = _event_type(query)
    if isinstance(event_type, Refusal):
        return event_type
    try:
        data = loads(body)
    except JsonRefused as exc:
        return Refusal(exc.reason, str(exc))
    traced = [(name, value) for name, value in headers if name == _TRACEPARENT]
    return CallbackRequest(
        token_sha256=token_sha256(token),
        label=token_label(token),
        event_type=event_type,
        data=data,
        trace_parent=trace_context.trace_parent(traced),
    )


def _content_type(headers: list[tuple[bytes, bytes]]) -> Refusal | None:
    given = [value for name, value in headers if name == CONTENT_TYPE]
    if len(given) != 1:
        return Refusal(
            "unsupported_media_type" if not given else "ambiguous",
            "content-type is missing" if not given else "content-type appears twice",
        )
    kind = media_type(given[0])
    if isinstance(kind, Rejection):
        return Refusal("unsupported_media_type", kind.detail)
    if not is_json_media_type(kind):
        return Refusal("unsupported_media_type", f"{kind} is not JSON")
    return None


def _event_type(query: bytes) -> str | Refusal | None:
    """``?type=`` (form-encoded, UTF-8), given at most once; no other parameter."""
    if not query:
        return None
    try:
        pairs = parse_qsl(
            query.decode("ascii"), keep_blank_values=True, strict_parsing=True,
            encoding="utf-8", errors="strict", max_num_fields=4,
        )  # fmt: skip
    except (UnicodeDecodeError, ValueError):
        return Refusal("malformed", "the query string is not form-encoded UTF-8")
    names = [name for name, _ in pairs]
    if names != ["type"]:
        return Refusal(
            "ambiguous" if names.count("type") > 1 else "malformed",
            "the query string may give type, once, and nothing else",
        )
    value = pairs[0][1]
    if not value.strip() or "\x00" in value:
        return Refusal("malformed", "the type is empty or holds NUL")
    if len(value.encode("utf-8")) > MAX_TYPE_BYTES:
        return Refusal("limit_exceeded", f"the type is over {MAX_TYPE_BYTES} bytes")
    return value
