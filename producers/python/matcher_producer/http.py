"""CloudEvents over HTTP, signed as matcher's webhook ingress verifies them.

Build the request with any CloudEvents library (binary or structured mode), then add the
Standard Webhooks headers with ``sign_http``:

- structured mode (``content-type: application/cloudevents+json``): the signed content is
  the body, exactly as any Standard Webhooks library signs it;
- binary mode: the ingress turns each ``ce-<attr>`` header into the Kafka record's
  ``ce_<attr>`` with its value percent-decoded (CloudEvents HTTP binding, 3.1.3.2), and the
  signature covers that record's binary content (``matcher_producer.signing``): so the
  content is ``matcher.binary.v1``, then a netstring of each of the percent-decoded values
  of ce-source, ce-id, ce-type, ce-tenant, ce-correlationid, ce-jobid, ce-time and of
  content-type (empty when absent), then the body.

``webhook-id`` is the event's id in both modes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import unquote_to_bytes

from matcher_producer.event import KafkaRecord
from matcher_producer.signing import SigningKey, is_structured, sign_record

HttpHeaders = list[tuple[str, str]]


def sign_http(
    headers: Iterable[tuple[str, str]],
    body: bytes,
    keys: list[SigningKey],
    timestamp: int | None = None,
) -> HttpHeaders:
    """``headers`` (without any webhook-*) and the three Standard Webhooks headers."""
    given = [(name.lower(), value) for name, value in headers if not _is_webhook(name)]
    record_headers = [_as_kafka_header(name, value) for name, value in given]
    record = KafkaRecord(b"", record_headers, body)
    structured = is_structured(record_headers)
    event_id = _structured_id(body) if structured else dict(record_headers).get("ce_id", b"")
    if not event_id:
        raise ValueError("the event has no id (ce-id, or id in the structured body)")
    signed = sign_record(record, event_id.decode("utf-8"), keys, timestamp)
    webhook = [(n, v.decode("ascii")) for n, v in signed.headers if n.startswith("webhook-")]
    return given + webhook


def _is_webhook(name: str) -> bool:
    """A signature header already there (either spelling): replaced, not kept beside."""
    return name.lower().startswith(("webhook-", "svix-"))


def _as_kafka_header(name: str, value: str) -> tuple[str, bytes]:
    if name.startswith("ce-"):
        return "ce_" + name[3:], unquote_to_bytes(value)
    return name, value.encode("latin-1")


def _structured_id(body: bytes) -> bytes:
    document = json.loads(body)
    found = document.get("id") if isinstance(document, dict) else None
    return found.encode("utf-8") if isinstance(found, str) else b""
