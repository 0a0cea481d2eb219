"""The CloudEvents Kafka binding: both modes round-trip; anything else is rejected."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from matcher.domain.events import CompletionEvent, Rejection
from matcher.kafka.binding import parse_record
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


@settings(max_examples=400)
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
