"""A rebalance that begins while the ingest loop paces a batch, against a real broker and
aiokafka's own group coordinator.

A paced batch holds the batch lock, which the revocation waits for; once a rebalance has
begun, aiokafka's ``getmany`` waits for the next assignment however short its timeout,
and that assignment waits for the revocation. The unit test of the pacing stands in for
aiokafka with a fake; this one lets the library do it: a second member joins while the
daemon paces every batch for a second, and the group must settle within seconds, not
after the rebalance timeout (five minutes), with nothing lost."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from aiokafka import AIOKafkaConsumer

from matcher.config import Settings
from tests.support.assertions import eventually
from tests.support.db import inbox_count
from tests.support.kafka import events_producer, started, to_record
from tests.support.processes import running_ingest
from tests.support.records import event

# The longest pacing there is: the daemon spends nearly all its time in a paced batch,
# so the rebalance begins during one.
INTERVAL_MS = 1000
TRICKLE_EVERY_S = 0.05  # never a full batch: every batch is paced
# Seconds for the group to settle once the second member has started: a heartbeat (3 s)
# to hear of the rebalance, a paced fetch to give way (1.1 s), the joins and a sync.
SETTLES_WITHIN_S = 25.0


async def _trickle(settings: Settings, stop: asyncio.Event) -> int:
    """Events one every ``TRICKLE_EVERY_S`` until ``stop``; how many were produced."""
    produced = 0
    async with started(events_producer(settings)) as producer:
        while not stop.is_set():
            key, headers, value = to_record(event())
            await asyncio.wait_for(
                producer.send_and_wait(settings.events_topic, value, key=key, headers=headers),
                30,
            )
            produced += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), TRICKLE_EVERY_S)
    return produced


def _second_member(settings: Settings) -> AIOKafkaConsumer:
    """A plain consumer in the daemon's group: it only joins (and never commits)."""
    return AIOKafkaConsumer(
        settings.events_topic,
        **settings.kafka_client_options(),
        group_id=settings.consumer_group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=settings.kafka_session_timeout_ms,
        heartbeat_interval_ms=settings.kafka_heartbeat_interval_ms,
    )


@pytest.mark.timeout(150)
async def test_a_rebalance_during_a_paced_batch_settles_and_loses_nothing(
    settings: Settings,
) -> None:
    s = settings.model_copy(update={"ingest_batch_interval_ms": INTERVAL_MS})
    stop_trickle = asyncio.Event()
    trickle: asyncio.Task[int] | None = None
    try:
        async with running_ingest(s) as ingest:
            daemon = ingest.consumer
            assert daemon is not None
            everything = set(daemon.assignment())
            trickle = asyncio.create_task(_trickle(s, stop_trickle))
            # Batches are flowing, each paced for most of a second.
            await eventually(lambda: inbox_count(s) >= 10, timeout=30, interval=0.05)
            async with started(_second_member(s)) as second:
                await eventually(
                    lambda: bool(second.assignment())
                    and set(daemon.assignment()) | set(second.assignment()) == everything
                    and not set(daemon.assignment()) & set(second.assignment()),
                    timeout=SETTLES_WITHIN_S, interval=0.05,
                    what="the partitions shared between the daemon and the second member",
                )  # fmt: skip
            # The second member has left: the daemon takes every partition back, from
            # the offsets it committed (the second committed none).
            await eventually(
                lambda: set(daemon.assignment()) == everything,
                timeout=SETTLES_WITHIN_S, interval=0.05, what="every partition back",
            )  # fmt: skip
            stop_trickle.set()
            produced = await trickle
            await eventually(
                lambda: inbox_count(s) == produced, timeout=30, interval=0.05,
                what=f"all {produced} events in the inbox",
            )  # fmt: skip
    finally:
        stop_trickle.set()
        if trickle is not None and not trickle.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(trickle, 30)
