"""The pipe: Kafka to Postgres (and back to Kafka) with nothing of matcher's in between.

Its throughput (``r_pipe`` in bench.run) is a batch read, inserted into the inbox,
committed, and its offsets committed. Its latency floor is this module run as a process
of its own beside the benchmark, as the daemon is:

    python -m bench.pipe BOOTSTRAP DATABASE_URL EVENTS_TOPIC RESUME_TOPIC

a loop that reads a batch of events (read_committed), stores them in one transaction and
publishes a resume for each (idempotent, acks=all, a batch per partition as the relay
sends them), committing the offsets once the resumes are acknowledged: the least a
durable resume needs, without signatures, matching, an outbox or a second transaction.
Its resume carries the event's correlation id and data, so the benchmark reads it as it
reads matcher's. It runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata
from psycopg.types.json import Jsonb

from matcher.auth.gate import read
from matcher.auth.policy import Policy
from matcher.daemon.relay import send_in_batches
from matcher.domain.events import CompletionEvent as CloudEventIn
from matcher.domain.events import Rejection
from matcher.kafka.binding import raw_record

_POLICY = Policy(require_signatures=False)

INSERT = (
    "INSERT INTO matcher.inbox (producer, event_id, tenant, type, correlation_id,"
    " external_job_id, occurred_at, kafka_topic, kafka_partition, kafka_offset, data)"
    " SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[],"
    " %s::text[], %s::timestamptz[], %s::text[], %s::integer[], %s::bigint[], %s::jsonb[])"
    " ON CONFLICT DO NOTHING"
)


def parse_record(record: Any) -> CloudEventIn | Rejection:
    """The gate's reading of a record (no trust decisions: the baselines hold no keys)."""
    return read(raw_record(record, datetime.now(UTC)), _POLICY)


def event_of(record: Any) -> CloudEventIn:
    parsed = parse_record(record)
    assert isinstance(parsed, CloudEventIn), parsed
    return parsed


def inbox_columns(events: list[tuple[Any, CloudEventIn]]) -> list[list[Any]]:
    """INSERT's eleven arrays, of (record, its event) pairs."""
    cols: list[list[Any]] = [[] for _ in range(11)]
    for r, e in events:
        values = [
            *(e.source, e.id, e.tenant, e.type, e.correlationid, e.jobid, e.time),
            *(r.topic, r.partition, r.offset, Jsonb(e.data)),
        ]
        for col, value in zip(cols, values, strict=True):
            col.append(value)
    return cols


def inbox_rows(records: list[Any]) -> list[list[Any]]:
    return inbox_columns([(r, event_of(r)) for r in records])


def offsets(records: list[Any]) -> dict[TopicPartition, OffsetAndMetadata]:
    last: dict[TopicPartition, int] = {}
    for r in records:
        tp = TopicPartition(r.topic, r.partition)
        last[tp] = max(last.get(tp, -1), r.offset)
    return {tp: OffsetAndMetadata(o + 1, "") for tp, o in last.items()}


def resume_of(event: CloudEventIn) -> tuple[bytes, bytes]:
    """(key, value) of the floor's resume: the correlation id and the event's data."""
    value = {"data": {"correlation_id": event.correlationid, "payload": event.data}}
    return event.correlationid.encode(), json.dumps(value).encode()


class _Acknowledged:
    """Offsets committed once the resumes of their records are acknowledged (at least
    once, as matcher's), at most one commit in flight and one every COMMIT_INTERVAL_S (as
    matcher's ingest_commit_interval_ms): committing each batch's offsets cost the broker
    more than matcher's commits do."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self._consumer = consumer
        self._sending: list[tuple[asyncio.Future[Any], dict[TopicPartition, Any]]] = []
        self._ready: dict[TopicPartition, OffsetAndMetadata] = {}
        self._commit: asyncio.Task[None] | None = None
        self._committed_at = -math.inf  # the first commit goes at once, whatever the clock

    def add(self, sends: list[asyncio.Future[Any]], records: list[Any]) -> None:
        self._sending.append((asyncio.gather(*sends), offsets(records)))

    def poll(self) -> None:
        """Move the acknowledged batches' offsets on (in order), and commit them when due;
        a failed send or commit is raised here."""
        while self._sending and self._sending[0][0].done():
            acks, done = self._sending.pop(0)
            acks.result()
            self._ready.update(done)
        if self._commit is not None and self._commit.done():
            self._commit.result()
            self._commit = None
        now = time.monotonic()
        if self._ready and self._commit is None and now - self._committed_at >= COMMIT_INTERVAL_S:
            self._commit = asyncio.ensure_future(self._consumer.commit(self._ready))
            self._ready, self._committed_at = {}, now


COMMIT_INTERVAL_S = 0.1


async def serve(bootstrap: str, url: str, events_topic: str, resume_topic: str) -> None:
    """Until SIGTERM: each batch fetched is stored in one transaction and its resumes
    handed to the producer, whose acknowledgements the next batches do not wait for."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    consumer = AIOKafkaConsumer(
        events_topic, bootstrap_servers=bootstrap, group_id=f"pipe-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False, auto_offset_reset="earliest",
        isolation_level="read_committed", max_poll_records=500,
    )  # fmt: skip
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, acks="all",
        max_batch_size=512 * 1024,
    )  # fmt: skip
    acknowledged = _Acknowledged(consumer)
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await asyncio.wait_for(consumer.start(), 60)
        try:
            await asyncio.wait_for(producer.start(), 60)
            try:
                while not stop.is_set():
                    fetched = await consumer.getmany(timeout_ms=100, max_records=500)
                    records = [r for rs in fetched.values() for r in rs]
                    if records:
                        events = [(r, event_of(r)) for r in records]
                        await conn.execute(INSERT, inbox_columns(events))
                        await conn.commit()
                        resumes = [resume_of(e) for _, e in events]
                        sends = await send_in_batches(producer, resume_topic, resumes)
                        acknowledged.add(sends, records)
                    acknowledged.poll()
            finally:
                await producer.stop()
        finally:
            await consumer.stop()


def main() -> None:
    bootstrap, url, events_topic, resume_topic = sys.argv[1:5]
    asyncio.run(serve(bootstrap, url, events_topic, resume_topic))


if __name__ == "__main__":
    main()
