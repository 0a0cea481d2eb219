"""Authentication and validation of one record: the gate before the inbox (invariants 5, 6).

Order matters: size first (before any parsing), then the signature (before revealing,
even through a reason code, what the registry allows), then tenant and type, then the
payload's JSON Schema.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from matcher.auth.registry import Registry
from matcher.auth.signatures import VerifyingKey, binary_content, signed_bytes, verify
from matcher.domain.events import CompletionEvent, Rejection

REASONS = (
    "malformed",
    "unknown_producer",
    "bad_signature",
    "expired_timestamp",
    "tenant_not_allowed",
    "type_not_allowed",
    "schema_invalid",
    "too_large",
)


@dataclass(frozen=True)
class Policy:
    require_signatures: bool = True
    timestamp_tolerance: timedelta = timedelta(minutes=5)
    max_value_bytes: int = 1024 * 1024
    max_header_bytes: int = 16 * 1024


def is_structured(headers: Mapping[str, bytes]) -> bool:
    return headers.get("content-type", b"").lower().startswith(b"application/cloudevents")


def check_size(
    headers: Mapping[str, bytes], key: bytes | None, value: bytes | None, policy: Policy
) -> Rejection | None:
    size = len(value or b"")
    if size > policy.max_value_bytes:
        return Rejection(
            "too_large", f"value is {size} bytes; the limit is {policy.max_value_bytes}"
        )
    header_size = sum(len(k) + len(v) for k, v in headers.items()) + len(key or b"")
    if header_size > policy.max_header_bytes:
        return Rejection(
            "too_large",
            f"key and headers are {header_size} bytes; the limit is {policy.max_header_bytes}",
        )
    return None


def _seen(event: CompletionEvent) -> dict[str, str]:
    return {
        "producer": event.source,
        "event_id": event.id,
        "tenant": event.tenant,
        "type": event.type,
        "correlation_id": event.correlationid,
    }


def check_event(
    event: CompletionEvent,
    headers: Mapping[str, bytes],
    value: bytes,
    registry: Registry,
    policy: Policy,
    now: datetime,
) -> Rejection | None:
    """None when ``event`` may enter the inbox; otherwise why not."""
    seen = _seen(event)
    producer = registry.producers.get(event.source)
    if producer is None and (policy.require_signatures or registry.producers):
        return Rejection("unknown_producer", f"no producer {event.source!r} is registered", seen)

    signature = headers.get("webhook-signature")
    if signature is not None or policy.require_signatures:
        if producer is None:
            return Rejection(
                "unknown_producer", f"no producer {event.source!r} is registered", seen
            )
        rejection = _check_signature(event, headers, value, producer.keys, policy, now)
        if rejection is not None:
            return Rejection(rejection.reason, rejection.detail, seen)

    if producer is not None:
        if not producer.may_speak_for(event.tenant):
            return Rejection(
                "tenant_not_allowed",
                f"producer {event.source!r} may not send events for tenant {event.tenant!r}",
                seen,
            )
        if not producer.may_send(event.type):
            return Rejection(
                "type_not_allowed",
                f"producer {event.source!r} may not send events of type {event.type!r}",
                seen,
            )

    validator = registry.schemas.get(event.type)
    if validator is not None:
        error = next(iter(validator.iter_errors(event.data)), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            return Rejection("schema_invalid", f"data at {where}: {error.message}"[:500], seen)
    return None


def _check_signature(
    event: CompletionEvent,
    headers: Mapping[str, bytes],
    value: bytes,
    keys: tuple[VerifyingKey, ...],
    policy: Policy,
    now: datetime,
) -> Rejection | None:
    webhook_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp")
    signature = headers.get("webhook-signature")
    if not (webhook_id and timestamp and signature):
        return Rejection(
            "bad_signature", "webhook-id, webhook-timestamp and webhook-signature are required"
        )
    if not hmac.compare_digest(webhook_id, event.id.encode()):
        return Rejection("bad_signature", "webhook-id differs from the CloudEvent id")
    try:
        seconds = int(timestamp)
    except ValueError:
        return Rejection("bad_signature", "webhook-timestamp is not an integer")
    skew = abs(now.timestamp() - seconds)
    if skew > policy.timestamp_tolerance.total_seconds():
        return Rejection(
            "expired_timestamp",
            f"webhook-timestamp is {skew:.0f}s from now; the tolerance is "
            f"{policy.timestamp_tolerance.total_seconds():.0f}s",
        )
    content = value if is_structured(headers) else binary_content(headers, value)
    message = signed_bytes(webhook_id, timestamp, content)
    if verify(signature.decode("ascii", "replace"), message, keys) is None:
        return Rejection("bad_signature", "no signature matches an active key of the producer")
    return None
