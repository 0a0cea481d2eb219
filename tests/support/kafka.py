"""Kafka for tests: produce events (encoded by the CloudEvents SDK, an implementation
independent of matcher's), read resumes, and own clients whose every call is bounded in
time (``KAFKA_CALL_TIMEOUT_S``): aiokafka's idempotent producer never gives up on a batch
while the broker keeps failing it, and its ``stop()`` waits for every pending batch (see
matcher.kafka.deadlines), so an unbounded call could hang a test for ever."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from matcher.config import Settings
from matcher.domain.events import CompletionEvent
from matcher.domain.resume import ResumeData
from matcher.kafka.deadlines import start_consumer, start_producer, stop_consumer, stop_producer
from matcher.sdk import parse_resume

T = TypeVar("T")


# The longest one Kafka client call of a test may take: a start, a stop, the
# acknowledgement of what one ``produce`` sent. A healthy local broker answers in
# milliseconds; past this something is wrong, and the test says so instead of hanging.
KAFKA_CALL_TIMEOUT_S = 30.0


async def within(awaitable: Awaitable[T], timeout: float = KAFKA_CALL_TIMEOUT_S) -> T:
    """``await awaitable``, or TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        return await awaitable


@contextlib.asynccontextmanager
async def started(client: Any, timeout: float = KAFKA_CALL_TIMEOUT_S) -> AsyncIterator[Any]:
    """An AIOKafkaProducer or AIOKafkaConsumer, started and (whatever happens) stopped, each
    within ``timeout``: a producer that cannot deliver what it holds is abandoned."""
    producer = isinstance(client, AIOKafkaProducer)
    if producer:
        await start_producer(client, timeout)
    else:
        await start_consumer(client, timeout)
    try:
        yield client
    finally:
        if producer:
            await stop_producer(client, timeout)
        else:
            await stop_consumer(client, timeout)


def to_record(
    event: CompletionEvent, *, structured: bool = False
) -> tuple[bytes, list[tuple[str, bytes]], bytes]:
    """(key, headers, value) of ``event`` in binary or structured mode, encoded by the
    CloudEvents SDK: an implementation independent of the producer SDK's.

    The key is tenant + correlation id, so one wait's events stay in order on one partition.
    """
    attributes: dict[str, Any] = {
        k: v for k, v in event.model_dump(exclude_none=True).items() if k != "data"
    }
    attributes.setdefault("datacontenttype", "application/json")
    attributes["time"] = event.time or datetime.now(UTC)
    message_event = CloudEvent(attributes, event.data)
    if structured:
        message = ce_kafka.to_structured(message_event, JSONFormat(), key_mapper=lambda _: None)
    else:
        message = ce_kafka.to_binary(message_event, JSONFormat(), key_mapper=lambda _: None)
    key = f"{event.tenant}\x1f{event.correlationid}".encode()
    return key, list(message.headers.items()), message.value


def events_producer(settings: Settings, **options: Any) -> AIOKafkaProducer:
    """A producer to the events topic's cluster, idempotent, to be ``started``."""
    return AIOKafkaProducer(
        **settings.kafka_client_options(),
        enable_idempotence=True,
        acks="all",
        request_timeout_ms=int(KAFKA_CALL_TIMEOUT_S * 1000),
        **options,
    )


async def produce(
    settings: Settings,
    events: Sequence[CompletionEvent],
    *,
    structured: bool = False,
    timeout: float = KAFKA_CALL_TIMEOUT_S,
) -> None:
    """Send ``events`` and wait for every acknowledgement, within ``timeout`` (TimeoutError
    past it: the producer is then abandoned, and its unacknowledged sends may or may not
    have been written)."""
    async with started(events_producer(settings, linger_ms=5), timeout) as producer:
        async with asyncio.timeout(timeout):
            futures = []
            for e in events:
                key, headers, value = to_record(e, structured=structured)
                futures.append(
                    await producer.send(settings.events_topic, value, key=key, headers=headers)
                )
            await asyncio.gather(*futures)


async def produce_raw(
    settings: Settings,
    messages: Sequence[tuple[bytes | None, list[tuple[str, bytes]], bytes]],
    *,
    timeout: float = KAFKA_CALL_TIMEOUT_S,
) -> None:
    """Send (key, headers, value) exactly as given, in order, each within ``timeout``."""
    async with started(events_producer(settings), timeout) as producer:
        for key, headers, value in messages:
            await within(
                producer.send_and_wait(settings.events_topic, value, key=key, headers=headers),
                timeout,
            )


async def produce_paced(
    settings: Settings, events: Sequence[CompletionEvent], *, pause: float, chunk: int = 50
) -> None:
    """``events`` in chunks with a pause between them: a load that is still arriving while
    the test does something to the daemon (the pause is the load's pace, not a wait)."""
    for start in range(0, len(events), chunk):
        await produce(settings, events[start : start + chunk])
        await asyncio.sleep(pause)


async def read_resume_messages(
    settings: Settings,
    *,
    at_least: int,
    timeout: float = 60,
    settle: float = 0.5,
    keep: Callable[[bytes], bool] = lambda _: True,
) -> list[bytes]:
    """Every resume message on the topic from the beginning, as published (bytes) and
    accepted by ``keep``: at least ``at_least``, then any more that arrive within
    ``settle`` seconds (so duplicates are seen too)."""
    consumer = AIOKafkaConsumer(
        **settings.kafka_client_options(), group_id=None, enable_auto_commit=False
    )
    found: list[bytes] = []
    async with started(consumer):
        partitions = [
            TopicPartition(settings.resume_topic, p) for p in range(settings.topic_partitions)
        ]
        consumer.assign(partitions)
        await within(consumer.seek_to_beginning(*partitions))
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            batch = await within(consumer.getmany(timeout_ms=100))
            got = [r.value for records in batch.values() for r in records]
            found.extend(value for value in got if keep(value))
            if got:
                quiet_since = time.monotonic()
            elif len(found) >= at_least and time.monotonic() - quiet_since >= settle:
                break
    if len(found) < at_least:
        raise AssertionError(f"{len(found)} resumes, expected at least {at_least}")
    return found


async def read_resumes(
    settings: Settings, *, at_least: int, timeout: float = 60, settle: float = 0.5
) -> list[ResumeData]:
    """``read_resume_messages``, parsed."""
    messages = await read_resume_messages(
        settings, at_least=at_least, timeout=timeout, settle=settle
    )
    return [parse_resume(m) for m in messages]
