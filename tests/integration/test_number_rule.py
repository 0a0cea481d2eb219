"""The number rule, end to end: every number the gate accepts is stored by Postgres and
read back, from the inbox and from the resume matcher builds, as the same number; and any
record the gate accepts is stored and read back with the same meaning.

The numbers come from the fuzz generator's boundary texts (``tests.fuzzing.numbers``):
digit counts around a double's precision and range, exponents around the largest and the
smallest double, subnormals, signs. Each is sent in binary and structured mode; what the
gate accepts goes through ``store_batch`` (the daemon's own write) with a waiting wait, so
it is matched and its resume built by ``matcher.resume_message``; what it refuses is
quarantined with the attributes it read.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from matcher.config import Settings
from matcher.domain.events import CompletionEvent, Rejection
from matcher.domain.records import IngestRecord
from matcher.sdk import WaitSpec, register_wait
from matcher.store.ingest import store_batch
from matcher.store.sql import query
from tests.fuzzing.choosers import HypothesisChooser
from tests.fuzzing.numbers import number_text
from tests.fuzzing.records import fuzz_record
from tests.fuzzing.target import judge_record
from tests.support.assertions import env_flag
from tests.support.db import rematch_all
from tests.support.records import parse_record

EXAMPLES = env_flag("MATCHER_TEST_PROPERTY_EXAMPLES", 150)
pytestmark = pytest.mark.timeout(120 + EXAMPLES // 2)


def _record(number: str, correlation: str, structured: bool) -> tuple[list[Any], bytes]:
    data = f'{{"n": {number}, "list": [{number}, 1]}}'
    attributes = {
        "specversion": "1.0", "id": str(uuid.uuid4()), "source": "billing",
        "type": "job.completed", "tenant": "acme", "correlationid": correlation,
    }  # fmt: skip
    if structured:
        envelope = json.dumps({**attributes, "data": "@data@"})
        value = envelope.replace('"@data@"', data).encode()
        return [("content-type", b"application/cloudevents+json")], value
    headers = [(f"ce_{k}", v.encode()) for k, v in attributes.items()]
    return [*headers, ("content-type", b"application/json")], data.encode()


def _decimals(value: Any) -> Any:
    """``value`` with every number as the decimal it is: jsonb writes numbers in its own
    form (1e2 as 100, 1.7976931348623157e308 as 309 digits), the same numbers."""
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)
    if isinstance(value, list):
        return [_decimals(v) for v in value]
    if isinstance(value, dict):
        return {k: _decimals(v) for k, v in value.items()}
    return value


def _store(settings: Settings, record: IngestRecord) -> None:
    async def run() -> None:
        url = settings.database_url.get_secret_value()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await store_batch(conn, [record])

    asyncio.run(run())


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), structured=st.booleans())
def test_every_accepted_number_reads_back_the_same_from_postgres(
    settings: Settings, data: st.DataObject, structured: bool
) -> None:
    number = number_text(HypothesisChooser(data))
    correlation = f"n-{uuid.uuid4().hex[:12]}"
    headers, value = _record(number, correlation, structured)
    verdict = parse_record(headers, None, value)
    url = settings.database_url.get_secret_value()
    with psycopg.connect(url, autocommit=True) as conn:
        if isinstance(verdict, CompletionEvent):
            register_wait(conn, WaitSpec(tenant="acme", run_id=f"run-{correlation}",
                          position=0, event_types=["job.completed"],
                          correlation_id=correlation))  # fmt: skip
        offset = uuid.uuid4().int >> 66  # Kafka coordinates of its own (quarantine's key)
        record = IngestRecord("t", 0, offset, None, value, tuple(
            (n.encode(), v) for n, v in headers), verdict)  # fmt: skip
        _store(settings, record)  # raises if Postgres refuses what the gate accepted
        if isinstance(verdict, Rejection):
            row = conn.execute(
                "SELECT reason FROM matcher.quarantine WHERE correlation_id = %s", [correlation]
            ).fetchone()
            assert row == ("malformed",), (number, verdict)
            return
        asyncio.run(rematch_all(settings))  # the wait came first: the rematch pass matches it
        stored = conn.execute(
            "SELECT data::text FROM matcher.inbox WHERE correlation_id = %s", [correlation]
        ).fetchone()
        assert stored is not None
        resumes = conn.execute(query("outbox", "claim_unpublished"), {"limit": 1000}).fetchall()
    resume = next(json.loads(r[-1]) for r in resumes if r[1] == f"run-{correlation}")
    written = json.loads(value)
    written = written["data"] if structured else written
    for read_back in (json.loads(stored[0]), resume["data"]["event"]["data"]):
        assert _decimals(read_back) == _decimals(verdict.data), (number, read_back)
        assert _decimals(read_back) == {"n": Decimal(number), "list": [Decimal(number), 1]}
    assert _decimals(written) == _decimals(verdict.data)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(data=st.data())
def test_every_accepted_record_reads_back_the_same_from_postgres(
    settings: Settings, data: st.DataObject
) -> None:
    """Any record the fuzz generator makes (valid ones mutated, signed again, given hostile
    attributes and numbers): what the gate accepts, Postgres stores, and the inbox reads
    back with the same attributes and the same data."""
    record = fuzz_record(HypothesisChooser(data))
    verdict = judge_record(record.key, record.headers, record.value)
    if not isinstance(verdict, CompletionEvent):
        return
    offset = uuid.uuid4().int >> 66
    stored = IngestRecord("t", 0, offset, record.key, record.value, record.headers, verdict)
    url = settings.database_url.get_secret_value()
    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("inbox", "event_ids"):  # examples reuse ids: each is stored anew
            conn.execute(
                f"DELETE FROM matcher.{table} WHERE producer = %s AND event_id = %s",
                [verdict.source, verdict.id],
            )
        _store(settings, stored)  # raises if Postgres refuses what the gate accepted
        row = conn.execute(
            "SELECT tenant, type, correlation_id, external_job_id, occurred_at, data::text "
            "FROM matcher.inbox WHERE producer = %s AND event_id = %s",
            [verdict.source, verdict.id],
        ).fetchone()
    assert row is not None
    tenant, type_, correlation, job, occurred, text = row
    assert (tenant, type_, correlation, job) == (
        verdict.tenant, verdict.type, verdict.correlationid, verdict.jobid,
    )  # fmt: skip
    assert occurred == verdict.time
    assert _decimals(json.loads(text)) == _decimals(verdict.data)
