"""The gate's reading of a record: both modes round-trip; ambiguity and flaws are refused.

The reading is hand-written (it is the hot path and the trust boundary); the CloudEvents
SDK is held to it here: whatever the gate accepts, the SDK reads as the same event.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from hypothesis import given, settings
from hypothesis import strategies as st
from matcher_producer import SigningKey

from matcher.auth.policy import Policy
from matcher.auth.registry import Registry, parse_registry
from matcher.domain.events import CompletionEvent, Rejection
from matcher.domain.quarantine import summary_text
from tests.support.kafka import to_record
from tests.support.records import UNSIGNED, parse_record

EVENT = CompletionEvent(
    id="evt-1",
    source="billing",
    type="job.completed",
    tenant="acme",
    correlationid="corr-1",
    jobid="job-1",
    data={"ok": True, "items": [1, 2]},
)
BINARY_BASE = [
    ("ce_specversion", b"1.0"),
    ("ce_id", b"a"),
    ("ce_source", b"s"),
    ("ce_type", b"t"),
    ("ce_tenant", b"x"),
    ("ce_correlationid", b"c"),
]
STRUCTURED = [("content-type", b"application/cloudevents+json")]


def _reject(headers: Sequence[tuple[str | bytes, bytes | None]], value: bytes | None) -> Rejection:
    parsed = parse_record(headers, None, value)
    assert isinstance(parsed, Rejection), parsed
    return parsed


@pytest.mark.parametrize("structured", [False, True])
def test_round_trip(structured: bool) -> None:
    key, headers, value = to_record(EVENT, structured=structured)
    parsed = parse_record(headers, key, value)
    assert isinstance(parsed, CompletionEvent)
    assert (parsed.id, parsed.source, parsed.type, parsed.tenant) == (
        "evt-1",
        "billing",
        "job.completed",
        "acme",
    )
    assert (parsed.correlationid, parsed.jobid, parsed.data) == ("corr-1", "job-1", EVENT.data)
    assert key == b"acme\x1fcorr-1"


def test_binary_headers_are_the_ce_attributes() -> None:
    _, headers, value = to_record(EVENT)
    names = dict(headers)
    assert names["ce_tenant"] == b"acme"
    assert names["ce_correlationid"] == b"corr-1"
    assert names["ce_jobid"] == b"job-1"
    assert json.loads(value) == EVENT.data


@pytest.mark.parametrize(
    ("headers", "value", "reason", "fragment"),
    [
        ([("ce_id", b"x")], b"{}", "malformed", "source"),
        (STRUCTURED, b"{nope", "malformed", ""),
        (STRUCTURED, b"\xff\xfe", "malformed", "UTF-8"),
        (
            STRUCTURED,
            json.dumps(
                {"specversion": "1.0", "id": "a", "source": "s", "type": "t", "tenant": "x"}
            ).encode(),
            "malformed",
            "correlationid",
        ),
        ([*BINARY_BASE[:4], ("ce_tenant", b" "), BINARY_BASE[5]], b"{}", "malformed", "tenant"),
        ([*BINARY_BASE, ("content-type", b"application/json")], b"not json", "malformed", ""),
        ([*BINARY_BASE, ("content-type", b"text/plain")], b"hi", "malformed", "JSON"),
        ([], b"", "malformed", "not a CloudEvent"),
        # What the classic SDK's to_structured sends: the envelope, as application/json.
        (
            [("content-type", b"application/json")],
            b'{"specversion": "1.0"}',
            "malformed",
            "application/cloudevents+json",
        ),
        ([*BINARY_BASE[:1], ("ce_specversion", b"0.3"), *BINARY_BASE[1:]], b"", "ambiguous", ""),
        ([("ce_specversion", b"0.3"), *BINARY_BASE[1:]], b"", "malformed", "specversion"),
        ([*BINARY_BASE, ("ce_time", b"yesterday")], b"", "malformed", "RFC 3339"),
        ([*BINARY_BASE, ("ce_time", b"2026-11-30T12:00:00")], b"", "malformed", "RFC 3339"),
        ([*BINARY_BASE, ("ce_datacontenttype", b"application/json")], b"", "ambiguous", ""),
        (
            [("content-type", b"application/cloudevents-batch+json")],
            b"[]",
            "malformed",
            "not supported",
        ),
        (
            [*BINARY_BASE, ("content-type", b"application/json; charset=latin-1")],
            b"1",
            "malformed",
            "",
        ),
    ],
)
def test_rejections(
    headers: list[tuple[str | bytes, bytes | None]], value: bytes, reason: str, fragment: str
) -> None:
    parsed = _reject(headers, value)
    assert parsed.reason == reason, parsed
    assert fragment in parsed.detail


@pytest.mark.parametrize(
    "extra",
    [
        ("CE_TENANT", b"other"),
        ("Ce_type", b"job.failed"),
        ("CE_CORRELATIONID", b"other"),
        ("ce_tenant ", b"other"),
        ("ce-tenant", b"other"),
        ("\uff43\uff45\uff3f\uff54\uff45\uff4e\uff41\uff4e\uff54", b"other"),  # fullwidth
        ("ce_tenant", b"other"),  # the same name twice
        ("Content-Type", b"application/json"),
        ("WEBHOOK-SIGNATURE", b"v1,AAAA"),
        ("webhook-id", b"again"),
    ],
)
@pytest.mark.parametrize("structured", [False, True])
def test_a_header_the_gate_reads_has_one_spelling_and_appears_once(
    extra: tuple[str, bytes], structured: bool
) -> None:
    key, headers, value = to_record(EVENT, structured=structured)
    headers = [*headers, ("webhook-id", b"evt-1"), extra]
    parsed = parse_record(headers, key, value)
    assert isinstance(parsed, Rejection)
    assert parsed.reason == "ambiguous"


@pytest.mark.parametrize("name", ["ce_tenant", "ce_id", "ce_jobid", "ce_ext1"])
def test_structured_mode_with_a_ce_header_is_ambiguous(name: str) -> None:
    key, headers, value = to_record(EVENT, structured=True)
    parsed = parse_record([*headers, (name, b"forged")], key, value)
    assert isinstance(parsed, Rejection)
    assert parsed.reason == "ambiguous"
    assert name in parsed.detail


def test_unrelated_headers_are_ignored_and_unknown_extensions_dropped() -> None:
    key, headers, value = to_record(EVENT)
    extra = [("traceparent", b"00-abc"), ("x-any", b"\xff"), ("x-any", b"twice"), ("ce_ext1", b"e")]
    parsed = parse_record([*headers, *extra], key, value)
    assert isinstance(parsed, CompletionEvent)
    assert parsed.model_extra == {}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"[" * 70 + b"]" * 70, "limit_exceeded"),
        (b"[" * 700 + b"]" * 700, "limit_exceeded"),
        (b"[" * 100_000 + b"]" * 100_000, "limit_exceeded"),
        (b'{"a": 1, "a": 2}', "ambiguous"),
        (b'{"t": "\\udc00"}', "malformed"),
        (b'{"t": "a\\u0000b"}', "malformed"),
        (b'{"n": NaN}', "malformed"),
        (b'{"n": 1e400}', "malformed"),
        (b'{"n": 1.00000000000000000001}', "malformed"),
        (b'{"n": 1e-400}', "malformed"),
        (b'{"pi": 3.141592653589793238462643383279}', "malformed"),
        (b"1" * 5000, "malformed"),
        (b"\xef\xbb\xbf{}", "malformed"),
        ('{"a": 1}'.encode("utf-16"), "malformed"),
    ],
)
def test_json_is_read_one_way_or_refused(value: bytes, reason: str) -> None:
    assert _reject(BINARY_BASE, value).reason == reason


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ("[" * 70 + "]" * 70, "limit_exceeded"),
        ("[" * 5000 + "]" * 5000, "limit_exceeded"),
        ('{"a": 1, "a": 2}', "ambiguous"),
        ('"\\udc00"', "malformed"),
        ('{"n": 1.00000000000000000001}', "malformed"),
        ("[1e-400]", "malformed"),
    ],
)
def test_structured_json_is_read_one_way_or_refused(data: str, reason: str) -> None:
    envelope = (
        '{"specversion": "1.0", "id": "a", "source": "s", "type": "t", "tenant": "x", '
        f'"correlationid": "c", "data": {data}}}'
    )
    assert _reject(STRUCTURED, envelope.encode()).reason == reason


def test_a_lone_surrogate_in_an_attribute_is_refused() -> None:
    envelope = (
        b'{"specversion": "1.0", "id": "a", "source": "s", "type": "t", "tenant": "x\\udc00",'
        b' "correlationid": "c"}'
    )
    assert _reject(STRUCTURED, envelope).reason == "malformed"


def test_a_header_name_that_is_not_utf8_is_refused() -> None:
    parsed = _reject([*BINARY_BASE, (b"\xff\xfe", b"v")], b"{}")
    assert parsed.reason == "malformed"
    assert "not UTF-8" in parsed.detail


def test_rejection_keeps_what_it_could_read() -> None:
    headers = [("ce_id", b"evt-9"), ("ce_source", b"billing"), ("ce_correlationid", b"c-9")]
    parsed = _reject(headers, b"")
    assert parsed.seen == {"producer": "billing", "event_id": "evt-9", "correlation_id": "c-9"}


def test_missing_time_stays_missing() -> None:
    parsed = parse_record(BINARY_BASE, None, b'{"v": 1}')
    assert isinstance(parsed, CompletionEvent)
    assert parsed.time is None
    assert parsed.data == {"v": 1}


@pytest.mark.parametrize("structured", [False, True])
def test_an_event_without_an_id_is_rejected_not_given_one(structured: bool) -> None:
    """The SDK would invent an id, and every redelivery would then be a new event."""
    key, headers, value = to_record(EVENT, structured=structured)
    if structured:
        envelope = json.loads(value)
        del envelope["id"]
        value = json.dumps(envelope).encode()
    else:
        headers = [(name, raw) for name, raw in headers if name != "ce_id"]
    parsed = parse_record(headers, key, value)
    assert isinstance(parsed, Rejection)
    assert parsed.reason == "malformed"
    assert "id" in parsed.detail


@settings(max_examples=1500)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.text(max_size=20), st.binary(max_size=20)),
            st.one_of(st.none(), st.binary(max_size=40)),
        )
    ),
    st.one_of(st.none(), st.binary(max_size=300)),
    st.one_of(st.none(), st.binary(max_size=20)),
)
def test_any_bytes_parse_or_reject_never_raise(
    headers: list[tuple[str | bytes, bytes | None]], value: bytes | None, key: bytes | None
) -> None:
    parsed = parse_record(headers, key, value)
    assert isinstance(parsed, CompletionEvent | Rejection)


_ATTR_VALUES = st.one_of(
    st.sampled_from(["1.0", "0.3", "", " ", "acme", "2026-11-30T12:00:00Z", "1700000000"]),
    st.sampled_from(["2026-11-30T12:00:00.5+01:00", "2026-11-30", "2026-13-01T00:00:00Z"]),
    st.text(max_size=12),
)
_HEADER_NAMES = st.sampled_from(
    ["ce_specversion", "ce_id", "ce_source", "ce_type", "ce_tenant", "ce_correlationid",
     "ce_jobid", "ce_time", "ce_Time", "ce_x-y", "ce_ext1", "content-type", "other",
     "CE_TENANT", "Content-Type"]
)  # fmt: skip


def _sdk_reading(headers: list[tuple[str, bytes]], key: bytes, value: bytes) -> dict[str, Any]:
    message = ce_kafka.KafkaMessage(headers=dict(headers), key=key, value=value)
    event = ce_kafka.from_kafka(message, JSONFormat())
    attributes = dict(event.get_attributes())
    data = event.get_data()
    if isinstance(data, bytes | bytearray):
        data = json.loads(data) if data else None
    return {
        name: attributes.get(name)
        for name in ("id", "source", "type", "tenant", "correlationid", "jobid")
    } | {"data": data}


@settings(max_examples=1500, deadline=None)
@given(
    mutations=st.lists(st.tuples(_HEADER_NAMES, _ATTR_VALUES), max_size=5),
    drop=st.sets(_HEADER_NAMES, max_size=3),
    value=st.sampled_from([b'{"ok": true}', b"", b"null", b"{", b'{"n": NaN}', b"\xff", b"[1]"]),
    structured=st.booleans(),
)
def test_whatever_the_gate_accepts_the_sdk_reads_the_same(
    mutations: list[tuple[str, str]], drop: set[str], value: bytes, structured: bool
) -> None:
    """The hand-written reading against the CloudEvents SDK's: on every record the gate
    accepts, both give the same attributes and data (the SDK folds case and keeps the last
    of a repeated header, which is why the gate refuses such records)."""
    key, headers, original = to_record(EVENT, structured=structured)
    headers = [(n, v) for n, v in headers if n not in drop]
    headers += [(name, text.encode()) for name, text in mutations]
    if structured:
        value = original
    parsed = parse_record(headers, key, value)
    if isinstance(parsed, Rejection):
        return
    ours = {
        "id": parsed.id,
        "source": parsed.source,
        "type": parsed.type,
        "tenant": parsed.tenant,
        "correlationid": parsed.correlationid,
        "jobid": parsed.jobid,
        "data": parsed.data,
    }
    assert ours == _sdk_reading(headers, key, value)


def test_identifiers_are_bounded_in_bytes_not_only_characters() -> None:
    headers = [*BINARY_BASE[:4], ("ce_tenant", ("\U0001f600" * 200).encode()), BINARY_BASE[5]]
    parsed = _reject(headers, b"{}")
    assert parsed.reason == "malformed"
    assert "512 bytes" in parsed.detail


# --- records that are no CloudEvent, judged with producers registered --------------------

_SECRET = "whsec_" + base64.b64encode(b"binding-test-secret-32-bytes!!!!").decode()
_REGISTRY = parse_registry(
    f"""
    [producers."billing"]
    tenants = ["acme"]
    types = ["job.completed"]
    [[producers."billing".keys]]
    id = "k1"
    hmac_secret = "{_SECRET}"
    """,
    Path("."),
)


def _sdk_structured(content_type: bytes | None) -> tuple[list[tuple[str, bytes]], bytes]:
    """What the classic CloudEvents SDK's kafka.to_structured sends: the envelope, with the
    data's content type (or none) as content-type, signed as Standard Webhooks."""
    envelope = json.dumps(
        {"specversion": "1.0", "id": "e1", "source": "billing", "type": "job.completed",
         "tenant": "acme", "correlationid": "c1", "data": {"rows": 7}}
    ).encode()  # fmt: skip
    stamp = str(int(datetime.now(UTC).timestamp()))
    message = f"e1.{stamp}.".encode() + envelope
    signature = SigningKey.parse("k1", _SECRET).sign(message).encode()
    headers = [("webhook-id", b"e1"), ("webhook-timestamp", stamp.encode()),
               ("webhook-signature", signature)]  # fmt: skip
    if content_type is not None:
        headers.append(("content-type", content_type))
    return headers, envelope


@pytest.mark.parametrize(
    ("headers", "value", "shown"),
    [
        (*_sdk_structured(b"application/json"), "'application/json'"),
        (*_sdk_structured(None), ""),
        ([], None, ""),  # a tombstone
        ([("content-type", b"text/plain")], b"hello", "'text/plain'"),
        ([("traceparent", b"00-abc")], b"{}", ""),
    ],
)
@pytest.mark.parametrize("policy", [UNSIGNED, Policy()], ids=["unsigned allowed", "signed"])
def test_a_record_that_is_no_cloudevent_is_malformed_whoever_is_registered(
    headers: list[tuple[str, bytes]], value: bytes | None, shown: str, policy: Policy
) -> None:
    """Not ``unknown_producer: no producer ''``: the record names no producer, and that it
    is not a CloudEvent is known before the registry is asked."""
    for registry in (_REGISTRY, Registry()):
        parsed = parse_record(headers, None, value, policy=policy, registry=registry)
        assert isinstance(parsed, Rejection), parsed
        assert (parsed.reason, parsed.detail.split(":")[0]) == ("malformed", "not a CloudEvent")
        assert "application/cloudevents+json" in parsed.detail
        assert shown in parsed.detail
        assert "billing" not in parsed.detail
        assert "registered" not in parsed.detail


def test_the_sdk_structured_record_is_accepted_once_its_content_type_is_right() -> None:
    headers, value = _sdk_structured(b"application/cloudevents+json")
    parsed = parse_record(headers, None, value, policy=Policy(), registry=_REGISTRY)
    assert isinstance(parsed, CompletionEvent), parsed


# --- structured envelope keys: one spelling -----------------------------------------------

_ENVELOPE = {"specversion": "1.0", "id": "a", "source": "s", "type": "t", "tenant": "x",
             "correlationid": "c", "jobid": "j", "data": {"ok": True}}  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("Tenant", "globex"),
        ("TENANT", "globex"),
        ("correlationId", "victim"),
        ("CorrelationID", "victim"),
        ("ID", "b"),
        ("Id", "b"),
        ("Source", "other"),
        ("Type", "job.failed"),
        ("SpecVersion", "0.3"),
        ("JobId", "k"),
        ("Time", "2026-01-01T00:00:00Z"),
        ("Data", {"ok": False}),
        ("DataContentType", "text/plain"),
        ("Data_Base64", "AA=="),
        ("tenant ", "globex"),
        ("\uff54\uff45\uff4e\uff41\uff4e\uff54", "globex"),  # fullwidth
        ("\u212aind", "x"),  # not a look-alike of anything read: see below
    ],
)
@pytest.mark.parametrize("beside", [True, False], ids=["beside the exact key", "alone"])
def test_an_envelope_key_that_folds_to_an_attribute_is_ambiguous(
    key: str, value: Any, beside: bool
) -> None:
    """A reader that folds case (Go's encoding/json, for one) would take it for the
    attribute: beside the exact key it might read the other value, alone it reads an
    attribute we do not."""
    envelope = dict(_ENVELOPE)
    exact = next((name for name in envelope if name == key.strip().lower()), None)
    if not beside and exact is not None:
        del envelope[exact]  # ambiguous still, not merely missing
    envelope[key] = value
    parsed = parse_record(STRUCTURED, None, json.dumps(envelope).encode())
    if key == "\u212aind":
        assert isinstance(parsed, CompletionEvent), parsed  # "kind" is read by nobody
        return
    assert isinstance(parsed, Rejection), parsed
    assert parsed.reason == "ambiguous"
    assert repr(key) in parsed.detail


@pytest.mark.parametrize("key", ["subject", "tenantid", "x-tenant", "dataschema", "Extension"])
def test_other_envelope_keys_are_read_past(key: str) -> None:
    parsed = parse_record(STRUCTURED, None, json.dumps({**_ENVELOPE, key: "v"}).encode())
    assert isinstance(parsed, CompletionEvent), parsed


def test_a_lookalike_key_is_refused_before_the_producer_is_asked() -> None:
    """Like a look-alike header: refused at the claim, for any sender, with or without a
    registered producer (the reason says nothing about the registry)."""
    value = json.dumps({**_ENVELOPE, "source": "billing", "Tenant": "globex"}).encode()
    for registry in (_REGISTRY, Registry()):
        parsed = parse_record(STRUCTURED, None, value, policy=Policy(), registry=registry)
        assert isinstance(parsed, Rejection)
        assert parsed.reason == "ambiguous"


def test_attributes_seen_are_exact_or_left_out() -> None:
    """What a rejection reports having read (the quarantine's summary columns) is the text
    sent or nothing: a NUL or bytes that are not UTF-8 are not stood in for by an escape
    or a replacement character, which would read like those characters sent as such."""
    headers = [
        ("ce_specversion", b"1.0"),
        ("ce_id", b"a\x00"),
        ("ce_source", b"s"),
        ("ce_type", b"job\x00done"),
        ("ce_tenant", b"\xff\xfe"),
        ("ce_correlationid", b"c\\x00"),  # a backslash, then "x00": four characters
    ]
    rejection = _reject(headers, b"{}")
    assert rejection.seen == {"producer": "s", "correlation_id": "c\\x00"}


@given(st.text(max_size=40), st.integers(min_value=0, max_value=50))
def test_summary_text_is_the_text_or_nothing(text: str, limit: int) -> None:
    summary = summary_text(text, limit)
    assert summary is None or summary == text[:limit]
    if "\x00" not in text[:limit] and not any(0xD800 <= ord(c) <= 0xDFFF for c in text[:limit]):
        assert summary == text[:limit]
