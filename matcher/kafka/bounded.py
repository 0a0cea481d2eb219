"""Starting and stopping aiokafka clients within a bound, whatever the broker does.

aiokafka's idempotent producer never gives up on a batch whose error is retriable
(``Sender._can_retry``: "If idempotence is enabled we never expire batches"), and
``AIOKafkaProducer.stop()`` first waits, with no bound, for every pending batch to be
delivered (aio-libs/aiokafka#1101). So a producer whose broker went away can keep a
``stop()`` waiting forever, and a ``start()`` retries InitProducerId for as long as no
broker answers. A stop or start cut short by ``asyncio.timeout`` leaves the client half
open: its sender and metadata tasks still run, its connections stay open.

``stop_producer`` and ``stop_consumer`` try the graceful stop for ``timeout_s``; past that
they fail what is still pending (nobody waits on it any more) and close the connections,
each step bounded too. ``start_producer`` and ``start_consumer`` close what they started
when the start fails or takes too long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaTimeoutError

log = logging.getLogger("matcher.kafka")


async def start_producer(producer: AIOKafkaProducer, timeout_s: float) -> None:
    """``producer.start()`` within ``timeout_s`` (TimeoutError past it); on any failure
    the producer is closed again before the error propagates."""
    try:
        async with asyncio.timeout(timeout_s):
            await producer.start()
    except BaseException:
        await stop_producer(producer, timeout_s)
        raise


async def start_consumer(consumer: AIOKafkaConsumer, timeout_s: float) -> None:
    """``consumer.start()`` within ``timeout_s``; closed again if it fails."""
    try:
        async with asyncio.timeout(timeout_s):
            await consumer.start()
    except BaseException:
        await stop_consumer(consumer, timeout_s)
        raise


async def stop_producer(producer: AIOKafkaProducer, timeout_s: float) -> bool:
    """Stop ``producer``, delivering what is pending if that takes at most ``timeout_s``;
    otherwise abandon it (pending sends fail with KafkaTimeoutError). Never raises (but
    CancelledError); returns whether the stop was graceful."""
    try:
        async with asyncio.timeout(timeout_s):
            await producer.stop()
    except asyncio.CancelledError:
        _abandon_producer(producer)
        _close_later(producer.client, timeout_s)
        raise
    except Exception as exc:
        log.warning(
            "Kafka producer did not stop in time; abandoning what it had pending",
            extra={"error": repr(exc), "timeout_s": timeout_s},
        )
    else:
        return True
    _abandon_producer(producer)
    await _close_client(producer.client, timeout_s)
    return False


def _abandon_producer(producer: AIOKafkaProducer) -> None:
    # Private attributes of aiokafka 0.14 (pinned <0.15 in pyproject.toml): there is no
    # public way to give up on pending batches. Failing them ends the flush that stop()
    # waits on; cancelling the sender ends its retries.
    accumulator: Any = getattr(producer, "_message_accumulator", None)
    if accumulator is not None:
        batches = [b for queued in accumulator._batches.values() for b in queued]
        batches += list(accumulator._pending_batches)
        accumulator.fail_all(KafkaTimeoutError("producer abandoned with sends pending"))
        for batch in batches:  # nobody awaits them any more: no "never retrieved" noise
            if batch.future.done() and not batch.future.cancelled():
                batch.future.exception()
    sender: Any = getattr(producer, "_sender", None)
    task = getattr(sender, "sender_task", None)
    if task is not None and not task.done():
        task.cancel()
    producer._closed = True  # its __del__ must not warn: it is closed as far as it can be


async def stop_consumer(consumer: AIOKafkaConsumer, timeout_s: float) -> bool:
    """``consumer.stop()`` (leave the group, close) within ``timeout_s``; past that, close
    its connections anyway. Never raises (but CancelledError)."""
    try:
        async with asyncio.timeout(timeout_s):
            await consumer.stop()
    except asyncio.CancelledError:
        _close_later(getattr(consumer, "_client", None), timeout_s)
        raise
    except Exception as exc:
        log.warning(
            "Kafka consumer did not stop in time; closing its connections",
            extra={"error": repr(exc), "timeout_s": timeout_s},
        )
    else:
        return True
    client: Any = getattr(consumer, "_client", None)
    if client is not None:
        await _close_client(client, timeout_s)
    return False


async def _close_client(client: Any, timeout_s: float) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout_s):
            await client.close()


_closing: set[asyncio.Task[None]] = set()  # strong references until they are done


def _close_later(client: Any, timeout_s: float) -> None:
    """Close ``client`` in a task of its own: the caller is being cancelled."""
    if client is None:
        return
    task = asyncio.ensure_future(_close_client(client, timeout_s))
    _closing.add(task)
    task.add_done_callback(_closing.discard)
