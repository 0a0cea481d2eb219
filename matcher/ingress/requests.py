"""An HTTP webhook request as the record the gate judges and the events topic receives.

Pure: headers and body in, a ``RawRecord`` (or a refusal with its status) out. The
record is what the daemon's gate will judge again, so the ingress and the daemon agree by
construction, and trust nothing in between:

- a CloudEvents producer's request becomes the Kafka binding of the same event: binary
  mode's ``ce-<attr>`` headers become ``ce_<attr>`` (values percent-decoded, as the
  CloudEvents HTTP binding says), structured mode's body goes as it is; ``content-type``
  and the ``webhook-*`` signature headers are copied;
- a plain-webhook producer's request keeps its body bytes and its scheme's signature
  headers, and gains ``matcher_webhook: <producer>``; GitHub's unsigned
  ``x-github-delivery`` and ``x-github-event`` go along for operators to read (the gate
  does not);
- Svix's spelling of the signature headers (``svix-id``, ``svix-timestamp``,
  ``svix-signature``) goes as ``webhook-*`` (``svix_respelled``);
- a W3C ``traceparent`` goes along too, for the trace from the sender to the resumed run
  (never judged, never authority).

Every other header is dropped. An HTTP header that another hop could take for one of
these (``ce_id``, ``webhook_signature``: proxies differ on underscores) is refused as
ambiguous, and so is a header the gate reads given twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import unquote_to_bytes

from matcher.auth.record import (
    CONTENT_TYPE,
    STRUCTURED_MEDIA_TYPE,
    WEBHOOK_HEADERS,
    folds,
    is_json_media_type,
    media_type,
)
from matcher.auth.registry import Producer
from matcher.auth.strict_json import JsonRefused, loads
from matcher.auth.webhooks import (
    GITHUB_SIGNATURE,
    STRIPE_SIGNATURE,
    WEBHOOK_HEADER,
    Unmappable,
)
from matcher.domain.events import Rejection, summary_storable
from matcher.domain.records import Header, RawRecord

# HTTP status per reason: what senders' retry machinery understands (4xx: do not retry
# as it is; 503: retry later).
STATUS = {
    "malformed": 400,
    "unmappable": 400,
    "ambiguous": 400,
    "undecodable": 400,
    "limit_exceeded": 400,
    "schema_invalid": 400,
    "bad_signature": 401,
    "expired_timestamp": 401,
    "unknown_producer": 401,  # the body names a source without a key here
    "tenant_not_allowed": 403,
    "type_not_allowed": 403,
    "too_large": 413,
    "unsupported_media_type": 415,
    "timeout": 408,
    "overloaded": 503,
    "kafka_unavailable": 503,
    # Callbacks (matcher.ingress.callbacks): the token is unknown, the route is off, the
    # wait took its event already or is past taking one, or the database is away.
    "unknown_callback": 404,
    "callbacks_disabled": 501,
    "duplicate": 409,
    "resolved": 409,
    "late": 410,
    "busy": 503,
    "database_unavailable": 503,
}

_CE_HTTP_PREFIX = b"ce-"
_SVIX_SPELLING = {
    b"svix-id": b"webhook-id",
    b"svix-timestamp": b"webhook-timestamp",
    b"svix-signature": b"webhook-signature",
}
# Read by operators (GitHub's), or kept beside the event, never judged: the W3C trace
# context (matcher.domain.trace_context).
_INFORMATIONAL = (b"x-github-delivery", b"x-github-event", b"traceparent")
_COPIED = frozenset({CONTENT_TYPE, *WEBHOOK_HEADERS, GITHUB_SIGNATURE, STRIPE_SIGNATURE})
# What an underscore spelling could be taken for by a proxy that maps '_' to '-'.
_READ_FOLDED = frozenset(
    n.decode().replace("-", "_")
    for n in (*_COPIED, WEBHOOK_HEADER, *_INFORMATIONAL, *_SVIX_SPELLING)
)
_PERCENT = re.compile(rb"%(?![0-9A-Fa-f]{2})")


@dataclass(frozen=True)
class Refusal:
    """A request refused before or by the gate. ``detail`` is for the log only: a
    response carries the reason code and nothing of the input."""

    reason: str
    detail: str
    seen: dict[str, str] = field(default_factory=dict)  # the gate's reading, unverified
    # What the answer and the refusal record say instead of the detail, when the detail
    # quotes what an unauthenticated sender sent.
    told: str | None = None

    @property
    def status(self) -> int:
        return STATUS[self.reason]


def refusal(rejection: Rejection) -> Refusal:
    return Refusal(rejection.reason, rejection.detail, rejection.seen)


# A refusal record's claims, by the names of the gate's reading (Rejection.seen).
_CLAIMED = {"event_id": "id", "type": "type", "tenant": "tenant", "correlation_id": "correlationid"}
_GUESS_MAX_DEPTH = 64


def claims_of(
    producer: Producer | None, refused: Refusal, headers: list[tuple[bytes, bytes]], body: bytes
) -> dict[str, str]:
    """What a refused delivery claimed, for its record: the gate's reading where it got
    that far; else, for a plain-webhook producer, its mapping applied to the unverified
    body, field by field (what fails is left out). Never trusted, never a verdict."""
    claims = {name: refused.seen[name] for name in _CLAIMED if name in refused.seen}
    webhook = producer.webhook if producer is not None else None
    if webhook is None or "correlation_id" in claims or not body:
        return claims
    try:
        document = loads(body, max_depth=_GUESS_MAX_DEPTH)
    except JsonRefused:
        return claims
    respelled = svix_respelled(headers)
    named = dict(headers if isinstance(respelled, Refusal) else respelled)
    for name, attribute in _CLAIMED.items():
        template = webhook.mapping.fields.get(attribute)
        if name in claims or template is None:
            continue
        try:
            value = template.render(document, named)
        except (Unmappable, UnicodeDecodeError):
            continue
        if value and summary_storable(value):
            claims[name] = value[:512]
    return claims


def to_record(
    producer: Producer,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    arrived_at: datetime,
) -> RawRecord | Refusal:
    """The record for ``producer``'s request (header names lowercase, as ASGI gives them)."""
    kind = _content_type(producer, headers)
    if isinstance(kind, Refusal):
        return kind
    respelled = svix_respelled(headers)
    if isinstance(respelled, Refusal):
        return respelled
    headers = respelled
    forwarded: list[Header] = []
    if producer.webhook is not None:
        forwarded.append((WEBHOOK_HEADER, producer.source.encode()))
    for name, value in headers:
        header = _forwarded_header(name, value, cloudevents=producer.webhook is None)
        if isinstance(header, Refusal):
            return header
        if header is not None:
            forwarded.append(header)
    return RawRecord(None, tuple(forwarded), body, arrived_at)


def svix_respelled(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]] | Refusal:
    """Svix's own spelling of the Standard Webhooks headers (``svix-id``, ``svix-timestamp``,
    ``svix-signature``: what Svix-based senders send, often beside the ``webhook-*`` ones)
    as ``webhook-*``, the one spelling the topic carries. Given both ways, a header's two
    values must be the same bytes; else the request is ambiguous (which did the sender
    sign?)."""
    given = {name: value for name, value in headers if name in _SVIX_SPELLING.values()}
    out: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        standard = _SVIX_SPELLING.get(name)
        if standard is None:
            out.append((name, value))
        elif standard not in given:
            out.append((standard, value))
        elif given[standard] != value:
            return Refusal(
                "ambiguous",
                f"{name.decode()} and {standard.decode()} differ: send one spelling, or the "
                "same value in both",
            )
    return out


def _content_type(producer: Producer, headers: list[tuple[bytes, bytes]]) -> str | Refusal:
    given = [value for name, value in headers if name == CONTENT_TYPE]
    if len(given) != 1:
        return Refusal(
            "unsupported_media_type" if not given else "ambiguous",
            "content-type is missing" if not given else "content-type appears twice",
        )
    kind = media_type(given[0])
    accepted = "the body must be JSON: content-type application/json" + (
        " or application/cloudevents+json" if producer.webhook is None else ""
    )
    if isinstance(kind, Rejection):
        return Refusal("unsupported_media_type", kind.detail, told=accepted)
    if is_json_media_type(kind) or (producer.webhook is None and kind == STRUCTURED_MEDIA_TYPE):
        return kind
    if kind == "application/x-www-form-urlencoded":
        accepted += " (GitHub: set the webhook's content type to application/json)"
    return Refusal("unsupported_media_type", f"{kind} is not accepted", told=accepted)


def _forwarded_header(name: bytes, value: bytes, *, cloudevents: bool) -> Header | Refusal | None:
    if name.startswith(_CE_HTTP_PREFIX):
        decoded = _percent_decoded(value)
        if isinstance(decoded, Refusal):
            return decoded
        # The gate refuses ce_ headers beside a plain webhook (ambiguous): they go along.
        return b"ce_" + name[3:], decoded if cloudevents else value
    if name in _COPIED or name in _INFORMATIONAL:
        return name, value
    if b"_" in name and _lookalike(name):
        return Refusal("ambiguous", "a header name with '_' stands for one matcher reads")
    return None


def _lookalike(name: bytes) -> bool:
    try:
        text = name.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return any(f in _READ_FOLDED or f.startswith("ce_") for f in folds(text))


def _percent_decoded(value: bytes) -> bytes | Refusal:
    """A ``ce-`` header's value, percent-decoded (CloudEvents HTTP binding, 3.1.3.2)."""
    if b"%" not in value:
        return value
    if _PERCENT.search(value):
        return Refusal("malformed", "a ce- header has a '%' that is not a %XX escape")
    decoded = unquote_to_bytes(value)
    try:
        decoded.decode("utf-8")
    except UnicodeDecodeError:
        return Refusal("malformed", "a ce- header does not decode to UTF-8")
    return decoded
