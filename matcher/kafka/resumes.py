"""Small Kafka clients for the CLI: publish one event, tail the resume topic.

A client that fails to start is stopped all the same (no "Unclosed" warnings), and a topic
that does not exist is said so (``MissingTopic``) instead of waiting out a timeout. Every
Kafka call is bounded (``CALL_TIMEOUT_S``, TimeoutError past it; see matcher.kafka.deadlines):
the idempotent producer would otherwise retry a refused send, and wait in ``stop()``, for
ever.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from matcher_producer import CompletionEvent as ProducerEvent
from matcher_producer import SigningKey, encode, sign_record

from matcher.config import Settings
from matcher.domain.events import CompletionEvent
from matcher.kafka.deadlines import (
    close_admin,
    start_consumer,
    start_producer,
    stop_consumer,
    stop_producer,
)

CALL_TIMEOUT_S = 30.0


class MissingTopic(LookupError):
    """The topic does not exist (``matcher migrate`` creates it)."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"topic {topic} does not exist")
        self.topic = topic


async def publish_event(
    settings: Settings,
    event: CompletionEvent,
    *,
    structured: bool,
    signing_key: SigningKey | None,
) -> tuple[int, int]:
    """Encode, sign and send one event as the producer SDK does (the same code); return
    the (partition, offset) it was written at."""
    record = encode(
        ProducerEvent(
            source=event.source,
            type=event.type,
            tenant=event.tenant,
            correlation_id=event.correlationid,
            data=event.data,
            job_id=event.jobid,
            id=event.id,
        ),
        structured=structured,
    )
    if signing_key is not None:
        record = sign_record(record, event.id, [signing_key])
    producer = AIOKafkaProducer(
        **settings.kafka_client_options(), enable_idempotence=True, acks="all"
    )
    try:
        await start_producer(producer, CALL_TIMEOUT_S)
        async with asyncio.timeout(CALL_TIMEOUT_S):
            metadata = await producer.client.fetch_all_metadata()
            if settings.events_topic not in metadata.topics():
                raise MissingTopic(settings.events_topic)
            sent = await producer.send_and_wait(
                settings.events_topic, record.value, key=record.key, headers=record.headers
            )
    finally:
        await stop_producer(producer, CALL_TIMEOUT_S)
    return sent.partition, sent.offset


async def tail(
    settings: Settings,
    show: Callable[[dict[str, Any]], None],
    from_beginning: bool,
    max_count: int | None,
    seconds: float | None,
) -> int:
    """Call ``show`` with each resume's data; return how many were shown."""
    consumer = AIOKafkaConsumer(
        **settings.kafka_client_options(), group_id=None, enable_auto_commit=False
    )
    shown = 0
    try:
        await start_consumer(consumer, CALL_TIMEOUT_S)
        partitions = await _partitions(settings, settings.resume_topic)
        consumer.assign(partitions)
        async with asyncio.timeout(CALL_TIMEOUT_S):
            if from_beginning:
                await consumer.seek_to_beginning(*partitions)
            else:
                await consumer.seek_to_end(*partitions)
        deadline = None if seconds is None else time.monotonic() + seconds
        while max_count is None or shown < max_count:
            wait_ms = 500
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                # min before int: an infinite --timeout is no timeout, not an OverflowError.
                wait_ms = max(1, int(min(wait_ms, left * 1000)))
            async with asyncio.timeout(CALL_TIMEOUT_S + wait_ms / 1000):
                batch = await consumer.getmany(timeout_ms=wait_ms)
            for records in batch.values():
                for record in records:
                    try:
                        envelope = json.loads(record.value)
                    except ValueError:
                        continue
                    show(envelope.get("data", envelope))
                    shown += 1
                    if max_count is not None and shown >= max_count:
                        return shown
    finally:
        await stop_consumer(consumer, CALL_TIMEOUT_S)
    return shown


async def _partitions(settings: Settings, topic: str) -> list[TopicPartition]:
    admin = AIOKafkaAdminClient(**settings.kafka_client_options())
    try:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            await admin.start()
            described = await admin.describe_topics([topic])
    finally:
        await close_admin(admin, CALL_TIMEOUT_S)
    numbers = sorted(p["partition"] for d in described for p in d.get("partitions", []))
    if not numbers:
        raise MissingTopic(topic)
    return [TopicPartition(topic, n) for n in numbers]
