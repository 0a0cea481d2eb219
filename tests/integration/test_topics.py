"""Topic creation: a topic `ensure_topics` has created is usable at once."""

from __future__ import annotations

import asyncio
import uuid

from aiokafka.admin import AIOKafkaAdminClient

from matcher.config import Settings
from matcher.kafka.deadlines import close_admin
from matcher.kafka.topics import delete_topics, ensure_topics


async def _listed_by_a_new_client(settings: Settings) -> set[str]:
    admin = AIOKafkaAdminClient(**settings.kafka_client_options(), request_timeout_ms=10_000)
    try:
        await asyncio.wait_for(admin.start(), 30)
        return set(await asyncio.wait_for(admin.list_topics(), 30))
    finally:
        await close_admin(admin, 30)


async def test_created_topics_are_listed_as_soon_as_creation_returns(settings: Settings) -> None:
    """What the daemon's start checks right after `matcher migrate`: without waiting for
    the brokers' metadata, a topic just created could be reported missing (it was, once
    in a CI run, and the daemon refused to start)."""
    async with asyncio.timeout(240):
        for _ in range(8):
            names = [f"{settings.events_topic}.new.{uuid.uuid4().hex[:8]}" for _ in range(3)]
            try:
                created = await ensure_topics(settings.kafka_client_options(), names, partitions=3)
                assert sorted(created) == sorted(names)
                assert set(names) <= await _listed_by_a_new_client(settings)
            finally:
                await delete_topics(settings.kafka_client_options(), names)
