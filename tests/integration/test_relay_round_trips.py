"""A relay batch costs two round trips to Postgres (BEGIN with the claim, COMMIT with the
mark), counted in libpq's own protocol trace; a batch that fails leaves its rows for the
next one and its connection clean."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaProducer
from psycopg.pq import Trace, TransactionStatus
from psycopg_pool import AsyncConnectionPool

from matcher.config import Settings
from matcher.daemon import relay as relay_module
from matcher.daemon.relay import Relay
from matcher.sdk import cancel_wait
from matcher.store.isolation import read_committed
from tests.helpers import db, register_waits, scalar


def _cancelled_waits(settings: Settings, count: int) -> None:
    """``count`` waits resolved (cancelled), so that ``count`` resumes wait in the outbox."""
    register_waits(settings, count, prefix="rt")
    with db(settings) as conn:
        for wait in conn.execute("SELECT id FROM matcher.waits").fetchall():
            cancel_wait(conn, wait["id"])


def _unpublished(settings: Settings) -> int:
    return int(scalar(settings, "SELECT count(*) FROM matcher.outbox WHERE published_at IS NULL"))


def _syncs(trace: Path) -> int:
    """The Sync messages the client sent: one per round trip of the extended protocol."""
    return sum(
        1 for line in trace.read_text().splitlines() if line.split("\t")[:3:2] == ["F", "Sync"]
    )


async def _traced_pool(url: str, sink: Any) -> AsyncConnectionPool:
    async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
        await read_committed(conn)
        conn.pgconn.trace(sink.fileno())
        conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)

    pool = AsyncConnectionPool(url, min_size=1, max_size=1, open=False, configure=configure)
    await pool.open(wait=True, timeout=30)
    return pool


async def test_a_relay_batch_is_two_round_trips(settings: Settings, tmp_path: Path) -> None:
    url = settings.database_conninfo()
    _cancelled_waits(settings, 3)
    trace = tmp_path / "libpq.trace"
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap_servers, enable_idempotence=True, acks="all"
    )
    await asyncio.wait_for(producer.start(), 30)
    try:
        with trace.open("w") as sink:
            pool = await _traced_pool(url, sink)
            try:
                relay = Relay(settings, pool, asyncio.Event())
                published = await asyncio.wait_for(relay.publish_batch(producer), 30)
                empty = await asyncio.wait_for(relay.publish_batch(producer), 30)
                async with pool.connection() as conn:
                    conn.pgconn.untrace()  # flushes the trace
                    assert conn.info.transaction_status is TransactionStatus.IDLE
                    assert not conn.autocommit, "the pool's connection came back changed"
            finally:
                await pool.close()
    finally:
        await asyncio.wait_for(producer.stop(), 30)
    assert (published, empty) == (3, 0)
    assert _unpublished(settings) == 0, "the batch's mark was not committed"
    # Two batches (one with rows, one finding none): two round trips each. psycopg's
    # transaction() inside the pipeline made it five each.
    assert _syncs(trace) == 4, trace.read_text()[-3000:]


async def test_a_failed_batch_leaves_its_rows_and_a_clean_connection(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = settings.database_conninfo()
    _cancelled_waits(settings, 2)

    async def refuse(*_: object) -> list[Any]:
        raise RuntimeError("publication failed")

    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers)
    await asyncio.wait_for(producer.start(), 30)
    pool = AsyncConnectionPool(url, min_size=1, max_size=1, open=False, configure=read_committed)
    await pool.open(wait=True, timeout=30)
    try:
        relay = Relay(settings, pool, asyncio.Event())
        with monkeypatch.context() as patched:
            patched.setattr(relay_module, "_send_in_batches", refuse)
            with pytest.raises(RuntimeError, match="publication failed"):
                await asyncio.wait_for(relay.publish_batch(producer), 30)
        async with pool.connection() as conn:
            assert conn.info.transaction_status is TransactionStatus.IDLE
            assert not conn.autocommit
        assert _unpublished(settings) == 2, "a failed batch's rows must stay unpublished"
        # Their locks went with the rollback: the next batch takes them.
        assert await asyncio.wait_for(relay.publish_batch(producer), 30) == 2
        assert _unpublished(settings) == 0
    finally:
        await pool.close()
        await asyncio.wait_for(producer.stop(), 30)
