"""The relay's resume messages, built in SQL, are the pydantic model's messages.

The claim query writes each message with json_build_object (the daemon only forwards the
bytes); ``matcher.domain.resume`` holds the model users and the published JSON schema know.
Here every outcome, and event data of awkward shapes, goes through the real daemon, and each
published message must parse to exactly the model the reference code builds from the
database rows.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer, TopicPartition

from matcher.config import Settings
from matcher.domain.resume import ResumeCloudEvent, ResumeData, ResumeEvent, resume_message
from matcher.domain.waits import Outcome, WaitSpec
from matcher.sdk import cancel_wait, register_wait
from tests.support.assertions import eventually
from tests.support.db import rows, scalar
from tests.support.kafka import produce, started, within
from tests.support.processes import running_daemon
from tests.support.records import event

AWKWARD_DATA: list[Any] = [
    {"result": 42, "nested": {"list": [1, 2.5, -3e-7, None, True], "empty": {}}},
    {"text": 'quotes " and \\ backslash, newline\n, tab\t, é, 日本, 🎉, \u2028'},
    {"list": [1, "two", {"three": 3}], "string": "just a string", "null": None},
    12345678901234567,
    0.1,
    None,
]


def _spec(correlation: str, run: str, **extra: object) -> WaitSpec:
    return WaitSpec.model_validate(
        {
            "tenant": "acme",
            "run_id": run,
            "position": 3,
            "event_types": ["job.completed"],
            "correlation_id": correlation,
            **extra,
        }
    )


_PUBLISHED = "SELECT count(*) FROM matcher.resolutions WHERE published"
_REFERENCE_ROWS = """
SELECT o.resolution_id, o.outcome,
       w.id AS wait_id, w.tenant, w.run_id, w.position, w.correlation_id, w.event_types,
       w.deadline, w.created_at, w.resolved_at, w.resolved_by_producer, w.resolved_by_event_id,
       i.type AS event_type, i.data AS event_data, i.external_job_id, i.occurred_at,
       i.kafka_topic, i.kafka_partition, i.kafka_offset, i.received_at
FROM matcher.resolutions AS o
JOIN matcher.waits AS w ON w.id = o.wait_id
LEFT JOIN matcher.inbox AS i
  ON i.producer = w.resolved_by_producer AND i.event_id = w.resolved_by_event_id
"""


def _reference(row: dict[str, Any]) -> ResumeCloudEvent:
    """The message as the pydantic model writes it, from the same rows."""
    resolved = None
    if row["outcome"] == Outcome.EVENT:
        resolved = ResumeEvent(
            source=row["resolved_by_producer"],
            id=row["resolved_by_event_id"],
            type=row["event_type"] or "",
            data=row["event_data"],
            external_job_id=row["external_job_id"],
            occurred_at=row["occurred_at"],
            topic=row["kafka_topic"],
            partition=row["kafka_partition"],
            offset=row["kafka_offset"],
            received_at=row["received_at"] or row["resolved_at"],
        )
    data = ResumeData(
        resolution_id=row["resolution_id"],
        tenant=row["tenant"],
        run_id=row["run_id"],
        position=row["position"],
        outcome=Outcome(row["outcome"]),
        wait_id=row["wait_id"],
        correlation_id=row["correlation_id"],
        event_types=row["event_types"],
        event=resolved,
        created_at=row["created_at"],
        resolved_at=row["resolved_at"],
        deadline=row["deadline"],
    )
    return ResumeCloudEvent.model_validate_json(resume_message(data))


async def _published(settings: Settings, want: int) -> list[tuple[bytes, bytes]]:
    consumer = AIOKafkaConsumer(**settings.kafka_client_options(), group_id=None)
    found: list[tuple[bytes, bytes]] = []
    async with started(consumer):
        partitions = [
            TopicPartition(settings.resume_topic, p) for p in range(settings.topic_partitions)
        ]
        consumer.assign(partitions)
        await within(consumer.seek_to_beginning(*partitions))
        async with asyncio.timeout(60):
            while len(found) < want:
                batch = await consumer.getmany(timeout_ms=500)
                found.extend((r.key, r.value) for records in batch.values() for r in records)
    return found


async def test_published_messages_equal_the_models_messages(settings: Settings) -> None:
    url = settings.database_url.get_secret_value()
    events = [
        event(correlation=f"corr-{n}", data=data, job_id=None if n % 2 else f"job-{n}")
        for n, data in enumerate(AWKWARD_DATA)
    ]
    with psycopg.connect(url) as conn:
        for n in range(len(events)):
            register_wait(conn, _spec(f"corr-{n}", f"run-{n}"))
        register_wait(
            conn,
            _spec("corr-never", "run-timeout", deadline=datetime.now(UTC) + timedelta(seconds=1)),
        )
        cancelled = register_wait(conn, _spec("corr-cancel", "run-cancel"))
        assert cancel_wait(conn, cancelled.id)
    want = len(events) + 2
    async with running_daemon(settings):
        await produce(settings, events)
        await eventually(
            lambda: scalar(settings, _PUBLISHED) == want, what="every resolution published"
        )
    published = await _published(settings, want)
    assert len(published) == want

    references = {row["run_id"]: _reference(row) for row in rows(settings, _REFERENCE_ROWS)}
    assert {r.data.outcome for r in references.values()} == {"event", "timeout", "cancelled"}
    for key, value in published:
        message = ResumeCloudEvent.model_validate_json(value)
        assert key == message.subject.encode()
        assert message == references[message.subject], message.subject
        # The JSON itself too, not only what pydantic makes of it: the same keys, event
        # data exactly as sent (a float stays a float, a big integer exact); timestamps
        # may be written differently (always microseconds here) but name the same instant.
        reference_raw = json.loads(resume_message(references[message.subject].data))
        assert _instants(json.loads(value)) == _instants(reference_raw)


_TIMESTAMPS = {"time", "created_at", "resolved_at", "deadline", "occurred_at", "received_at"}


def _instants(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: datetime.fromisoformat(v)
            if k in _TIMESTAMPS and isinstance(v, str)
            else _instants(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_instants(v) for v in value]
    return value
