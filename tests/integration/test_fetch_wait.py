"""The fetch wait in the ingest loop, against a real broker and aiokafka's own fetcher: the
fetch requests the client sends carry the wait while events flow and the consumer's own
settings once they stop, and a flow then costs fewer fetches than events.

This is what holds ``FlowFetchWait`` to the library: it sets two private fields of the
consumer's fetcher, and only the requests sent show that the fetcher still reads them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.protocol.fetch import FetchRequest

from matcher.config import Settings
from matcher.kafka.fetch_wait import FLOWING_MIN_BYTES, WINDOW_WAITS
from tests.support.assertions import eventually
from tests.support.db import inbox_count
from tests.support.kafka import events_producer, started, to_record
from tests.support.processes import running_ingest
from tests.support.records import event

WAIT_MS = 20  # long, so that a held fetch is plain to see on a busy machine too
USUAL = (500, 1)  # aiokafka's defaults, which the daemon's consumer keeps
FLOW = 750  # events, one due every 2 ms: 1.5 s
DUE_EVERY_S = 0.002


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


async def _produce_a_flow(settings: Settings) -> None:
    """``FLOW`` events on a fixed schedule: a late loop sends what is due at once, so the
    flow lasts about as long on a busy machine as on a quiet one."""
    records = [to_record(event()) for _ in range(FLOW)]
    loop = asyncio.get_running_loop()
    async with started(events_producer(settings)) as producer:
        began, futures = loop.time(), []
        for i, (key, headers, value) in enumerate(records):
            due = began + i * DUE_EVERY_S - loop.time()
            if due > 0:
                await asyncio.sleep(due)
            futures.append(
                await producer.send(settings.events_topic, value, key=key, headers=headers)
            )
        await asyncio.wait_for(asyncio.gather(*futures), 30)


@pytest.mark.timeout(120)
async def test_the_ingest_loop_holds_fetches_while_events_flow_and_not_after(
    settings: Settings,
) -> None:
    s = settings.model_copy(update={"ingest_fetch_wait_ms": WAIT_MS})
    async with running_ingest(s) as ingest:
        sent = _recording_fetches(ingest.consumer)
        await _produce_a_flow(s)
        await eventually(lambda: inbox_count(s) == FLOW, timeout=60, interval=0.05)
        during = len(sent)
        assert (WAIT_MS, FLOWING_MIN_BYTES) in sent, set(sent)
        # Held fetches carry several events each: without the wait, about one apiece
        # (745 of 750 when this test was written; 97 with it).
        assert during < FLOW / 2, during
        # Quiet again: off within a window and a look, then a fetch per 500 ms, not
        # one per 20 ms (50 a second).
        await asyncio.sleep(1.0)
        assert sent[-1] == USUAL
        assert len(sent) - during < 2 * WINDOW_WAITS + 4, sent[during:]
