"""matcher.kafka.deadlines without a broker: a start against nothing, or against a listener
that never answers, fails within its bound and leaves nothing running or open.

(With a broker that refuses what it is sent: tests/integration/test_stuck_producers.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError

from matcher.kafka.deadlines import start_consumer, start_producer, stop_consumer, stop_producer

pytestmark = pytest.mark.timeout(60)


def _closed_port() -> int:
    """A port nothing listens on (bound once, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def _silent_listener() -> AsyncIterator[str]:
    """A bootstrap address that accepts connections and never answers a request."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for writer in held:
            writer.close()
        await server.wait_closed()


def _aiokafka_tasks() -> list[asyncio.Task[Any]]:
    found = []
    for task in asyncio.all_tasks():
        code = getattr(task.get_coro(), "cr_code", None)
        if task is not asyncio.current_task() and code and "/aiokafka/" in code.co_filename:
            found.append(task)
    return found


async def _nothing_left_running() -> None:
    await asyncio.sleep(0)  # let cancelled tasks finish
    assert _aiokafka_tasks() == []
    gc.collect()  # an unclosed client warns when collected, and warnings are errors


async def test_start_producer_with_nothing_listening_fails_at_once() -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=f"127.0.0.1:{_closed_port()}", enable_idempotence=True
    )
    started = time.monotonic()
    with pytest.raises(KafkaConnectionError):
        await start_producer(producer, 10)
    assert time.monotonic() - started < 5
    await _nothing_left_running()


async def test_start_producer_against_a_silent_broker_gives_up_within_the_bound() -> None:
    async with _silent_listener() as bootstrap:
        # aiokafka alone would wait 60 s for the first answer (and then try again).
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, enable_idempotence=True, request_timeout_ms=60_000
        )
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await start_producer(producer, 1.0)
        took = time.monotonic() - started
    assert took < 3.0, f"start_producer took {took:.1f}s with a bound of 1s"
    await _nothing_left_running()


async def test_start_consumer_against_a_silent_broker_gives_up_within_the_bound() -> None:
    async with _silent_listener() as bootstrap:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, request_timeout_ms=60_000
        )
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await start_consumer(consumer, 1.0)
        took = time.monotonic() - started
    assert took < 3.0, f"start_consumer took {took:.1f}s with a bound of 1s"
    await _nothing_left_running()


async def test_stopping_clients_never_started_is_graceful_and_immediate() -> None:
    address = f"127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    assert await stop_producer(AIOKafkaProducer(bootstrap_servers=address), 1.0) is True
    assert await stop_consumer(AIOKafkaConsumer(bootstrap_servers=address), 1.0) is True
    assert time.monotonic() - started < 0.5
    await _nothing_left_running()


async def test_acknowledgements_refresh_the_metadata_while_they_are_outstanding() -> None:
    import asyncio

    from matcher.kafka.deadlines import acknowledged

    class Client:
        refreshes = 0

        def force_metadata_update(self) -> None:
            Client.refreshes += 1

    class Producer:
        client = Client()

    slow: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.35, slow.set_result, 7)
    done = await acknowledged(Producer(), [slow], timeout_s=5, refresh_every_s=0.1)
    assert done == [7]
    assert Client.refreshes >= 2  # one per 0.1 s outstanding
    never: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await acknowledged(Producer(), [never], timeout_s=0.2, refresh_every_s=0.05)
    assert never.cancelled()
