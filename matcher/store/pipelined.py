"""Transactions whose statements travel together: as few round trips to Postgres as their
results are needed.

psycopg's ``transaction()`` inside a pipeline syncs on its own: after BEGIN, after the
block's statements, after COMMIT and once more on leaving (counted in libpq's protocol
trace; test_pipelined_round_trips does). Here the connection is put in autocommit mode,
so psycopg adds nothing, and the transaction is one of two kinds:

- ``one_round_trip``: the block's statements form the implicit transaction of one Sync,
  sent when the block ends. No BEGIN or COMMIT to send: each statement in a pipeline costs
  the client about 65 µs of CPU, so the two would make an ingest batch of one event a
  fifth dearer. The level is the session's, made READ COMMITTED once per connection
  (matcher.store.isolation).
- ``pipelined_transaction``: BEGIN (naming READ COMMITTED) with the first statements and
  COMMIT with the last, for blocks that need results midway (each Sync would commit an
  implicit transaction): a block that syncs once costs two round trips.

psycopg's pipeline syncs on leaving even when the block raised, which would commit what
was sent. So a block that raises has a ROLLBACK queued before that Sync (it ends an
implicit transaction too, discarding what came before it), and a connection left in a
failed transaction is rolled back before it goes back to its pool.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from matcher.store.isolation import session_read_committed
from matcher.store.sql import query


@contextlib.asynccontextmanager
async def _autocommit_pipeline(
    conn: psycopg.AsyncConnection[Any],
) -> AsyncIterator[psycopg.AsyncPipeline]:
    """A pipeline on the idle ``conn`` in autocommit mode, restored after; nothing of a
    block that raises is committed."""
    if conn.info.transaction_status is not TransactionStatus.IDLE:
        raise RuntimeError("a pipelined transaction needs an idle connection")
    autocommit = conn.autocommit
    await conn.set_autocommit(True)
    try:
        async with conn.pipeline() as pipeline:
            try:
                yield pipeline
            except BaseException:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute(query("transaction", "rollback"))
                raise
    finally:
        # A broken connection refuses these; the pool discards it anyway.
        with contextlib.suppress(psycopg.Error):
            if conn.info.transaction_status is not TransactionStatus.IDLE:
                await conn.execute(query("transaction", "rollback"))
            await conn.set_autocommit(autocommit)


@contextlib.asynccontextmanager
async def one_round_trip(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[None]:
    """The block's statements in one implicit READ COMMITTED transaction and one round
    trip, their results there when the block ends. The block must not fetch a result
    inside (that syncs, and would commit what came before)."""
    await session_read_committed(conn)
    async with _autocommit_pipeline(conn):
        yield


@contextlib.asynccontextmanager
async def pipelined_transaction(
    conn: psycopg.AsyncConnection[Any],
) -> AsyncIterator[psycopg.AsyncPipeline]:
    """One READ COMMITTED transaction, BEGIN and COMMIT sent with the block's first and
    last statements; yields the pipeline, whose ``sync()`` adds a round trip."""
    async with _autocommit_pipeline(conn) as pipeline:
        await conn.execute(query("transaction", "begin"))
        yield pipeline
        await conn.execute(query("transaction", "commit"))
