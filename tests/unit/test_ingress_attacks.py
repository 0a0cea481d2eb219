"""Attacks on the ingress's translation of a request (``to_record``) and what the gate
reads of it: what an unauthenticated sender on the internet can make of its headers."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from matcher.auth.gate import judge
from matcher.auth.policy import Policy
from matcher.auth.registry import Registry, parse_registry
from matcher.domain.events import CompletionEvent, Rejection
from matcher.domain.records import RawRecord
from matcher.ingress.requests import Refusal, to_record
from tests.support import webhooks as senders


@pytest.fixture(scope="module")
def registry() -> Registry:
    return parse_registry(senders.PRODUCERS_TOML, Path("."))


def _verdict(
    registry: Registry, producer: str, headers: senders.Headers, body: bytes
) -> CompletionEvent | Rejection | Refusal:
    made = to_record(registry.producers[producer], headers, body, datetime.now(UTC))
    return made if isinstance(made, Refusal) else judge(made, registry, Policy())


@pytest.mark.parametrize(
    "extra",
    [
        (b"matcher_webhook", b"stripe"),  # the sender naming another producer
        (b"matcher-webhook", b"stripe"),
        (b"ce-tenant", b"globex"),  # a CloudEvents attribute beside a plain webhook
        (b"ce_tenant", b"globex"),
        (b"webhook_signature", b"v1,AAAA"),
        (b"x_hub_signature_256", b"sha256=00"),
    ],
)
def test_a_sender_cannot_add_a_reading_to_a_signed_webhook(
    registry: Registry, extra: tuple[bytes, bytes]
) -> None:
    body = senders.body_bytes(senders.openai_batch("batch_abc"))
    headers = [*senders.standard_request(body, "msg_1"), extra]
    verdict = _verdict(registry, "openai", headers, body)
    if isinstance(verdict, CompletionEvent):  # dropped as unread: the same event
        assert (verdict.source, verdict.tenant, verdict.id) == ("openai", "acme", "msg_1")
    else:
        assert verdict.reason == "ambiguous"


def test_a_body_with_a_duplicated_key_is_refused_even_when_signed(registry: Registry) -> None:
    body = b'{"id":"evt","type":"batch.completed","data":{"id":"a","id":"b"}}'
    verdict = _verdict(registry, "openai", senders.standard_request(body, "msg_1"), body)
    assert isinstance(verdict, Rejection)
    assert verdict.reason == "ambiguous"


@pytest.mark.parametrize(
    "body",
    [
        b'{"id":"e","type":"batch.completed","data":{"id":' + b"9" * 5000 + b"}}",
        b'{"id":"e","type":"batch.completed","data":{"id":"a"},"x":' + b"[" * 100_000 + b"}",
        b'{"id":"e","type":"batch.completed","data":{"id":"\\ud800"}}',
        b'{"id":"e","type":"batch.completed","data":{"id":"a\\u0000"}}',
        # Numbers the store would hold as other numbers than the ones signed.
        b'{"id":"e","type":"batch.completed","data":{"id":"a","n":1.00000000000000000001}}',
        b'{"id":"e","type":"batch.completed","data":{"id":"a","n":1e-400}}',
    ],
)
def test_hostile_signed_bodies_are_refused_without_raising(registry: Registry, body: bytes) -> None:
    verdict = _verdict(registry, "openai", senders.standard_request(body, "msg_1"), body)
    assert isinstance(verdict, Rejection), verdict


def test_a_webhook_sent_to_a_cloudevents_producer_url_is_not_a_webhook(
    registry: Registry,
) -> None:
    body = senders.body_bytes(senders.openai_batch("batch_abc"))
    ce_producer = replace(registry.producers["openai"], source="ce-svc", webhook=None)
    made = to_record(ce_producer, senders.standard_request(body, "msg_1"), body, datetime.now(UTC))
    assert isinstance(made, RawRecord)
    assert b"matcher_webhook" not in dict(made.headers)


def test_content_types_a_sender_chooses_cannot_pin_memory(registry: Registry) -> None:
    """``media_type`` remembers up to 4096 content-type values, however long each is; the
    values are the sender's choice, up to the header bound (16 KiB), so unauthenticated
    requests can pin some 64 MiB in every ingress and daemon process for good."""
    from matcher.auth import record

    saved = dict(record._MEDIA_TYPES)
    record._MEDIA_TYPES.clear()
    try:
        producer = registry.producers["openai"]
        for i in range(4096):
            value = b"application/json; x=%d" % i + b"a" * 16_000
            to_record(producer, [(b"content-type", value)], b"{}", datetime.now(UTC))
        pinned = sum(len(k) for k in record._MEDIA_TYPES)
    finally:
        record._MEDIA_TYPES.clear()
        record._MEDIA_TYPES.update(saved)
    assert pinned <= 1024 * 1024, f"{pinned / 2**20:.0f} MiB of content-type values remembered"
