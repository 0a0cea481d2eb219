"""Signatures: the published vectors, both implementations, an independent library, and
the verifier's refusals."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.exceptions import InvalidSignature
from matcher_producer import CompletionEvent as ProducerEvent
from matcher_producer import SigningKey, binary_content, encode, sign_record
from standardwebhooks import Webhook

from matcher.auth.gate import judge, stale_at
from matcher.auth.policy import Policy
from matcher.auth.registry import Registry, RegistryError, parse_registry
from matcher.auth.signatures import (
    MAX_ASYMMETRIC_SIGNATURES,
    MAX_KEYS_PER_PRODUCER,
    VerifyingKey,
    signed_bytes,
    verify,
)
from matcher.auth.signatures import binary_content as daemon_binary_content
from matcher.domain.events import REASONS, CompletionEvent, Rejection
from matcher.wire_schemas import generate
from tests.support.records import parse_record, raw

SCHEMAS = Path(__file__).parents[2] / "schemas"
VECTORS: list[dict[str, Any]] = json.loads((SCHEMAS / "signature-vectors.json").read_text())[
    "cases"
]


def inspect_record(
    headers: Any,
    key: bytes | None,
    value: bytes | None,
    registry: Registry,
    policy: Policy,
    at: datetime,
) -> CompletionEvent | Rejection:
    """The gate's verdict on a record that reached the broker at ``at``."""
    return parse_record(headers, key, value, policy=policy, registry=registry, arrived_at=at)


def _registry(key: str, tenants: str = '["acme"]', types: str = '["job.completed"]') -> Registry:
    field = "hmac_secret" if key.startswith("whsec_") else "ed25519_public_key"
    return parse_registry(
        f"""
        [producers."billing-svc"]
        tenants = {tenants}
        types = {types}
        [[producers."billing-svc".keys]]
        id = "k1"
        {field} = "{key}"
        """,
        Path("."),
    )


def _at(case: dict[str, Any]) -> datetime:
    return datetime.fromtimestamp(int(case["webhook_timestamp"]), UTC)


def _signed_headers(case: dict[str, Any]) -> list[tuple[str, bytes]]:
    return [(k, v.encode()) for k, v in case["headers"]] + [
        ("webhook-id", case["webhook_id"].encode()),
        ("webhook-timestamp", case["webhook_timestamp"].encode()),
        ("webhook-signature", case["webhook_signature"].encode()),
    ]


def test_checked_in_schemas_and_vectors_are_current() -> None:
    for name, text in generate().items():
        path = SCHEMAS / name
        assert path.exists(), f"schemas/{name} is missing: run `make schemas`"
        assert path.read_text() == text, f"schemas/{name} is stale: run `make schemas`"


@pytest.mark.parametrize("case", VECTORS, ids=[c["name"] for c in VECTORS])
def test_daemon_accepts_every_vector(case: dict[str, Any]) -> None:
    parsed = inspect_record(
        _signed_headers(case),
        case["kafka_key_utf8"].encode(),
        case["value_utf8"].encode(),
        _registry(case["verifying_key"]),
        Policy(),
        _at(case),
    )
    assert isinstance(parsed, CompletionEvent), parsed


@pytest.mark.parametrize("case", VECTORS, ids=[c["name"] for c in VECTORS])
def test_both_implementations_build_the_vector_bytes(case: dict[str, Any]) -> None:
    headers = [(k, v.encode()) for k, v in case["headers"]]
    value = case["value_utf8"].encode()
    expected = base64.b64decode(case["signed_bytes_base64"])
    if case["mode"] == "binary":
        daemon = daemon_binary_content({k.encode(): v for k, v in headers}, value)
        producer = binary_content(headers, value)
    else:
        daemon = producer = value
    prefix = case["webhook_id"].encode(), case["webhook_timestamp"].encode()
    assert signed_bytes(*prefix, daemon) == expected
    assert signed_bytes(*prefix, producer) == expected
    key = SigningKey.parse("k1", case["signing_key"])
    assert key.sign(expected) == case["webhook_signature"]


def test_an_independent_standard_webhooks_library_signs_for_us() -> None:
    secret = "whsec_" + base64.b64encode(b"independent-secret-32-bytes-long").decode()
    event = ProducerEvent(
        source="billing-svc", type="job.completed", tenant="acme", correlation_id="c", data=[1]
    )
    record = encode(event, structured=True)
    now = datetime.now(UTC)
    signature = Webhook(secret).sign(event.id, now, record.value.decode())
    headers = [
        *record.headers,
        ("webhook-id", event.id.encode()),
        ("webhook-timestamp", str(int(now.timestamp())).encode()),
        ("webhook-signature", signature.encode()),
    ]
    parsed = inspect_record(headers, record.key, record.value, _registry(secret), Policy(), now)
    assert isinstance(parsed, CompletionEvent)
    # And the other way round: the library verifies what the producer SDK signs.
    signed = sign_record(record, event.id, [SigningKey.parse("k", secret)])
    Webhook(secret).verify(signed.value, {k: v.decode() for k, v in signed.headers})


def _reason(case: dict[str, Any], **changes: Any) -> str | None:
    headers = dict(_signed_headers(case))
    for name, value in changes.pop("headers", {}).items():
        if value is None:
            headers.pop(name, None)
        else:
            headers[name] = value
    registry = changes.pop("registry", _registry(case["verifying_key"]))
    now = changes.pop("now", _at(case))
    value = changes.pop("value", case["value_utf8"].encode())
    parsed = inspect_record(list(headers.items()), None, value, registry, Policy(), now)
    return parsed.reason if isinstance(parsed, Rejection) else None


BINARY = next(c for c in VECTORS if c["name"] == "binary-hmac-sha256")
STRUCTURED_ED = next(c for c in VECTORS if c["name"] == "structured-ed25519")


@pytest.mark.parametrize("case", [BINARY, STRUCTURED_ED], ids=["binary", "structured"])
def test_every_signed_part_is_covered(case: dict[str, Any]) -> None:
    assert _reason(case) is None
    assert _reason(case, value=case["value_utf8"].encode().replace(b"1200", b"1201")) == (
        "bad_signature"
    )
    if case["mode"] == "binary":
        for header in ("ce_tenant", "ce_correlationid", "ce_type", "ce_jobid", "ce_source"):
            expected = "unknown_producer" if header == "ce_source" else "bad_signature"
            assert _reason(case, headers={header: b"tampered"}) == expected, header
        assert _reason(case, headers={"ce_time": b"2025-12-31T23:59:31Z"}) == "bad_signature"
    assert _reason(case, headers={"webhook-timestamp": b"1767225601"}, now=_at(case)) == (
        "bad_signature"
    )
    assert _reason(case, headers={"webhook-id": b"other"}) == "bad_signature"
    assert _reason(case, headers={"webhook-signature": None}) == "bad_signature"
    assert _reason(case, headers={"webhook-signature": b"v1,!!!! v1a,"}) == "bad_signature"


def test_timestamp_tolerance_both_ways() -> None:
    at = _at(BINARY)
    assert _reason(BINARY, now=at + timedelta(minutes=4, seconds=59)) is None
    assert _reason(BINARY, now=at + timedelta(minutes=5, seconds=1)) == "expired_timestamp"
    assert _reason(BINARY, now=at - timedelta(minutes=5, seconds=1)) == "expired_timestamp"


def test_authorisation_after_authentication() -> None:
    key = BINARY["verifying_key"]
    assert _reason(BINARY, registry=_registry(key, tenants='["globex"]')) == "tenant_not_allowed"
    assert _reason(BINARY, registry=_registry(key, types='["job.failed"]')) == "type_not_allowed"
    assert _reason(BINARY, registry=_registry(key, tenants='["*"]', types='["*"]')) is None
    other = "whsec_" + base64.b64encode(b"x" * 32).decode()
    # A producer of another name with a valid key of its own: still unknown here.
    assert _reason(BINARY, registry=parse_registry("", Path("."))) == "unknown_producer"
    # A wrong key and a forbidden tenant: the signature is judged first.
    assert _reason(BINARY, registry=_registry(other, tenants='["globex"]')) == "bad_signature"


def test_rotation_old_and_new_keys_then_retirement() -> None:
    old = BINARY["verifying_key"]
    new = "whsec_" + base64.b64encode(b"n" * 32).decode()
    both = parse_registry(
        f"""
        [producers."billing-svc"]
        tenants = ["acme"]
        types = ["job.completed"]
        keys = [{{ id = "old", hmac_secret = "{old}" }}, {{ id = "new", hmac_secret = "{new}" }}]
        """,
        Path("."),
    )
    assert _reason(BINARY, registry=both) is None  # signed with the old key
    # A new event signed with the new key, while both are listed.
    event = ProducerEvent(
        source="billing-svc", type="job.completed", tenant="acme", correlation_id="c"
    )
    signed = sign_record(encode(event), event.id, [SigningKey.parse("new", new)])
    now = datetime.fromtimestamp(int(dict(signed.headers)["webhook-timestamp"]), UTC)
    assert isinstance(
        inspect_record(signed.headers, None, signed.value, both, Policy(), now), CompletionEvent
    )
    retired = _registry(new)  # the old key removed
    assert _reason(BINARY, registry=retired) == "bad_signature"
    assert isinstance(
        inspect_record(signed.headers, None, signed.value, retired, Policy(), now),
        CompletionEvent,
    )


def test_unsigned_policy() -> None:
    event = ProducerEvent(source="dev", type="t", tenant="acme", correlation_id="c")
    record = encode(event)
    now = datetime.now(UTC)
    lenient = Policy(require_signatures=False)
    empty = parse_registry("", Path("."))
    assert isinstance(
        inspect_record(record.headers, None, record.value, empty, lenient, now), CompletionEvent
    )
    strict = inspect_record(record.headers, None, record.value, empty, Policy(), now)
    assert isinstance(strict, Rejection)
    assert strict.reason == "unknown_producer"
    # With a producers file, a registered producer signs even where unsigned events are
    # allowed: otherwise anyone could speak for it.
    key = "whsec_" + base64.b64encode(b"d" * 32).decode()
    named = parse_registry(
        f'[producers.dev]\ntenants = ["*"]\ntypes = ["*"]\n'
        f'[[producers.dev.keys]]\nid = "k"\nhmac_secret = "{key}"\n',
        Path("."),
    )
    unsigned = inspect_record(record.headers, None, record.value, named, lenient, now)
    assert isinstance(unsigned, Rejection)
    assert unsigned.reason == "bad_signature"


def test_size_limits() -> None:
    policy = Policy(max_value_bytes=100, max_header_bytes=200)
    big = inspect_record([], None, b"x" * 101, Registry(), policy, datetime.now(UTC))
    assert isinstance(big, Rejection)
    assert big.reason == "too_large"
    many = inspect_record([("h", b"y" * 300)], None, b"{}", Registry(), policy, datetime.now(UTC))
    assert isinstance(many, Rejection)
    assert many.reason == "too_large"


def test_signatures_per_record_are_bounded() -> None:
    valid = BINARY["webhook_signature"].encode()
    junk = b"v1a," + base64.b64encode(b"\0" * 64)
    eight = b" ".join([junk] * 7 + [valid])
    assert _reason(BINARY, headers={"webhook-signature": eight}) is None
    nine = b" ".join([junk] * 8 + [valid])
    assert _reason(BINARY, headers={"webhook-signature": nine}) == "limit_exceeded"
    many = b" ".join([junk] * 170)
    assert _reason(BINARY, headers={"webhook-signature": many}) == "limit_exceeded"


@pytest.mark.parametrize(
    "stamp",
    [b"9" * 400, b"+1767225600", b" 1767225600", "\uff11\uff17\uff16\uff17".encode(), b"-1", b""],
)
def test_webhook_timestamp_is_plain_unix_seconds(stamp: bytes) -> None:
    assert _reason(BINARY, headers={"webhook-timestamp": stamp}) in ("bad_signature", "malformed")


def test_freshness_is_judged_against_arrival_not_reading() -> None:
    """A record that arrived in time stays valid however late it is read (a backlog)."""
    arrived = _at(BINARY) + timedelta(seconds=30)
    assert _reason(BINARY, now=arrived) is None


def test_freshness_again_at_the_brokers_append_time() -> None:
    """The ingress accepts at the body's arrival and asks again with the broker's append
    time, the arrival the daemon will judge by: past the tolerance there, it refuses."""
    registry = _registry(BINARY["verifying_key"])
    producer = registry.producers["billing-svc"]
    tolerance = Policy().timestamp_tolerance
    record = raw(_signed_headers(BINARY), None, BINARY["value_utf8"].encode(), _at(BINARY))
    assert isinstance(judge(record, registry, Policy()), CompletionEvent)
    inside = replace(record, arrived_at=_at(BINARY) + tolerance)
    assert stale_at(inside, producer, Policy()) is None
    outside = replace(record, arrived_at=_at(BINARY) + tolerance + timedelta(seconds=1))
    refused = stale_at(outside, producer, Policy())
    assert refused is not None
    assert refused.reason == "expired_timestamp"


def test_every_reason_code_is_documented() -> None:
    page = (Path(__file__).parents[2] / "docs" / "producers" / "authentication.md").read_text()
    table = page[page.index("| reason | what it means |") :].split("\n\n", 1)[0]
    documented = {code for line in table.splitlines()[2:] for code in _codes(line)}
    assert documented == set(REASONS)


def _codes(line: str) -> list[str]:
    first = line.split("|")[1]
    return [part.strip().strip("`") for part in first.split(",")]


def test_a_claimed_id_that_cannot_be_encoded_is_refused_not_raised() -> None:
    """Structured mode: the claimed id is read before the signature is checked, and a lone
    surrogate escape in it could not be compared with webhook-id (found by the fuzzer)."""
    value = STRUCTURED_ED["value_utf8"].replace('"evt-0001"', '"\\udc00"').encode()
    headers = {**dict(_signed_headers(STRUCTURED_ED)), "webhook-id": b"x"}
    assert _reason(STRUCTURED_ED, value=value, headers=headers) == "malformed"


class _CountingKey:
    """An Ed25519 public key that counts its verifications (and verifies nothing)."""

    calls = 0

    def verify(self, signature: bytes, message: bytes) -> None:
        _CountingKey.calls += 1
        raise InvalidSignature


@pytest.mark.parametrize("keys", [1, 2, 4])
@pytest.mark.parametrize("entries", [1, 4, 8, 100])
def test_refusing_a_record_costs_a_bounded_number_of_verifications(keys: int, entries: int) -> None:
    # Once every entry was tried against every key: 8 crafted entries against a producer
    # with 32 keys cost 256 Ed25519 verifications (45 ms) per keyless record.
    counting = [
        VerifyingKey(f"k{n}", ed25519_public_key=_CountingKey())  # type: ignore[arg-type]
        for n in range(keys)
    ]
    offered = [(b"v1a", bytes([n % 256]) * 64) for n in range(entries)]
    _CountingKey.calls = 0
    assert verify(offered, b"message", counting) is None
    assert _CountingKey.calls == min(entries, MAX_ASYMMETRIC_SIGNATURES) * keys
    assert _CountingKey.calls <= MAX_ASYMMETRIC_SIGNATURES * MAX_KEYS_PER_PRODUCER == 16


def test_a_producer_lists_at_most_four_keys() -> None:
    keys = "".join(
        f'[[producers.p.keys]]\nid = "k{n}"\nhmac_secret = "whsec_QUJDREVGR0g="\n' for n in range(5)
    )
    text = f'[producers.p]\ntenants = ["acme"]\ntypes = ["t"]\n{keys}'
    with pytest.raises(RegistryError, match="5 keys; a producer has at most 4"):
        parse_registry(text, Path("."))
