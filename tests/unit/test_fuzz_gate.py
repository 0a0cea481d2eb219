"""The gate fuzzed under hypothesis: structure-aware records and raw bytes.

Each example goes through ``tests.fuzzing.target.check_record``: the gate must answer
every record with an event or a reason, and what it rejects must make a quarantine row
that Postgres takes. Forwarded plain webhooks (as the daemon reads them from Kafka) and
HTTP requests through the ingress's translation (``check_request``) are fuzzed the same
way, and so are callback requests through the ingress's reading (``check_callback``).
Bounded for ``make test``; ``MATCHER_TEST_FUZZ_EXAMPLES`` sets the number of
structure-aware CloudEvents records (raw-bytes examples are two thirds of it, webhook
records and HTTP requests a fifth each). The long run is
``python -m tests.fuzzing.campaign``.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from matcher_producer import CompletionEvent as ProducerEvent
from matcher_producer import KafkaRecord, encode, sign_record

from tests.fuzzing.callbacks import CallbackCall, fuzz_callback
from tests.fuzzing.choosers import HypothesisChooser
from tests.fuzzing.records import (
    ARRIVAL,
    PRODUCERS,
    RESERVED_NAMES,
    Header,
    Record,
    fuzz_record,
)
from tests.fuzzing.target import (
    callback_reproducer,
    check_callback,
    check_record,
    check_request,
    reproducer,
    request_reproducer,
)
from tests.fuzzing.webhooks import ALL_SOURCES, Request, as_record, fuzz_request

STRUCTURED_EXAMPLES = int(os.environ.get("MATCHER_TEST_FUZZ_EXAMPLES", "3000"))
RAW_EXAMPLES = max(1, STRUCTURED_EXAMPLES * 2 // 3)
WEBHOOK_EXAMPLES = max(1, STRUCTURED_EXAMPLES // 5)
# Each test's bound grows with its examples (50 ms each, far above what one takes): the
# campaign's 50,000 outran the default 300 s, and a timeout inside hypothesis reads as a
# flaky strategy, not as the slowness it is.
pytestmark = pytest.mark.timeout(300 + STRUCTURED_EXAMPLES // 20)

# Examples draw hundreds of decisions and some build megabyte values on purpose; neither
# is a problem of the test.
_FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_names = st.one_of(st.sampled_from(RESERVED_NAMES), st.binary(max_size=24))
_values = st.one_of(st.none(), st.binary(max_size=64))
_raw_records = st.builds(
    Record,
    key=st.one_of(st.none(), st.binary(max_size=32)),
    headers=st.lists(st.tuples(_names, _values), max_size=8).map(tuple),
    value=st.one_of(st.none(), st.binary(max_size=512)),
)


@settings(_FUZZ, max_examples=STRUCTURED_EXAMPLES)
@given(st.data())
def test_structure_aware_records(data: st.DataObject) -> None:
    _check(fuzz_record(HypothesisChooser(data)))


@settings(_FUZZ, max_examples=RAW_EXAMPLES)
@given(_raw_records)
def test_raw_records(record: Record) -> None:
    _check(record)


@settings(_FUZZ, max_examples=WEBHOOK_EXAMPLES)
@given(st.data())
def test_structure_aware_webhook_records(data: st.DataObject) -> None:
    _check(as_record(HypothesisChooser(data)))


@settings(_FUZZ, max_examples=WEBHOOK_EXAMPLES)
@given(st.data())
def test_structure_aware_http_requests(data: st.DataObject) -> None:
    _check_request(fuzz_request(HypothesisChooser(data)))


_http_names = st.one_of(
    st.sampled_from([*RESERVED_NAMES, b"matcher_webhook", b"x-hub-signature-256",
                     b"stripe-signature", b"ce-id", b"ce-source", b"ce-tenant"]),
    st.binary(max_size=24),
)  # fmt: skip
_raw_requests = st.builds(
    Request,
    producer=st.sampled_from(ALL_SOURCES),
    headers=st.lists(st.tuples(_http_names, st.binary(max_size=64)), max_size=8).map(tuple),
    body=st.binary(max_size=512),
)


@settings(_FUZZ, max_examples=WEBHOOK_EXAMPLES)
@given(_raw_requests)
def test_raw_http_requests(request: Request) -> None:
    _check_request(request)


@settings(_FUZZ, max_examples=WEBHOOK_EXAMPLES)
@given(st.data())
def test_structure_aware_callback_requests(data: st.DataObject) -> None:
    _check_callback(fuzz_callback(HypothesisChooser(data)))


_raw_callbacks = st.builds(
    CallbackCall,
    token=st.text(max_size=64),
    query=st.binary(max_size=64),
    headers=st.lists(
        st.tuples(st.sampled_from([b"content-type", b"traceparent", b"x"]), st.binary(max_size=48)),
        max_size=4,
    ).map(tuple),
    body=st.binary(max_size=256),
)


@settings(_FUZZ, max_examples=WEBHOOK_EXAMPLES)
@given(_raw_callbacks)
def test_raw_callback_requests(call: CallbackCall) -> None:
    _check_callback(call)


def _check_callback(call: CallbackCall) -> None:
    note(callback_reproducer(call))
    check_callback(call)


def _check_request(request: Request) -> None:
    try:
        check_request(request)
    except BaseException:
        note(request_reproducer(request))
        raise


def _check(record: Record) -> None:
    try:
        check_record(record.key, record.headers, record.value)
    except BaseException:
        note(reproducer(record.key, record.headers, record.value))  # shown for the minimal one
        raise


@pytest.mark.parametrize("time", [b"9999-12-31T23:59:59-01:00", b"0001-01-01T00:00:00+01:00"])
def test_signed_time_outside_datetime_range(time: bytes) -> None:
    """The first finding, kept as its minimal case: a registered producer's ``time`` that
    parses, but whose instant in UTC is after year 9999 or before year 1. Postgres stores
    it (year 10000, or 1 BC); psycopg cannot load it back, and the resume's occurred_at
    becomes ``10000-01-01T00:59:59.000000Z``, which ``parse_resume`` refuses."""
    event = ProducerEvent(
        source="ed-svc", type="job.completed", tenant="acme", correlation_id="c", id="e1"
    )
    record = encode(event)
    headers = [(n, time if n == "ce_time" else v) for n, v in record.headers]
    key = PRODUCERS[1].keys[0].signing
    signed = sign_record(replace(record, headers=headers), "e1", [key], timestamp=ARRIVAL)
    check_record(signed.key, tuple((n.encode(), v) for n, v in signed.headers), signed.value)


def _signed_structured(extra: dict[str, object]) -> Record:
    event = ProducerEvent(
        source="ed-svc", type="job.completed", tenant="acme", correlation_id="c", id="e1"
    )
    record = encode(event, structured=True)
    envelope = {**json.loads(record.value), **extra}
    record = replace(record, value=json.dumps(envelope).encode())
    key = PRODUCERS[1].keys[0].signing
    signed = sign_record(record, "e1", [key], timestamp=ARRIVAL)
    return Record(signed.key, tuple((n.encode(), v) for n, v in signed.headers), signed.value)


@pytest.mark.parametrize(
    "extra",
    [{"Tenant": "globex"}, {"correlationId": "victim"}, {"ID": "e2"}],
    ids=["Tenant", "correlationId", "ID"],
)
def test_signed_envelope_key_lookalikes_have_no_second_reading(extra: dict[str, object]) -> None:
    """Found by the other-reader check: a registered producer's envelope with a key that a
    case-folding reader takes for an attribute was accepted, read by its exact key."""
    check_record(*_parts(_signed_structured(extra)))


@pytest.mark.parametrize(
    "data", [b'{"n":1.00000000000000000001}', b"[1e-400]", b"3.1415926535897932384"]
)
def test_signed_numbers_are_the_numbers_written(data: bytes) -> None:
    """Found by the other-reader check: data numbers with more precision than a double (or
    too small for one) were accepted as another number than the one signed."""
    record = _signed_structured({"data": None})
    envelope = record.value or b""
    value = envelope.replace(b'"data": null', b'"data": ' + data)
    assert value != envelope
    check_record(*_parts(resign_as(record, value)))


def resign_as(record: Record, value: bytes) -> Record:
    key = PRODUCERS[1].keys[0].signing
    headers = [(n.decode(), v or b"") for n, v in record.headers if not n.startswith(b"webhook-")]
    signed = sign_record(
        KafkaRecord(record.key or b"", headers, value), "e1", [key], timestamp=ARRIVAL
    )
    return Record(signed.key, tuple((n.encode(), v) for n, v in signed.headers), signed.value)


def _parts(record: Record) -> tuple[bytes | None, tuple[Header, ...], bytes | None]:
    return record.key, record.headers, record.value
