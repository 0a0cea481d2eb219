"""Standard Webhooks signatures for Kafka records, as matcher verifies them.

Signed bytes: ``{webhook-id}.{webhook-timestamp}.{content}`` where content is the Kafka
value in structured mode, and in binary mode ``matcher.binary.v1``, then a netstring
(``<length>:<bytes>,``) of each of the headers ce_source, ce_id, ce_type, ce_tenant,
ce_correlationid, ce_jobid, ce_time and content-type (empty when absent), then the value.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass, replace

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from matcher_producer.event import KafkaRecord

BINARY_PREFIX = b"matcher.binary.v1"
BINARY_HEADERS = (
    "ce_source",
    "ce_id",
    "ce_type",
    "ce_tenant",
    "ce_correlationid",
    "ce_jobid",
    "ce_time",
    "content-type",
)


def _b64decode(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


@dataclass(frozen=True)
class SigningKey:
    id: str
    hmac_secret: bytes | None = None
    ed25519: Ed25519PrivateKey | None = None

    @classmethod
    def parse(cls, key_id: str, text: str) -> SigningKey:
        """``whsec_<base64>`` (HMAC secret) or ``whsk_<base64>`` (Ed25519 seed, 32 bytes,
        or the 64-byte seed + public key form)."""
        text = text.strip()
        if text.startswith("whsec_"):
            secret = _b64decode(text.removeprefix("whsec_"))
            if not secret:
                raise ValueError("empty HMAC secret")
            return cls(key_id, hmac_secret=secret)
        if text.startswith("whsk_"):
            raw = _b64decode(text.removeprefix("whsk_"))
            if len(raw) not in (32, 64):
                raise ValueError("an Ed25519 secret key holds 32 (or 64) bytes")
            return cls(key_id, ed25519=Ed25519PrivateKey.from_private_bytes(raw[:32]))
        raise ValueError("a key starts with whsec_ (HMAC) or whsk_ (Ed25519)")

    def sign(self, message: bytes) -> str:
        if self.hmac_secret is not None:
            digest = hmac.new(self.hmac_secret, message, hashlib.sha256).digest()
            return "v1," + base64.b64encode(digest).decode()
        assert self.ed25519 is not None
        return "v1a," + base64.b64encode(self.ed25519.sign(message)).decode()


def _netstring(value: bytes) -> bytes:
    return str(len(value)).encode() + b":" + value + b","


def binary_content(headers: list[tuple[str, bytes]], value: bytes) -> bytes:
    found = dict(headers)
    return (
        BINARY_PREFIX
        + b"".join(_netstring(found.get(name, b"")) for name in BINARY_HEADERS)
        + value
    )


def is_structured(headers: list[tuple[str, bytes]]) -> bool:
    """Structured mode is exactly the media type application/cloudevents+json (the
    matcher gate reads it so, and refuses ce_ headers beside it)."""
    content_type = dict(headers).get("content-type", b"")
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/cloudevents+json"


def sign_record(
    record: KafkaRecord, event_id: str, keys: list[SigningKey], timestamp: int | None = None
) -> KafkaRecord:
    """The record with webhook-id, webhook-timestamp and webhook-signature headers; one
    signature per key (sign with old and new key while rotating)."""
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    content = (
        record.value
        if is_structured(record.headers)
        else binary_content(record.headers, record.value)
    )
    message = event_id.encode() + b"." + stamp.encode() + b"." + content
    signature = " ".join(key.sign(message) for key in keys)
    headers = [h for h in record.headers if not h[0].startswith("webhook-")]
    headers += [
        ("webhook-id", event_id.encode()),
        ("webhook-timestamp", stamp.encode()),
        ("webhook-signature", signature.encode()),
    ]
    return replace(record, headers=headers)
