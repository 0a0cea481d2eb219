"""When the broker is asked to hold fetches: only while records come at least one per
wait on average, never for an idle or a sparse flow, and back to the consumer's own
settings as soon as the flow thins out."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from matcher.config import Settings
from matcher.daemon.ingest import Ingest
from matcher.kafka.fetch import Batch, FetchedRecord
from matcher.kafka.fetch_wait import FLOWING_MIN_BYTES, WINDOW_WAITS, FlowFetchWait
from tests.support.assertions import eventually

USUAL = (500, 1)  # aiokafka's defaults: what the daemon's consumer is made with
WAIT_MS = 4


def _consumer() -> Any:
    fetcher = SimpleNamespace(_fetch_max_wait_ms=USUAL[0], _fetch_min_bytes=USUAL[1])
    return SimpleNamespace(_fetcher=fetcher)


def _settings_of(consumer: Any) -> tuple[int, int]:
    return consumer._fetcher._fetch_max_wait_ms, consumer._fetcher._fetch_min_bytes


def test_a_steady_flow_turns_the_wait_on_and_a_quiet_spell_off() -> None:
    consumer = _consumer()
    wait = FlowFetchWait(consumer, WAIT_MS)
    now = 0.0
    for _ in range(20):  # 2 records a millisecond
        now += 0.001
        wait.note(2, now)
    assert wait.on
    assert _settings_of(consumer) == (WAIT_MS, FLOWING_MIN_BYTES)
    now += WINDOW_WAITS * WAIT_MS / 1000  # nothing for a whole window
    wait.note(0, now)
    assert not wait.on
    assert _settings_of(consumer) == USUAL


def test_a_sparse_flow_never_holds_a_fetch() -> None:
    """100 records a second, one at a time, is under one per 4 ms wait: each is fetched
    at once, as without the wait."""
    consumer = _consumer()
    wait = FlowFetchWait(consumer, WAIT_MS)
    for i in range(1000):
        wait.note(1, i * 0.010)
        assert not wait.on
        assert _settings_of(consumer) == USUAL


def test_no_wait_leaves_the_consumer_alone() -> None:
    consumer = _consumer()
    wait = FlowFetchWait(consumer, 0)
    for i in range(100):
        wait.note(1000, i * 0.001)
    assert not wait.on
    assert _settings_of(consumer) == USUAL


def test_a_consumer_not_started_yet_is_adjusted_once_it_is() -> None:
    consumer = SimpleNamespace()
    wait = FlowFetchWait(consumer, WAIT_MS)
    wait.note(100, 0.0)  # aiokafka makes its fetcher in start(): nothing to adjust yet
    assert not wait.on
    consumer._fetcher = _consumer()._fetcher
    wait.note(1, 0.001)
    assert wait.on
    assert _settings_of(consumer) == (WAIT_MS, FLOWING_MIN_BYTES)


def test_a_client_without_the_fields_gets_no_wait_and_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = SimpleNamespace(_fetcher=SimpleNamespace())
    wait = FlowFetchWait(consumer, WAIT_MS)
    with caplog.at_level(logging.WARNING, logger="matcher.fetch"):
        for i in range(100):
            wait.note(100, i * 0.001)
    assert not wait.on
    assert vars(consumer._fetcher) == {}
    assert len(caplog.records) == 1


@given(
    st.lists(
        st.tuples(st.floats(min_value=0, max_value=0.05), st.integers(0, 20)),
        max_size=200,
    )
)
def test_the_wait_is_on_exactly_while_the_window_holds_a_record_per_wait(
    calls: list[tuple[float, int]],
) -> None:
    consumer = _consumer()
    wait = FlowFetchWait(consumer, WAIT_MS)
    window_s = WINDOW_WAITS * WAIT_MS / 1000
    now, seen = 0.0, []
    for gap, records in calls:
        now += gap
        seen.append((now, records))
        wait.note(records, now)
        recent = sum(n for at, n in seen if now - at < window_s)
        assert wait.on == (recent >= WINDOW_WAITS)
        assert _settings_of(consumer) == ((WAIT_MS, FLOWING_MIN_BYTES) if wait.on else USUAL)


def test_a_quiet_spell_turns_the_wait_off_though_nobody_fetches() -> None:
    """The ingest loop may be away from its fetches for long (a batch stored through a
    Postgres outage): the wait must not stay on meanwhile, the client fetching every
    4 ms for nothing."""
    consumer = _consumer()

    async def flow_then_nothing() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        wait = FlowFetchWait(consumer, WAIT_MS)
        last = loop.time()
        wait.note(WINDOW_WAITS, last)  # a flow, then no fetch call at all
        assert wait.on
        await eventually(lambda: not wait.on, timeout=5, interval=0.001, what="the wait off")
        return last, loop.time()

    last, off_at = asyncio.run(flow_then_nothing())
    assert _settings_of(consumer) == USUAL
    assert off_at - last >= WINDOW_WAITS * WAIT_MS / 1000  # not before the window is out


def test_a_closed_wait_looks_no_more() -> None:
    consumer = _consumer()

    async def closed() -> bool:
        wait = FlowFetchWait(consumer, WAIT_MS)
        wait.note(WINDOW_WAITS, asyncio.get_running_loop().time())
        wait.close()
        await asyncio.sleep(3 * WINDOW_WAITS * WAIT_MS / 1000)
        return wait.on

    assert asyncio.run(closed())


def test_records_end_a_poll_at_once() -> None:
    record = FetchedRecord("events", 0, 0, -1, 0, None, b"x", ())
    settings = Settings(kafka_bootstrap_servers="k:9092", database_url="postgresql://u@h/d")
    ingest = Ingest(settings, pool=None, stop=asyncio.Event(), on_resolved=lambda: None)  # type: ignore[arg-type]

    class _One:
        calls = 0

        async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> Batch:
            self.calls += 1
            return {TopicPartition("events", 0): [record]}

    fetcher = _One()
    batch = asyncio.run(ingest.intake.fetch(fetcher, 200, 10))  # type: ignore[arg-type]
    assert fetcher.calls == 1
    assert sum(map(len, batch.values())) == 1
