"""The gate's central property: what a signature vouches for cannot be changed unseen.

For any accepted signed record (binary or structured mode, HMAC or Ed25519 keys), no
mutation and no pair of mutations by someone without the keys (a header renamed,
respelled, duplicated, added or removed, a header value or the value replaced) yields an
*accepted* record whose facts differ: tenant, type, correlation id, job id, id, source,
time, data (and data content type). Mutations that leave the facts alone may be accepted
(an unrelated header, another Kafka key); the statistics count them, and a deterministic
test makes sure some are, so the property cannot hold by rejecting everything.

``MATCHER_TEST_PROPERTY_EXAMPLES`` sets the number of examples; run with
``--hypothesis-show-statistics`` to see how often each mutation was still accepted.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, note, settings, target
from hypothesis import strategies as st

from matcher.domain.events import CompletionEvent, Rejection
from tests.fuzzing.choosers import HypothesisChooser, RandomChooser
from tests.fuzzing.records import Record, mutate, valid_record
from tests.fuzzing.target import check_record, judge_record, reproducer

EXAMPLES = int(os.environ.get("MATCHER_TEST_PROPERTY_EXAMPLES", "2000"))

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
