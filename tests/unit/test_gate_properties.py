"""The gate's central property: what a signature vouches for cannot be changed unseen.

For any accepted signed record (binary or structured mode, HMAC or Ed25519 keys), no
mutation and no pair of mutations by someone without the keys (a header renamed,
respelled, duplicated, added or removed, a header value or the value replaced) yields an
*accepted* record whose facts differ: tenant, type, correlation id, job id, id, source,
time, data (and data content type). Mutations that leave the facts alone may be accepted
(an unrelated header, another Kafka key); the statistics count them, and a deterministic
test makes sure some are, so the property cannot hold by rejecting everything.

The same holds for forwarded plain webhooks (Standard Webhooks with HMAC and Ed25519
keys, GitHub, Stripe) mutated as a Kafka producer could, and for HTTP requests through the
ingress (``to_record``, the gate, the URL's producer against the event's source) mutated
as a sender on the internet could: the body, each header renamed, respelled, duplicated,
removed or given another value, the URL's producer, ``matcher_webhook`` and ``ce-``
headers of the sender's own, the content type, the percent-encoding of ``ce-`` values.
Every translation answers a record or a refusal, and never raises.

Callback requests (``matcher.ingress.callbacks``) hold the same property for what a
callback means: the token (asked by its digest), the event type and the data. A mutated
request that is still accepted asks by the digest of the token it carries and says what
another reader reads in it; a mutation of anything else leaves the meaning as it was.

``MATCHER_TEST_PROPERTY_EXAMPLES`` sets the number of CloudEvents examples (webhook
records and HTTP requests get a third of it each); run with
``--hypothesis-show-statistics`` to see how often each mutation was still accepted.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import unquote_to_bytes

import pytest
from hypothesis import HealthCheck, event, given, note, settings, target
from hypothesis import strategies as st

from matcher.domain.events import CompletionEvent, Rejection
from matcher.ingress.callbacks import CallbackRequest
from matcher.ingress.requests import Refusal
from tests.fuzzing.callbacks import (
    CallbackCall,
    mutate_callback,
    other_reading,
    valid_callback,
)
from tests.fuzzing.choosers import HypothesisChooser, RandomChooser
from tests.fuzzing.records import Record, mutate, valid_record
from tests.fuzzing.target import (
    callback_reproducer,
    callback_verdict,
    check_callback,
    check_record,
    check_request,
    ingress_verdict,
    judge_record,
    reproducer,
    request_reproducer,
)
from tests.fuzzing.webhooks import (
    WEBHOOK_SOURCES,
    Request,
    mutate_request,
    percent_encode,
    valid_request,
    valid_webhook_record,
)

EXAMPLES = int(os.environ.get("MATCHER_TEST_PROPERTY_EXAMPLES", "2000"))
WEBHOOK_EXAMPLES = max(1, EXAMPLES // 3)
# Each test's bound grows with its examples (50 ms each, far above what one takes): the
# campaign's 50,000 outran the default 300 s, and a timeout inside hypothesis reads as a
# flaky strategy, not as the slowness it is.
pytestmark = pytest.mark.timeout(300 + EXAMPLES // 20)

# How far a mutated record got through the gate, for hypothesis to push towards: records
# that pass the signature are where a broken property would show.
_STAGE = {
    "malformed": 0,
    "ambiguous": 0,
    "too_large": 0,
    "limit_exceeded": 0,
    "undecodable": 0,
    "unknown_producer": 1,
    "bad_signature": 1,
    "expired_timestamp": 1,
    "tenant_not_allowed": 2,
    "type_not_allowed": 2,
    "schema_invalid": 2,
}


def facts(e: CompletionEvent) -> tuple[Any, ...]:
    """What an accepted event says, compared exactly: the offset of ``time`` counts, and
    ``1``, ``1.0`` and ``true`` in data differ (Python's == would equate them)."""
    data = json.dumps(e.data, sort_keys=True, ensure_ascii=False)
    when = None if e.time is None else e.time.isoformat()
    return (
        e.tenant,
        e.type,
        e.correlationid,
        e.jobid,
        e.id,
        e.source,
        when,
        data,
        e.datacontenttype,
    )


def webhook_facts(e: CompletionEvent) -> tuple[Any, ...]:
    """A plain webhook's facts: its datacontenttype is the unsigned content-type's media
    type (any JSON type), stored nowhere, so it is not one of them."""
    return facts(e)[:-1] if e.source in WEBHOOK_SOURCES else facts(e)


def judge(record: Record) -> CompletionEvent | Rejection:
    return judge_record(record.key, record.headers, record.value)


def accepted(record: Record) -> CompletionEvent:
    """The precondition: the generator's valid record is accepted (else the property would
    hold vacuously)."""
    verdict = judge(record)
    assert isinstance(verdict, CompletionEvent), (verdict, reproducer(*_parts(record)))
    return verdict


def _parts(
    record: Record,
) -> tuple[bytes | None, tuple[tuple[bytes, bytes | None], ...], bytes | None]:
    return record.key, record.headers, record.value


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_no_mutation_changes_what_an_accepted_record_says(data: st.DataObject) -> None:
    chooser = HypothesisChooser(data)
    original = valid_record(chooser)
    expected = facts(accepted(original))
    mutated, names = original, []
    for _ in range(chooser.integer(1, 2)):
        name, mutated = mutate(chooser, mutated)
        names.append(name)
    label = "+".join(names)
    check_record(*_parts(mutated))  # the mutated record is fuzz input too
    verdict = judge(mutated)
    if isinstance(verdict, Rejection):
        event(f"rejected {verdict.reason}")
        target(_STAGE.get(verdict.reason, 0), label="gate stage reached")
        return
    event(f"still accepted after {label}")
    target(3, label="gate stage reached")
    if facts(verdict) != expected:
        note(reproducer(*_parts(original)))
        note(reproducer(*_parts(mutated)))
    assert facts(verdict) == expected, f"{label} changed an accepted event"


_PROPERTY = settings(
    max_examples=WEBHOOK_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@_PROPERTY
@given(st.data())
def test_no_mutation_changes_what_an_accepted_webhook_record_says(data: st.DataObject) -> None:
    """A forwarded plain webhook on the events topic, mutated by a Kafka producer."""
    chooser = HypothesisChooser(data)
    original = valid_webhook_record(chooser)
    expected = webhook_facts(accepted(original))
    mutated, names = original, []
    for _ in range(chooser.integer(1, 2)):
        name, mutated = mutate(chooser, mutated)
        names.append(name)
    check_record(*_parts(mutated))
    verdict = judge(mutated)
    if isinstance(verdict, Rejection):
        event(f"webhook record rejected {verdict.reason}")
        target(_STAGE.get(verdict.reason, 0), label="webhook record stage reached")
        return
    event(f"webhook record still accepted after {'+'.join(names)}")
    if webhook_facts(verdict) != expected:
        note(reproducer(*_parts(original)))
        note(reproducer(*_parts(mutated)))
    assert webhook_facts(verdict) == expected, f"{'+'.join(names)} changed an accepted event"


def accepted_request(request: Request) -> CompletionEvent:
    verdict = ingress_verdict(request)
    assert isinstance(verdict, CompletionEvent), (verdict, request_reproducer(request))
    return verdict


@_PROPERTY
@given(st.data())
def test_no_mutation_changes_what_an_accepted_request_says(data: st.DataObject) -> None:
    """An HTTP request through the ingress's translation and the gate, mutated by a sender
    on the internet."""
    chooser = HypothesisChooser(data)
    original = valid_request(chooser)
    expected = webhook_facts(accepted_request(original))
    mutated, names = original, []
    for _ in range(chooser.integer(1, 2)):
        name, mutated = mutate_request(chooser, mutated)
        names.append(name)
    check_request(mutated)  # never raises, and what it makes is fuzz input for the gate
    verdict = ingress_verdict(mutated)
    if isinstance(verdict, Refusal | Rejection):
        event(f"request refused {verdict.reason}")
        target(_STAGE.get(verdict.reason, 0), label="request stage reached")
        return
    event(f"request still accepted after {'+'.join(names)}")
    if webhook_facts(verdict) != expected:
        note(request_reproducer(original))
        note(request_reproducer(mutated))
    assert webhook_facts(verdict) == expected, f"{'+'.join(names)} changed an accepted event"


# --- the property is not vacuous -------------------------------------------------------


def _originals(n: int = 40) -> list[Record]:
    chooser = RandomChooser(random.Random(20260101))
    return [valid_record(chooser) for _ in range(n)]


def _add_trace(record: Record) -> Record:
    return replace(record, headers=(*record.headers, (b"x-trace", b"abc")))


def _other_key(record: Record) -> Record:
    return replace(record, key=b"another key")


def _reversed(record: Record) -> Record:
    return replace(record, headers=record.headers[::-1])


def _unknown_signature_version(record: Record) -> Record:
    # Standard Webhooks: a verifier ignores versions it does not know.
    headers = tuple(
        (n, v + b" v9,abc" if n == b"webhook-signature" and v else v) for n, v in record.headers
    )
    return replace(record, headers=headers)


HARMLESS: dict[str, Callable[[Record], Record]] = {
    "add x-trace": _add_trace,
    "another Kafka key": _other_key,
    "headers reversed": _reversed,
    "an unknown signature version beside": _unknown_signature_version,
}


@pytest.mark.parametrize("mutation", HARMLESS.values(), ids=HARMLESS.keys())
def test_harmless_mutations_are_accepted_unchanged(mutation: Callable[[Record], Record]) -> None:
    for original in _originals():
        verdict = judge(mutation(original))
        assert isinstance(verdict, CompletionEvent), (verdict, reproducer(*_parts(original)))
        assert facts(verdict) == facts(accepted(original))


def test_some_generated_mutations_are_accepted() -> None:
    """Of the generator's own mutations, some leave a record acceptable: the property test
    does see accepted mutated records, not only rejections."""
    chooser = RandomChooser(random.Random(7))
    still = 0
    for original in _originals(200):
        expected = facts(accepted(original))
        verdict = judge(mutate(chooser, original)[1])
        if isinstance(verdict, CompletionEvent):
            assert facts(verdict) == expected
            still += 1
    assert still >= 10, f"only {still} of 200 mutated records were still accepted"


def _requests(n: int = 60) -> list[Request]:
    chooser = RandomChooser(random.Random(20260102))
    return [valid_request(chooser) for _ in range(n)]


def _with_headers(request: Request, headers: list[tuple[bytes, bytes]]) -> Request:
    return replace(request, headers=tuple(headers))


def _noise(request: Request) -> Request:
    return _with_headers(request, [(b"user-agent", b"curl/8"), *request.headers])


def _headers_reversed(request: Request) -> Request:
    return _with_headers(request, list(request.headers[::-1]))


def _charset(request: Request) -> Request:
    # For CloudEvents binary mode content-type is signed: only webhooks' is free.
    if request.producer not in WEBHOOK_SOURCES:
        return request
    return _with_headers(
        request,
        [(n, b"application/json; charset=UTF-8" if n == b"content-type" else v)
         for n, v in request.headers],
    )  # fmt: skip


def _reencoded(request: Request) -> Request:
    chooser = RandomChooser(random.Random(3))
    return _with_headers(
        request,
        [(n, percent_encode(chooser, unquote_to_bytes(v)) if n.startswith(b"ce-") else v)
         for n, v in request.headers],
    )  # fmt: skip


def _new_delivery(request: Request) -> Request:
    kept = [h for h in request.headers if h[0] != b"x-github-delivery"]
    return _with_headers(request, [*kept, (b"x-github-delivery", b"another-delivery")])


HARMLESS_REQUESTS: dict[str, Callable[[Request], Request]] = {
    "an unrelated header": _noise,
    "headers reversed": _headers_reversed,
    "a charset parameter": _charset,
    "ce- values percent-encoded otherwise": _reencoded,
    "another GitHub delivery id": _new_delivery,
}


@pytest.mark.parametrize("mutation", HARMLESS_REQUESTS.values(), ids=HARMLESS_REQUESTS.keys())
def test_harmless_request_mutations_are_accepted_unchanged(
    mutation: Callable[[Request], Request],
) -> None:
    originals = _requests()
    assert {r.producer for r in originals} >= set(WEBHOOK_SOURCES)
    for original in originals:
        verdict = ingress_verdict(mutation(original))
        assert isinstance(verdict, CompletionEvent), (verdict, request_reproducer(original))
        assert facts(verdict) == facts(accepted_request(original))


def test_some_generated_request_mutations_are_accepted() -> None:
    chooser = RandomChooser(random.Random(11))
    still = 0
    for original in _requests(200):
        expected = webhook_facts(accepted_request(original))
        verdict = ingress_verdict(mutate_request(chooser, original)[1])
        if isinstance(verdict, CompletionEvent):
            assert webhook_facts(verdict) == expected
            still += 1
    assert still >= 10, f"only {still} of 200 mutated requests were still accepted"


# --- callback requests ---------------------------------------------------------------


def callback_meaning(call: CallbackCall) -> tuple[bytes, str | None, str]:
    """What an accepted callback request asks: the digest, the type and the data (as JSON
    with sorted keys, so that 1 and 1.0, or true and 1, stay apart)."""
    verdict = callback_verdict(call)
    assert isinstance(verdict, CallbackRequest), (verdict, callback_reproducer(call))
    return verdict.token_sha256, verdict.event_type, json.dumps(verdict.data, sort_keys=True)


@_PROPERTY
@given(st.data())
def test_no_mutation_changes_what_an_accepted_callback_says(data: st.DataObject) -> None:
    chooser = HypothesisChooser(data)
    original = valid_callback(chooser)
    expected = callback_meaning(original)
    mutated, names = original, []
    for _ in range(chooser.integer(1, 2)):
        name, mutated = mutate_callback(chooser, mutated)
        names.append(name)
    check_callback(mutated)  # never raises; 4xx or a reading another reader agrees with
    verdict = callback_verdict(mutated)
    if isinstance(verdict, Refusal):
        event(f"callback refused {verdict.reason}")
        return
    event(f"callback still accepted after {'+'.join(names)}")
    meaning = callback_meaning(mutated)
    token, event_type, _ = other_reading(mutated)
    assert meaning[0] == hashlib.sha256(token.encode()).digest()
    assert (meaning[0] == expected[0]) == (mutated.token == original.token)
    assert meaning[1] == event_type
    if (mutated.token, mutated.query, mutated.body) == (
        original.token, original.query, original.body,
    ):  # fmt: skip
        assert meaning == expected, f"{'+'.join(names)} changed an accepted callback"


def test_some_generated_callback_mutations_are_accepted() -> None:
    chooser = RandomChooser(random.Random(12))
    still = changed = 0
    for _ in range(300):
        original = valid_callback(chooser)
        callback_meaning(original)
        mutated = mutate_callback(chooser, original)[1]
        if isinstance(callback_verdict(mutated), CallbackRequest):
            still += 1
            changed += callback_meaning(mutated) != callback_meaning(original)
    assert still >= 30, f"only {still} of 300 mutated callbacks were still accepted"
    assert changed >= 5, "no accepted mutation ever changed what was asked: a vacuous test"
