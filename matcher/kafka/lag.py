"""Consumer lag of the daemons' group, and which partition a wait's events land on."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner

log = logging.getLogger("matcher.lag")


def partition_for(tenant: str, correlation_id: str, partitions: int) -> int:
    """The partition the producers' default partitioner (murmur2, as Kafka's Java client)
    sends a (tenant, correlation id) key to."""
    key = f"{tenant}\x1f{correlation_id}".encode()
    everything = list(range(partitions))
    return int(DefaultPartitioner()(key, everything, everything))


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
        log.warning("consumer lag unavailable", extra={"error": repr(exc)})
        return None
    finally:
        await consumer.stop()
        await admin.close()
    lag: dict[int, int] = {}
    for tp in partitions:
        meta = committed.get(tp)
        position = meta.offset if meta is not None and meta.offset >= 0 else starts[tp]
        lag[tp.partition] = max(0, ends[tp] - position)
    return lag
