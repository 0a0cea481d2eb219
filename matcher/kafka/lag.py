"""Consumer lag of the daemons' group, and which partitions a wait's events can be on.

Which partition a keyed record goes to is the producer's choice, and the common clients
choose differently: murmur2 (Java, aiokafka, kafka-python, KafkaJS, franz-go), CRC32
(everything built on librdkafka: confluent-kafka for Python, Go and .NET, kcat, ...) and
FNV-1a (Go's Sarama). ``key_partitions`` gives all three, so explain looks at the lag on
every partition an event with the wait's key could be on.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2

from matcher.kafka.deadlines import close_admin, stop_consumer

log = logging.getLogger("matcher.lag")


def event_key(tenant: str, correlation_id: str) -> bytes:
    """The Kafka key of an event, as matcher's producers build it
    (matcher_producer.encode): tenant, U+001F, correlation id, in UTF-8."""
    return f"{tenant}\x1f{correlation_id}".encode()


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The Java client's default partitioner for a keyed record (aiokafka's too)."""
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


def crc32_partition(key: bytes, partitions: int) -> int:
    """librdkafka's default partitioner, ``consistent_random``, for a non-empty key: the
    CRC-32 of the key (zlib's) modulo the partition count."""
    return zlib.crc32(key) % partitions


def fnv1a_partition(key: bytes, partitions: int) -> int:
    """Sarama's default (``NewHashPartitioner``): FNV-1a 32 of the key, as a signed 32-bit
    number, modulo the partition count, made positive (Go's ``%`` truncates)."""
    h = 0x811C9DC5
    for byte in key:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return abs(signed) % partitions


def key_partitions(tenant: str, correlation_id: str, partitions: int) -> dict[str, int]:
    """Where each common partitioner puts this wait's key (partitioner name: partition;
    the names are those of matcher.domain.explain.PARTITIONERS)."""
    key = event_key(tenant, correlation_id)
    return {
        "murmur2": murmur2_partition(key, partitions),
        "crc32": crc32_partition(key, partitions),
        "fnv1a": fnv1a_partition(key, partitions),
    }


async def group_lag(
    client_options: dict[str, Any], group: str, topic: str, wait_s: float = 10.0
) -> dict[int, int] | None:
    """Messages not yet committed by ``group``, per partition of ``topic``; None when Kafka
    cannot be asked."""
    admin = AIOKafkaAdminClient(**client_options, request_timeout_ms=int(wait_s * 1000))
    consumer = AIOKafkaConsumer(**client_options, group_id=None, enable_auto_commit=False)
    try:
        async with asyncio.timeout(wait_s):
            await admin.start()
            await consumer.start()
            described = await admin.describe_topics([topic])
            numbers = [p["partition"] for d in described for p in d.get("partitions", [])]
            partitions = [TopicPartition(topic, n) for n in numbers]
            committed = await admin.list_consumer_group_offsets(group, partitions=partitions)
            ends = await consumer.end_offsets(partitions)
            starts = await consumer.beginning_offsets(partitions)
    except (KafkaError, OSError, TimeoutError) as exc:
        log.warning("consumer lag unavailable", extra={"error": exc})
        return None
    finally:
        await stop_consumer(consumer, wait_s)
        await close_admin(admin, wait_s)
    lag: dict[int, int] = {}
    for tp in partitions:
        meta = committed.get(tp)
        position = meta.offset if meta is not None and meta.offset >= 0 else starts[tp]
        lag[tp.partition] = max(0, ends[tp] - position)
    return lag
