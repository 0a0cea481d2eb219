"""A transaction whose statements travel together: as few round trips to Postgres as its
results are needed, BEGIN with the first and COMMIT with the last.

psycopg's ``transaction()`` inside a pipeline syncs on its own: after BEGIN, after the
block's statements, after COMMIT and once more on leaving (counted in libpq's protocol
trace; the tests in test_pipelined_round_trips do). Here the connection is put in
autocommit mode, so psycopg adds nothing, and BEGIN / COMMIT are sent as statements: a
block that syncs once for results costs two round trips, one that never syncs costs one.

BEGIN names READ COMMITTED, the level the matching argument needs (matcher.store.isolation),
so the database's default does not matter and no session setting is needed.

A block that raises, or a statement that fails, is rolled back before the connection goes
back to its pool. (psycopg's pipeline syncs on leaving even when the block raised: with an
implicit transaction the statements sent so far would commit; with this explicit one they
wait for the ROLLBACK.)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from matcher.store.sql import query


@contextlib.asynccontextmanager
async def pipelined_transaction(
    conn: psycopg.AsyncConnection[Any],
) -> AsyncIterator[psycopg.AsyncPipeline]:
    """One READ COMMITTED transaction on an idle connection, its statements pipelined;
    yields the pipeline, whose ``sync()`` is the block's only way to add a round trip."""
    if conn.info.transaction_status is not TransactionStatus.IDLE:
        raise RuntimeError("a pipelined transaction needs an idle connection")
    autocommit = conn.autocommit
    await conn.set_autocommit(True)
    try:
        async with conn.pipeline() as pipeline:
            await conn.execute(query("transaction", "begin"))
            yield pipeline
            await conn.execute(query("transaction", "commit"))
    finally:
        # A broken connection refuses these; the pool discards it anyway.
        with contextlib.suppress(psycopg.Error):
            if conn.info.transaction_status is not TransactionStatus.IDLE:
                await conn.execute(query("transaction", "rollback"))
            await conn.set_autocommit(autocommit)
