"""The daemon's pipelined transactions (matcher.store.pipelined), their round trips to
Postgres counted in libpq's own protocol trace: an ingest batch one, a relay batch two
(BEGIN with the claim, COMMIT with the mark), a rematch pass three with keys and two
without. Whatever fails inside one leaves nothing committed and its connection clean."""

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
from matcher.domain.events import Rejection
from matcher.domain.records import IngestRecord
from matcher.sdk import cancel_wait
from matcher.store.ingest import store_batch
from matcher.store.isolation import read_committed
from matcher.store.pipelined import pipelined_transaction
from matcher.store.rematch import rematch_once
from tests.support.db import db, inbox_count, register_waits, scalar
from tests.support.records import event, ingest_record, parse_record, raw


def _cancelled_waits(settings: Settings, count: int) -> None:
    """``count`` waits resolved (cancelled), so that ``count`` resumes wait in the outbox."""
    register_waits(settings, count, prefix="rt")
    with db(settings) as conn:
        for wait in conn.execute("SELECT id FROM matcher.waits").fetchall():
            cancel_wait(conn, wait["id"])


def _unpublished(settings: Settings) -> int:
    return int(scalar(settings, "SELECT count(*) FROM matcher.resolutions WHERE NOT published"))


def _round_trips(trace: Path) -> int:
    """The client's round trips: one per Sync of the extended protocol, one per simple
    Query message."""
    sent = (line.split("\t") for line in trace.read_text().splitlines())
    return sum(1 for fields in sent if fields[0] == "F" and fields[2:3] in (["Sync"], ["Query"]))


def _trace(conn: psycopg.AsyncConnection[Any], sink: Any) -> None:
    """libpq's protocol trace of ``conn`` into ``sink``, without timestamps."""
    conn.pgconn.trace(sink.fileno())
    conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)


async def _traced_pool(url: str, sink: Any) -> AsyncConnectionPool:
    async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
        await read_committed(conn)
        _trace(conn, sink)

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
    assert _round_trips(trace) == 4, trace.read_text()[-3000:]


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
            patched.setattr(relay_module, "send_in_batches", refuse)
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


def _rejected(offset: int) -> IngestRecord:
    """A record the gate refused (not JSON), bound for the quarantine."""
    record = raw([("content-type", b"application/cloudevents+json")], b"k", b"not json")
    verdict = parse_record(record.headers, record.key, record.value)
    assert isinstance(verdict, Rejection)
    return IngestRecord(
        "t", 0, offset, b"k", b"not json", record.headers, verdict, record.arrived_at
    )


def _ingest_batch(first_offset: int) -> list[IngestRecord]:
    accepted = [ingest_record(event(), first_offset + n) for n in range(3)]
    return [*accepted, _rejected(first_offset + 3)]


async def _traced_connection(url: str, sink: Any) -> psycopg.AsyncConnection[Any]:
    conn = await psycopg.AsyncConnection.connect(url, connect_timeout=30)
    _trace(conn, sink)
    return conn


async def test_an_ingest_batch_is_one_round_trip(settings: Settings, tmp_path: Path) -> None:
    trace = tmp_path / "libpq.trace"
    with trace.open("w") as sink:
        conn = await _traced_connection(settings.database_conninfo(), sink)
        try:
            for first in (0, 10):  # the second on a connection that has been used
                result = await asyncio.wait_for(store_batch(conn, _ingest_batch(first)), 30)
                assert (result.accepted, result.quarantined) == (3, 1)
            conn.pgconn.untrace()
            assert conn.info.transaction_status is TransactionStatus.IDLE
            assert not conn.autocommit
        finally:
            await conn.close()
    # The events and the quarantine in one Sync, each batch; the first batch on a
    # connection also sets its session's level, once.
    assert _round_trips(trace) == 3, trace.read_text()[-3000:]
    assert inbox_count(settings) == 6
    assert scalar(settings, "SELECT count(*) FROM matcher.quarantine") == 2


async def test_an_ingest_batch_that_raises_commits_nothing(settings: Settings) -> None:
    """Both writes were sent before the block raised; neither may commit. (psycopg's
    pipeline syncs on leaving even so: an implicit transaction would commit them.)"""

    def fail() -> None:
        raise RuntimeError("between the writes and the commit")

    conn = await psycopg.AsyncConnection.connect(settings.database_conninfo(), connect_timeout=30)
    try:
        with pytest.raises(RuntimeError, match="between the writes"):
            await asyncio.wait_for(store_batch(conn, _ingest_batch(0), before_commit=fail), 30)
        assert conn.info.transaction_status is TransactionStatus.IDLE
        assert not conn.autocommit
        assert inbox_count(settings) == 0
        assert scalar(settings, "SELECT count(*) FROM matcher.quarantine") == 0
        # The same batch again, on the same connection, stores in full.
        result = await asyncio.wait_for(store_batch(conn, _ingest_batch(0)), 30)
        assert (result.accepted, result.duplicates, result.quarantined) == (3, 0, 1)
    finally:
        await conn.close()


async def _rematch_traced(
    conn: psycopg.AsyncConnection[Any], trace: Path
) -> tuple[tuple[int, int], int]:
    """One rematch pass, traced: (its keys and matches, the round trips it took)."""
    with trace.open("w") as sink:
        _trace(conn, sink)
        try:
            result = await asyncio.wait_for(rematch_once(conn), 30)
        finally:
            conn.pgconn.untrace()
    assert conn.info.transaction_status is TransactionStatus.IDLE
    return (result.keys, result.matched), _round_trips(trace)


async def test_a_rematch_pass_is_four_round_trips_at_most(
    settings: Settings, tmp_path: Path
) -> None:
    early = ["rt-early-1", "rt-early-2"]  # their events come first, and wait as pending
    conn = await psycopg.AsyncConnection.connect(settings.database_conninfo(), connect_timeout=30)
    try:
        batch = [ingest_record(event(correlation=c), n) for n, c in enumerate(early)]
        assert (await asyncio.wait_for(store_batch(conn, batch), 30)).pending == 2
        register_waits(settings, 3, correlations=[*early, "rt-no-event"])
        # Claim with BEGIN, read, resolve and settle (their counts checked), COMMIT.
        assert await _rematch_traced(conn, tmp_path / "resolving") == ((3, 2), 4)
        register_waits(settings, 2, prefix="rt")
        # Nothing to resolve: no checks, so the queue's writes go with COMMIT.
        assert await _rematch_traced(conn, tmp_path / "nothing") == ((2, 0), 3)
        # No keys: claim with BEGIN, then COMMIT.
        assert await _rematch_traced(conn, tmp_path / "empty") == ((0, 0), 2)
        # psycopg's transaction() inside the pipeline made them seven, seven and five.
    finally:
        await conn.close()
    assert scalar(settings, "SELECT count(*) FROM matcher.match_queue") == 0
    assert scalar(settings, "SELECT count(*) FROM matcher.waits WHERE state <> 'waiting'") == 2


async def _isolation_inside(conn: psycopg.AsyncConnection[Any]) -> str:
    async with pipelined_transaction(conn) as pipeline:
        cur = await conn.execute("SHOW transaction_isolation")
        await pipeline.sync()
        row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def _write_then_raise(conn: psycopg.AsyncConnection[Any]) -> None:
    async with pipelined_transaction(conn):
        await conn.execute("INSERT INTO written VALUES (1)")
        raise RuntimeError("the block failed")


async def _write_twice(conn: psycopg.AsyncConnection[Any]) -> None:
    async with pipelined_transaction(conn):
        await conn.execute("INSERT INTO written VALUES (2)")
        await conn.execute("INSERT INTO written VALUES (2)")


def _as_found(conn: psycopg.AsyncConnection[Any]) -> None:
    """Idle, and back in the autocommit mode it came in."""
    assert conn.info.transaction_status is TransactionStatus.IDLE
    assert conn.autocommit


async def test_a_pipelined_transaction_is_read_committed_and_all_or_nothing(
    settings: Settings,
) -> None:
    url = settings.database_conninfo()
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=30)
    try:
        # An application's database may default to REPEATABLE READ: the level is named.
        await conn.execute("SET default_transaction_isolation = 'repeatable read'")
        await conn.execute("CREATE TEMP TABLE written (n int PRIMARY KEY)")
        assert await _isolation_inside(conn) == "read committed"
        with pytest.raises(RuntimeError, match="the block"):
            await _write_then_raise(conn)
        _as_found(conn)
        with pytest.raises(psycopg.errors.UniqueViolation):
            await _write_twice(conn)
        _as_found(conn)
        cur = await conn.execute("SELECT count(*) FROM written")
        assert await cur.fetchone() == (0,), "a failed pipelined transaction wrote"
        async with pipelined_transaction(conn):
            await conn.execute("INSERT INTO written VALUES (3)")
        cur = await conn.execute("SELECT n FROM written")
        assert await cur.fetchall() == [(3,)]
        await conn.set_autocommit(False)
        await conn.execute("SELECT 1")  # now inside psycopg's own transaction
        with pytest.raises(RuntimeError, match="idle connection"):
            await _isolation_inside(conn)
    finally:
        await conn.close()
