"""Starting and stopping aiokafka clients within a bound, whatever the broker does.

aiokafka's idempotent producer never gives up on a batch whose error is retriable
(``SendProduceReqHandler._can_retry``: "If indempotence is enabled we never expire
batches"; only a batch whose partition has no leader expires, in
``MessageAccumulator.drain_by_nodes``). A broker that is away, or that keeps answering
with a retriable error (NOT_ENOUGH_REPLICAS, REQUEST_TIMED_OUT, ...), so keeps every send
future pending, and ``AIOKafkaProducer.stop()`` first waits, with no bound, for every
pending batch (``MessageAccumulator.close`` -> ``flush``; aio-libs/aiokafka#1101).
``start()`` retries InitProducerId (``Sender._maybe_wait_for_pid``) for as long as no
broker grants one. And a stop or start cut short by ``asyncio.timeout`` leaves the client
half open: its sender goes on retrying, its metadata task runs, its connections stay open.

``stop_producer`` and ``stop_consumer`` try the graceful stop for ``timeout_s``; past that
they fail what is still pending (nobody waits on it any more) and close the connections,
each step bounded too. ``start_producer`` and ``start_consumer`` close what they started
when the start fails or takes too long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
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


async def acknowledged(
    producer: AIOKafkaProducer,
    sends: Iterable[Awaitable[Any]],
    *,
    timeout_s: float,
    refresh_every_s: float,
) -> list[Any]:
    """Every send's acknowledgement, within ``timeout_s`` (TimeoutError past it).

    aiokafka retries a produce request that timed out on the node it last knew as the
    leader, and refreshes its metadata only on errors that say the metadata is stale: a
    broker that hangs (paused, cut off) with its connections open would keep every retry
    until it comes back, long after the controller moved its partitions elsewhere. So
    while acknowledgements are outstanding the metadata is refreshed every
    ``refresh_every_s`` (the request timeout), and the retries find the new leaders.
    """
    pending = [asyncio.ensure_future(send) for send in sends]
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                _, waiting = await asyncio.wait(pending, timeout=refresh_every_s)
                if not waiting:
                    return [future.result() for future in pending]
                producer.client.force_metadata_update()
    finally:
        for future in pending:
            if not future.done():
                future.cancel()


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
    otherwise abandon it (pending sends fail with KafkaTimeoutError, its tasks end, its
    connections close, each step bounded too). Never raises (but CancelledError); returns
    whether the stop was graceful."""
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
            extra={"error": exc, "timeout_s": timeout_s},
        )
    else:
        if not _sender_running(producer):
            return True
        # stop() returns at once when an earlier stop() was cut short: it is still sending.
        log.warning("Kafka producer was left half stopped; abandoning what it had pending")
    _abandon_producer(producer)
    await _close_client(producer.client, timeout_s)
    return False


def _sender_running(producer: AIOKafkaProducer) -> bool:
    task = getattr(getattr(producer, "_sender", None), "sender_task", None)
    return task is not None and not task.done()


def _abandon_producer(producer: AIOKafkaProducer) -> None:
    # Private attributes of aiokafka 0.14 (pinned <0.15 in pyproject.toml): there is no
    # public way to give up on pending batches.
    #
    # The sender and its in-flight produce requests are cancelled first: a request that
    # completed after its batches were failed would re-enqueue them (a KeyError that ends
    # the sender with an error, and an error log from its done callback), and one that
    # waits for a metadata update would wait for ever once the client is closed. Then the
    # batches fail, which ends the flush a cut-short stop() waits on.
    sender: Any = getattr(producer, "_sender", None)
    if sender is not None:
        for request in _produce_requests(sender):
            request.cancel()
        task = getattr(sender, "sender_task", None)
        if task is not None and not task.done():
            task.cancel()
    accumulator: Any = getattr(producer, "_message_accumulator", None)
    if accumulator is not None:
        batches = [b for queued in accumulator._batches.values() for b in queued]
        batches += list(accumulator._pending_batches)
        accumulator.fail_all(KafkaTimeoutError("producer abandoned with sends pending"))
        for batch in batches:  # no "never retrieved" noise for a send nobody awaits
            for future in [batch.future, *(f for f, _ in getattr(batch, "_msg_futures", ()))]:
                if future.done() and not future.cancelled():
                    future.exception()
    producer._closed = True  # its __del__ must not warn: it is closed as far as it can be


def _produce_requests(sender: Any) -> list[asyncio.Task[Any]]:
    """The tasks of ``sender``'s in-flight produce requests (it holds them in a local
    variable of its routine, so they are found by their coroutine)."""
    found = []
    for task in asyncio.all_tasks():
        coro: Any = task.get_coro()
        frame = getattr(coro, "cr_frame", None)
        if (
            frame is not None
            and getattr(coro, "__qualname__", "") == "Sender._send_produce_req"
            and frame.f_locals.get("self") is sender
        ):
            found.append(task)
    return found


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
            extra={"error": exc, "timeout_s": timeout_s},
        )
    else:
        return True
    client: Any = getattr(consumer, "_client", None)
    if client is not None:
        await _close_client(client, timeout_s)
    return False


async def close_admin(admin: AIOKafkaAdminClient, timeout_s: float) -> None:
    """``admin.close()`` within ``timeout_s``. Never raises (but CancelledError)."""
    await _close_client(admin, timeout_s)


async def _close_client(client: Any, timeout_s: float) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout_s):
            await client.close()
    # The closed client makes no more metadata updates: whoever still waits for one (a
    # send of an abandoned producer, say) is told it failed rather than left waiting.
    pending = getattr(client, "_md_update_fut", None)
    if pending is not None and not pending.done():
        pending.set_result(False)


_closing: set[asyncio.Task[None]] = set()  # strong references until they are done


def _close_later(client: Any, timeout_s: float) -> None:
    """Close ``client`` in a task of its own: the caller is being cancelled."""
    if client is None:
        return
    task = asyncio.ensure_future(_close_client(client, timeout_s))
    _closing.add(task)
    task.add_done_callback(_closing.discard)
