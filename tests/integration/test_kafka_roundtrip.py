"""Messages round-trip through the real broker with a consumer group and manual commits."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from matcher.config import Settings
from tests.support.kafka import started, within


async def _consume(settings: Settings, want: int) -> list[bytes]:
    """Read ``want`` messages as a member of the test's group, then commit and leave."""
    consumer = AIOKafkaConsumer(
        settings.events_topic,
        **settings.kafka_client_options(),
        group_id=settings.consumer_group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    got: list[bytes] = []
    async with started(consumer):
        for _ in range(100):
            if len(got) >= want:
                break
            batch = await consumer.getmany(timeout_ms=500, max_records=want - len(got))
            for records in batch.values():
                got.extend(r.value for r in records)
        # Commit exactly what was read: the positions after the last record of each batch.
        await within(consumer.commit())
    return got


async def test_second_member_resumes_after_committed_offset(settings: Settings) -> None:
    producer = AIOKafkaProducer(
        **settings.kafka_client_options(), enable_idempotence=True, acks="all"
    )
    async with started(producer):
        # One key, so every message lands on one partition in order.
        for i in range(10):
            await within(producer.send_and_wait(settings.events_topic, f"m{i}".encode(), key=b"k"))

    first = await _consume(settings, want=4)
    assert first == [f"m{i}".encode() for i in range(4)]

    # A new member of the same group starts after the committed offset, not at the start.
    second = await _consume(settings, want=6)
    assert second == [f"m{i}".encode() for i in range(4, 10)]

    consumer = AIOKafkaConsumer(
        **settings.kafka_client_options(),
        group_id=settings.consumer_group,
        enable_auto_commit=False,
    )
    async with started(consumer):
        committed = 0
        for p in range(settings.topic_partitions):
            tp = TopicPartition(settings.events_topic, p)
            committed += await within(consumer.committed(tp)) or 0
        assert committed == 10
