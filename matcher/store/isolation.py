"""The daemon's transactions run at READ COMMITTED, whatever the database's default.

The matching argument (a key's advisory lock, then statements that see everything
committed before them) needs each statement's snapshot to be taken after the lock was
granted. Under REPEATABLE READ the snapshot is the transaction's first, taken before the
lock: an event committed meanwhile would be invisible to the rematch pass, and two
batches could both find an event id new. matcher's tables may share an application's
database whose default is REPEATABLE READ, so the level is named, not assumed: in the BEGIN
of every pipelined transaction (matcher.store.pipelined: ingest, rematch, relay) and, for
psycopg's own transactions, on the connection by ``read_committed``.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import IsolationLevel
from psycopg.pq import TransactionStatus


async def read_committed(conn: psycopg.AsyncConnection[Any]) -> None:
    """Make the connection's next transactions READ COMMITTED (no round trip: psycopg
    puts the level in its BEGIN). A connection inside a transaction must already be."""
    if conn.isolation_level is not IsolationLevel.READ_COMMITTED:
        if conn.info.transaction_status is not TransactionStatus.IDLE:
            raise RuntimeError("matcher's statements need a READ COMMITTED transaction")
        await conn.set_isolation_level(IsolationLevel.READ_COMMITTED)
