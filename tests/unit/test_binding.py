"""The CloudEvents Kafka binding: both modes round-trip; anything else is rejected."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from matcher.domain.events import CompletionEvent, Rejection
from matcher.kafka.binding import parse_record, parse_with_sdk
from tests.helpers import to_record

EVENT = CompletionEvent(
    id="evt-1",
    source="billing",
    type="job.completed",
    tenant="acme",
    correlationid="corr-1",
    jobid="job-1",
    data={"ok": True, "items": [1, 2]},
)


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
    ("headers", "value", "fragment"),
    [
        ([("ce_id", b"x")], b"{}", "source"),
        ([("content-type", b"application/cloudevents+json")], b"{nope", ""),
        ([("content-type", b"application/cloudevents+json")], b"\xff\xfe", ""),
        (
            [("content-type", b"application/cloudevents+json")],
            json.dumps(
                {"specversion": "1.0", "id": "a", "source": "s", "type": "t", "tenant": "x"}
            ).encode(),
            "correlationid",
        ),
        (
            [
                ("ce_specversion", b"1.0"),
                ("ce_id", b"a"),
                ("ce_source", b"s"),
                ("ce_type", b"t"),
                ("ce_tenant", b" "),
                ("ce_correlationid", b"c"),
            ],
            b"{}",
            "tenant",
        ),
        (
            [
                ("ce_specversion", b"1.0"),
                ("ce_id", b"a"),
                ("ce_source", b"s"),
                ("ce_type", b"t"),
                ("ce_tenant", b"x"),
                ("ce_correlationid", b"c"),
                ("content-type", b"application/json"),
            ],
            b"not json",
            "",
        ),
        ([], b"", ""),
    ],
)
def test_rejections(headers: list[tuple[str, bytes]], value: bytes, fragment: str) -> None:
    parsed = parse_record(headers, None, value)
    assert isinstance(parsed, Rejection)
    assert parsed.reason == "malformed"
    assert fragment in parsed.detail


def test_nul_characters_are_refused_before_postgres_sees_them() -> None:
    bad = EVENT.model_copy(update={"data": {"text": "a\x00b"}})
    key, headers, value = to_record(bad)
    parsed = parse_record(headers, key, value)
    assert isinstance(parsed, Rejection)
    assert "NUL" in parsed.detail


def test_rejection_keeps_what_it_could_read() -> None:
    headers = [("ce_id", b"evt-9"), ("ce_source", b"billing"), ("ce_correlationid", b"c-9")]
    parsed = parse_record(headers, None, b"")
    assert isinstance(parsed, Rejection)
    assert parsed.seen == {"producer": "billing", "event_id": "evt-9", "correlation_id": "c-9"}


@settings(max_examples=1500)
@given(
    st.lists(st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=40)))),
    st.one_of(st.none(), st.binary(max_size=300)),
    st.one_of(st.none(), st.binary(max_size=20)),
)
def test_any_bytes_parse_or_reject_never_raise(
    headers: list[tuple[str, bytes | None]], value: bytes | None, key: bytes | None
) -> None:
    parsed = parse_record(headers, key, value)
    assert isinstance(parsed, CompletionEvent | Rejection)


def test_missing_time_stays_missing() -> None:
    headers = [
        ("ce_specversion", b"1.0"),
        ("ce_id", b"a"),
        ("ce_source", b"s"),
        ("ce_type", b"t"),
        ("ce_tenant", b"x"),
        ("ce_correlationid", b"c"),
    ]
    parsed = parse_record(headers, None, b'{"v": 1}')
    assert isinstance(parsed, CompletionEvent)
    assert parsed.time is None
    assert parsed.data == {"v": 1}


_ATTR_VALUES = st.one_of(
    st.sampled_from(["1.0", "0.3", "", " ", "acme", "2026-11-30T12:00:00Z", "1700000000"]),
    st.sampled_from(["2026-11-30T12:00:00.5+01:00", "2026-11-30", "2026-13-01T00:00:00Z"]),
    st.text(max_size=12),
)
_HEADER_NAMES = st.sampled_from(
    ["ce_specversion", "ce_id", "ce_source", "ce_type", "ce_tenant", "ce_correlationid",
     "ce_jobid", "ce_time", "ce_Time", "ce_x-y", "ce_ext1", "content-type", "other"]
)  # fmt: skip


@settings(max_examples=1500, deadline=None)
@given(
    mutations=st.dictionaries(_HEADER_NAMES, _ATTR_VALUES, max_size=5),
    drop=st.sets(_HEADER_NAMES, max_size=3),
    value=st.sampled_from([b'{"ok": true}', b"", b"null", b"{", b'{"n": NaN}', b"\xff"]),
)
def test_fast_binary_path_agrees_with_the_sdk(
    mutations: dict[str, str], drop: set[str], value: bytes
) -> None:
    """The SDK-free path for binary mode accepts only what the SDK path accepts, as the
    same event; everything else it leaves to the SDK path, rejections included."""
    key, headers, _ = to_record(EVENT, structured=False)
    header_map = {name: raw or b"" for name, raw in headers}
    header_map.update({name: text.encode() for name, text in mutations.items()})
    for name in drop:
        header_map.pop(name, None)
    via_sdk = parse_with_sdk(header_map, key, value)
    via_parse = parse_record(list(header_map.items()), key, value)
    assert via_parse == via_sdk, (header_map, value, via_parse, via_sdk)


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
