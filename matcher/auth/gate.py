"""The gate: one record in, an accepted event or a rejection with a reason out.

The only place that decides trust (invariants 5 and 6), and transport-independent: the
Kafka consumer and the HTTP ingress hand it the same ``RawRecord``. Order matters:

1. bounds first, before any parsing (sizes, header count);
2. one canonical reading (``matcher.auth.record``): anything ambiguous is refused;
3. the signature over exactly the bytes that reading used, fresh against the record's
   arrival (never against the time it is processed: a backlog must not expire events);
4. only then what the registry allows (tenant, type), so a reason code reveals nothing
   about the registry to an unauthenticated sender;
5. the payload's JSON Schema.

Nothing here raises on bad input: every failure is a ``Rejection``.
"""

from __future__ import annotations

import hmac
import re
from datetime import UTC
from typing import Any

from pydantic import ValidationError

from matcher.auth.policy import Policy
from matcher.auth.record import Claim, View, claim, read_view
from matcher.auth.registry import Producer, Registry, Webhook
from matcher.auth.signatures import (
    TooManySignatures,
    binary_content,
    offered_signatures,
    signed_bytes,
    verify,
)
from matcher.auth.strict_json import JsonRefused, loads
from matcher.auth.times import parse_time
from matcher.auth.webhooks import (
    GITHUB_SIGNATURE,
    STRIPE_SIGNATURE,
    BadStripeHeader,
    Unmappable,
    dropped_by,
    github_signature_ok,
    stripe_parts,
    stripe_signature_ok,
)
from matcher.domain.events import (
    DATA_READ_STRICTLY,
    CompletionEvent,
    Dropped,
    Rejection,
    seen_attributes,
)
from matcher.domain.records import RawRecord

_UNIX_SECONDS = re.compile(rb"[0-9]{1,12}")
# No header name is anywhere near this; a bound keeps the look-alike check cheap.
MAX_HEADER_NAME_BYTES = 256


def judge(record: RawRecord, registry: Registry, policy: Policy) -> CompletionEvent | Rejection:
    """Whether ``record`` may enter the inbox, and as which event.

    The signature is checked against the record's cheap claim (its mode, headers and
    claimed source and id) before the strict reading walks any JSON, so a sender without
    a key costs a hash, not a parse.
    """
    claimed = _claim(record, policy)
    if isinstance(claimed, Rejection):
        return claimed
    producer = registry.producers.get(claimed.source)
    if claimed.webhook:
        return _judge_webhook(record, claimed, producer, registry, policy)
    if producer is not None and producer.webhook is not None:
        return claimed.partial.reject(
            "unknown_producer", f"{claimed.source!r} sends plain webhooks, not CloudEvents"
        )
    # Unsigned events pass only where the operator allowed them and named no producers; a
    # registered producer always signs, and a signature that is present is always checked.
    signed = b"webhook-signature" in claimed.reserved
    if producer is None:
        if policy.require_signatures or registry.producers or signed:
            return claimed.partial.reject(
                "unknown_producer", f"no producer {claimed.source!r} is registered"
            )
    else:
        refused = _check_signature(record, claimed, producer, policy)
        if refused is not None:
            return claimed.partial.reject(refused.reason, refused.detail)
    read = _read(record, policy, claimed)
    if isinstance(read, Rejection):
        return read
    if (read.source, read.id) != (claimed.source, claimed.id):
        return claimed.partial.reject("ambiguous", "the strict reading differs from the claim")
    refused = _check_allowed(read, producer, registry)
    return read if refused is None else refused


def read(record: RawRecord, policy: Policy) -> CompletionEvent | Rejection:
    """The event ``record`` would be, trusted or not (for tools and the benchmark; the
    daemon calls ``judge``)."""
    claimed = _claim(record, policy)
    return claimed if isinstance(claimed, Rejection) else _read(record, policy, claimed)


def _claim(record: RawRecord, policy: Policy) -> Claim | Rejection:
    too_big = _check_bounds(record, policy)
    return too_big if too_big is not None else claim(record)


def _read(record: RawRecord, policy: Policy, claimed: Claim) -> CompletionEvent | Rejection:
    view = read_view(record, policy.max_json_depth, claimed)
    return view if isinstance(view, Rejection) else _event(view)


def _check_bounds(record: RawRecord, policy: Policy) -> Rejection | None:
    size = len(record.value or b"")
    if size > policy.max_value_bytes:
        return Rejection(
            "too_large", f"value is {size} bytes; the limit is {policy.max_value_bytes}"
        )
    if len(record.headers) > policy.max_headers:
        return Rejection(
            "limit_exceeded",
            f"{len(record.headers)} headers; the limit is {policy.max_headers}",
        )
    header_size = len(record.key or b"")
    for name, value in record.headers:  # one pass: this runs for every record
        if len(name) > MAX_HEADER_NAME_BYTES:
            return Rejection(
                "limit_exceeded", f"a header name is longer than {MAX_HEADER_NAME_BYTES} bytes"
            )
        header_size += len(name) + (len(value) if value else 0)
    if header_size > policy.max_header_bytes:
        return Rejection(
            "too_large",
            f"key and headers are {header_size} bytes; the limit is {policy.max_header_bytes}",
        )
    return None


def _event(view: View) -> CompletionEvent | Rejection:
    attributes = view.attributes
    when = None
    if "time" in attributes:
        when = parse_time(attributes["time"])
        if when is None:
            return Rejection("malformed", "time must be an RFC 3339 date-time with an offset")
    try:
        return CompletionEvent.model_validate(
            {
                "specversion": attributes["specversion"],
                "id": attributes["id"],
                "source": attributes["source"],
                "type": attributes["type"],
                "tenant": attributes["tenant"],
                "correlationid": attributes["correlationid"],
                "jobid": attributes.get("jobid"),
                "time": when,
                "datacontenttype": view.datacontenttype,
                "data": view.data,
            },
            # The data was read strictly already: validating it again would walk it twice.
            context={DATA_READ_STRICTLY: True},
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'event'}: "
            + str(e["msg"]).removeprefix("Value error, ")
            for e in exc.errors()
        )
        return Rejection("malformed", problems[:500])


def _check_signature(
    record: RawRecord, claimed: Claim, producer: Producer, policy: Policy
) -> Rejection | None:
    value = record.value or b""
    content = value if claimed.structured else binary_content(claimed.reserved, value)
    return _standard_signature(record, claimed, producer, policy, content, claimed.id)


def _standard_signature(
    record: RawRecord,
    claimed: Claim,
    producer: Producer,
    policy: Policy,
    content: bytes,
    event_id: str | None,
) -> Rejection | None:
    """Standard Webhooks over ``content``; ``event_id``: what webhook-id must equal."""
    webhook_id = claimed.reserved.get(b"webhook-id")
    timestamp = claimed.reserved.get(b"webhook-timestamp")
    signature = claimed.reserved.get(b"webhook-signature")
    if not (webhook_id and timestamp and signature):
        return Rejection(
            "bad_signature", "webhook-id, webhook-timestamp and webhook-signature are required"
        )
    if event_id is not None and not hmac.compare_digest(webhook_id, event_id.encode()):
        return Rejection("bad_signature", "webhook-id differs from the CloudEvent id")
    stale = _stale(timestamp, "webhook-timestamp", record, policy)
    if stale is not None:
        return stale
    try:
        offered = offered_signatures(signature, policy.max_signatures)
    except TooManySignatures as exc:
        return Rejection("limit_exceeded", str(exc))
    if verify(offered, signed_bytes(webhook_id, timestamp, content), producer.keys) is None:
        return Rejection("bad_signature", "no signature matches an active key of the producer")
    return None


def _stale(timestamp: bytes, name: str, record: RawRecord, policy: Policy) -> Rejection | None:
    """Whether a signed timestamp is malformed or outside the tolerance of the arrival."""
    if not _UNIX_SECONDS.fullmatch(timestamp):
        return Rejection("bad_signature", f"{name} must be Unix seconds (1-12 digits)")
    arrived = record.arrived_at.astimezone(UTC).timestamp()
    skew = abs(arrived - int(timestamp))
    tolerance = policy.timestamp_tolerance.total_seconds()
    if skew > tolerance:
        return Rejection(
            "expired_timestamp",
            f"{name} is {skew:.0f}s from the record's arrival; the tolerance is {tolerance:.0f}s",
        )
    return None


def stale_at(record: RawRecord, producer: Producer, policy: Policy) -> Rejection | None:
    """Whether ``record``, which ``judge`` accepted for ``producer``, is outside the
    timestamp tolerance of ``record.arrived_at``. The ingress asks it with the broker's
    append time once Kafka acknowledged the record: the arrival the daemon will judge it
    by, so that a slow body accepted at the edge is refused there rather than answered
    202 and then quarantined (invariant 12)."""
    claimed = claim(record)
    if isinstance(claimed, Rejection):
        return claimed
    scheme = producer.webhook.scheme if producer.webhook is not None else "standard-webhooks"
    if scheme == "github":
        return None  # GitHub signs no time
    if scheme == "stripe":
        header = claimed.reserved.get(STRIPE_SIGNATURE)
        if header is None:
            return None
        try:
            timestamp, _ = stripe_parts(header, policy.max_signatures)
        except BadStripeHeader as exc:
            return Rejection("bad_signature", str(exc))
        return _stale(timestamp, "stripe-signature t", record, policy)
    stamp = claimed.reserved.get(b"webhook-timestamp")
    return None if stamp is None else _stale(stamp, "webhook-timestamp", record, policy)


def _judge_webhook(
    record: RawRecord,
    claimed: Claim,
    producer: Producer | None,
    registry: Registry,
    policy: Policy,
) -> CompletionEvent | Rejection:
    """A forwarded plain webhook: its scheme's signature, then its mapping."""
    if producer is None or producer.webhook is None:
        return claimed.partial.reject(
            "unknown_producer", f"no webhook producer {claimed.source!r} is registered"
        )
    refused = _check_webhook_signature(record, claimed, producer, producer.webhook, policy)
    if refused is not None:
        return claimed.partial.reject(refused.reason, refused.detail)
    try:
        body = loads(record.value or b"", max_depth=policy.max_json_depth)
    except JsonRefused as exc:
        return claimed.partial.reject(exc.reason, f"body: {exc}")
    rule = dropped_by(producer.webhook.drop, body, claimed.reserved)
    if rule is not None:
        seen = claimed.partial.reject("dropped", "").seen
        return Dropped("dropped", f"drop rule {rule!r} matched", seen, rule=rule)
    event = _map_webhook(body, claimed, producer.webhook)
    if isinstance(event, Rejection):
        return event
    refused = _check_allowed(event, producer, registry)
    return event if refused is None else refused


def _check_webhook_signature(
    record: RawRecord, claimed: Claim, producer: Producer, webhook: Webhook, policy: Policy
) -> Rejection | None:
    body = record.value or b""
    if webhook.scheme == "standard-webhooks":
        return _standard_signature(record, claimed, producer, policy, body, None)
    secrets = tuple(k.hmac_secret for k in producer.keys if k.hmac_secret is not None)
    if webhook.scheme == "github":
        header = claimed.reserved.get(GITHUB_SIGNATURE)
        if header is None:
            return Rejection("bad_signature", "x-hub-signature-256 is required")
        if not github_signature_ok(header, body, secrets):
            return Rejection("bad_signature", "x-hub-signature-256 matches no key of the producer")
        return None
    header = claimed.reserved.get(STRIPE_SIGNATURE)
    if header is None:
        return Rejection("bad_signature", "stripe-signature is required")
    try:
        timestamp, offered = stripe_parts(header, policy.max_signatures)
    except BadStripeHeader as exc:
        return Rejection("bad_signature", str(exc))
    stale = _stale(timestamp, "stripe-signature t", record, policy)
    if stale is not None:
        return stale
    if not stripe_signature_ok(timestamp, offered, body, secrets):
        return Rejection("bad_signature", "stripe-signature matches no key of the producer")
    return None


def _map_webhook(body: Any, claimed: Claim, webhook: Webhook) -> CompletionEvent | Rejection:
    try:
        mapped = webhook.mapping.apply(body, claimed.reserved)
    except Unmappable as exc:
        return claimed.partial.reject("unmappable", str(exc)[:500])
    attributes = {**mapped, "specversion": "1.0", "source": claimed.source}
    return _event(View(False, claimed.reserved, attributes, body, claimed.media_type))


def _check_allowed(
    event: CompletionEvent, producer: Producer | None, registry: Registry
) -> Rejection | None:
    if producer is not None:
        if not producer.may_speak_for(event.tenant):
            return Rejection(
                "tenant_not_allowed",
                f"producer {event.source!r} may not send events for tenant {event.tenant!r}",
                seen_attributes(event),
            )
        if not producer.may_send(event.type):
            return Rejection(
                "type_not_allowed",
                f"producer {event.source!r} may not send events of type {event.type!r}",
                seen_attributes(event),
            )
    validator = registry.schemas.get(event.type)
    if validator is not None:
        error = next(iter(validator.iter_errors(event.data)), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            detail = f"data at {where}: {error.message}"[:500]
            return Rejection("schema_invalid", detail, seen_attributes(event))
    return None
