"""The fetch wait against a real broker and aiokafka's own fetcher: the fetch requests the
client sends carry the wait while events flow and the consumer's own settings once they
stop, and a flow then costs fewer fetches than records.

This is what holds ``FlowFetchWait`` to the library: it sets two private fields of the
consumer's fetcher, and only the requests sent show that the fetcher still reads them."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.protocol.fetch import FetchRequest

from matcher.config import Settings
from matcher.kafka.fetch_wait import FLOWING_MIN_BYTES, FlowFetchWait
from tests.helpers import started
from tests.integration.test_fetch import bounded, consumer_for, producer_for

WAIT_MS = 20  # long, so that a held fetch is plain to see on a busy machine too
USUAL = (500, 1)  # aiokafka's defaults, which consumer_for keeps
FLOW = 750  # records, about 2 ms apart


def _recording_fetches(consumer: Any) -> list[tuple[int, int]]:
    """(max wait, min bytes) of every fetch request the consumer sends from now on."""
    sent: list[tuple[int, int]] = []
    client = consumer._client
    send = client.send

    async def recording(node_id: int, request: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(request, FetchRequest):
            sent.append((request._max_wait_ms, request._min_bytes))
        return await send(node_id, request, *args, **kwargs)

    client.send = recording
    return sent


async def _poll(consumer: Any, wait: FlowFetchWait, seconds: float, until: int = 0) -> int:
    """Fetch for ``seconds`` (or until ``until`` records came), telling ``wait``."""
    loop = asyncio.get_running_loop()
    got, deadline = 0, loop.time() + seconds
    while loop.time() < deadline and (until == 0 or got < until):
        batch = await consumer.getmany(timeout_ms=wait.patience_ms or 100)
        records = sum(map(len, batch.values()))
        wait.note(records, loop.time())
        got += records
    return got


async def _produce_a_flow(settings: Settings) -> None:
    async with producer_for(settings) as producer:
        for i in range(FLOW):
            await producer.send(settings.events_topic, b"x" * 200, key=str(i).encode())
            await asyncio.sleep(0.002)
        await producer.flush()


@bounded(90)
async def test_fetches_are_held_while_events_flow_and_not_after(settings: Settings) -> None:
    consumer = consumer_for(settings)
    async with started(consumer):
        wait = FlowFetchWait(consumer, WAIT_MS)
        await _poll(consumer, wait, 1.0)  # assigned, and idle: the usual fetches
        sent = _recording_fetches(consumer)
        flow = asyncio.create_task(_produce_a_flow(settings))
        got = await _poll(consumer, wait, 60, until=FLOW)
        await flow
        during = len(sent)
        assert got == FLOW
        assert (WAIT_MS, FLOWING_MIN_BYTES) in sent, set(sent)
        # Held fetches carry several records each: without the wait, about one apiece.
        assert during < FLOW / 2, during
        await _poll(consumer, wait, 1.0)  # quiet again
        assert not wait.on
        # Off within its window (8 waits) and a poll's patience: then a fetch per 500 ms,
        # not one per 20 ms for the whole second (50).
        assert sent[-1] == USUAL
        assert len(sent) - during < 20, sent[during:]
